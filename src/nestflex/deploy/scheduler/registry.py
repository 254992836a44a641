"""Schedulers by name: ``register_scheduler``, ``list_schedulers``, ``get_scheduler``.

Built in: ``greedy_total``, ``greedy_max`` (the heuristic from scratch), ``cached_total``,
``cached_max`` (resumed from a cached partial allocation), ``greedy_total_jump`` and
``cached_total_jump`` (MinTotalCost that may also give an app, at once, the units a bigger
level needs to meet its latency goal; see :func:`.greedy.greedy_allocate`), ``exact_total``, ``exact_max``
(dynamic programming, small instances) and ``knee`` (the status-quo baseline). A name maps to a
factory, so :func:`get_scheduler` returns a fresh object every time (the cached schedulers keep
state between calls; two users must not share one by accident).
"""

from __future__ import annotations

from typing import Callable

from nestflex.deploy._registry import Registry
from nestflex.deploy.scheduler.base import Scheduler
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.exact import ExactScheduler
from nestflex.deploy.scheduler.greedy import CachedGreedyScheduler, GreedyScheduler
from nestflex.deploy.scheduler.static import KneeScheduler, LargestScheduler

__all__ = ["register_scheduler", "list_schedulers", "get_scheduler"]

_SCHEDULERS: Registry[Callable[[], Scheduler]] = Registry(
    "scheduler",
    SchedulerError,
    register_hint="register your own with register_scheduler(name, factory).",
    unknown="unknown scheduler {name!r}; known: {known}. HINT: {hint}",
    taken="scheduler {name!r} is already registered. HINT: pass overwrite=True to replace it.",
)


def register_scheduler(name: str, factory: Callable[[], Scheduler], *, overwrite: bool = False) -> None:
    """Register ``factory`` (a zero-argument callable returning a :class:`Scheduler`) as ``name``.

    Args:
        name: registry key.
        factory: e.g. the class, or ``functools.partial(MyScheduler, option=...)``.
        overwrite: replace an existing entry instead of raising.

    Raises:
        SchedulerError: the name is taken (and ``overwrite`` is false), empty, or the factory is
            not callable.

    Examples:
        >>> register_scheduler("my_greedy", lambda: GreedyScheduler("total"), overwrite=True)
        >>> "my_greedy" in list_schedulers()
        True
    """
    _SCHEDULERS.register(name, factory, overwrite=overwrite)


def list_schedulers() -> list[str]:
    """Registered scheduler names, sorted."""
    return _SCHEDULERS.names()


def get_scheduler(scheduler: str | Scheduler) -> Scheduler:
    """A fresh scheduler for a registered name, or ``scheduler`` itself if it already is one.

    Args:
        scheduler: a registered name (:func:`list_schedulers`) or a :class:`Scheduler`
            instance.

    Raises:
        SchedulerError: unknown name (the message lists the known ones).
    """
    if isinstance(scheduler, Scheduler):
        return scheduler
    return _SCHEDULERS.get(scheduler)()  # entries are factories: every caller gets its own object


for _obj in ("total", "max"):
    register_scheduler(f"greedy_{_obj}", lambda o=_obj: GreedyScheduler(o))
    register_scheduler(f"cached_{_obj}", lambda o=_obj: CachedGreedyScheduler(o))
    register_scheduler(f"exact_{_obj}", lambda o=_obj: ExactScheduler(o))
register_scheduler("greedy_total_jump", lambda: GreedyScheduler("total", jump=True))
register_scheduler("cached_total_jump", lambda: CachedGreedyScheduler("total", jump=True))
register_scheduler("knee", KneeScheduler)
register_scheduler("flexdnn", LargestScheduler)
