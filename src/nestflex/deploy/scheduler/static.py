"""The status-quo baseline as a scheduler: every app runs its fixed knee model, equal shares.

Resource-agnostic on purpose (NestDNN §4.3.1): the level never changes with the number of apps
or with ``alpha``, the OS gives every app the same share of the compute, and the memory budget
is not consulted (the decision still reports the memory it uses, so callers can see overruns).
The decision's ``value`` is the objective computed with the same cost function, for comparison.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from nestflex.deploy.scheduler.base import (
    MEMORY_TOL, Decision, Scheduler, _check_alpha, _check_objective, _decision, check_problem,
)
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.profile import AppProfile, knee_level

__all__ = ["KneeScheduler", "LargestScheduler", "FixedScheduler"]


def _check_apps(apps: Sequence[AppProfile], alpha: float) -> None:
    if len(apps) == 0:
        raise SchedulerError("`apps` is empty: there is nothing to schedule. HINT: pass at least one AppProfile.")
    _check_alpha(alpha)


def _equal_shares(scheduler: Scheduler, apps: Sequence[AppProfile], levels: Sequence[int], alpha: float,
                  memory_mb: float) -> Decision:
    """The decision for ``levels`` (indices into each app's levels) with the compute split equally."""
    share = 1.0 / len(apps)
    return _decision(scheduler.name, scheduler.objective, apps, levels, [share] * len(apps), alpha, 0.0, memory_mb)


class KneeScheduler(Scheduler):
    """Fixed knee level per app (:func:`knee_level`), compute split equally.

    Args:
        objective: objective used to report ``Decision.value`` (``"total"`` or ``"max"``).
        resource: resource axis of the knee (``"macs"``, ``"memory_mb"`` or ``"latency_ms"``).

    Examples:
        >>> rows = [{"level": k, "accuracy": a, "macs": m, "memory_mb": m, "latency_ms": {"1": m}}
        ...         for k, (a, m) in enumerate([(0.70, 1), (0.82, 2), (0.84, 4), (0.85, 8)])]
        >>> apps = [AppProfile.from_levels(n, rows) for n in ("a", "b")]
        >>> d = KneeScheduler().schedule(apps, memory_mb=1.0)
        >>> [(a.level, a.share) for a in d.allocations]
        [(1, 0.5), (1, 0.5)]
    """

    def __init__(self, objective: str = "total", resource: str = "macs"):
        self.objective = _check_objective(objective)
        self.resource = resource
        self.name = "knee"

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        _check_apps(apps, alpha)
        levels = [knee_level(a, self.resource) for a in apps]
        return _equal_shares(self, apps, levels, alpha, memory_mb)


class LargestScheduler(Scheduler):
    """FlexDNN's way to share a device: every app runs its largest level that fits, compute split equally.

    FlexDNN adapts one model per app at run time through its exit thresholds, not through model
    variants. The engine (:class:`~nestflex.deploy.engine.Engine`) then picks each app's exit
    operating point for the compute its share leaves it. Memory: all apps start at their largest
    level; while the sum is over the budget, the app using the most memory steps down one level
    (ties: the later app), so the levels change only when the apps do not fit.

    Args:
        objective: objective used to report ``Decision.value`` (``"total"`` or ``"max"``).

    Examples:
        >>> rows = [{"level": k, "accuracy": a, "macs": m, "memory_mb": m, "latency_ms": {"1": m}}
        ...         for k, (a, m) in enumerate([(0.70, 1), (0.85, 8)])]
        >>> apps = [AppProfile.from_levels(n, rows) for n in ("a", "b")]
        >>> [(a.level, a.share) for a in LargestScheduler().schedule(apps, memory_mb=16.0).allocations]
        [(1, 0.5), (1, 0.5)]
    """

    def __init__(self, objective: str = "total"):
        self.objective = _check_objective(objective)
        self.name = "flexdnn"

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        _check_apps(apps, alpha)
        check_problem(apps, memory_mb, alpha, None)
        idx = [len(a.levels) - 1 for a in apps]
        while math.fsum(a.levels[i].memory_mb for a, i in zip(apps, idx)) > memory_mb + MEMORY_TOL:
            v = max((v for v in range(len(apps)) if idx[v] > 0), key=lambda v: (apps[v].levels[idx[v]].memory_mb, v))
            idx[v] -= 1
        return _equal_shares(self, apps, idx, alpha, memory_mb)


class FixedScheduler(Scheduler):
    """Levels frozen per app name, compute split equally: the engine with its scheduler frozen.

    Args:
        levels: app name -> level number; an app not named runs its knee level.
        objective: objective used to report ``Decision.value``.

    Examples:
        >>> rows = [{"level": k, "accuracy": a, "macs": m, "memory_mb": m, "latency_ms": {"1": m}}
        ...         for k, (a, m) in enumerate([(0.70, 1), (0.82, 2), (0.85, 8)])]
        >>> apps = [AppProfile.from_levels(n, rows) for n in ("a", "b")]
        >>> [a.level for a in FixedScheduler({"a": 2}).schedule(apps, memory_mb=16.0).allocations]
        [2, 1]
    """

    def __init__(self, levels: Mapping[str, int], objective: str = "total"):
        bad = {k: v for k, v in dict(levels).items() if isinstance(v, bool) or not isinstance(v, int) or v < 0}
        if bad:
            raise SchedulerError(f"`levels` must map app names to level numbers >= 0, got {bad}.")
        self.levels = dict(levels)
        self.objective = _check_objective(objective)
        self.name = "fixed"

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        _check_apps(apps, alpha)
        idx = []
        for a in apps:
            if a.name in self.levels:
                numbers = [lv.level for lv in a.levels]
                if self.levels[a.name] not in numbers:
                    raise SchedulerError(f"app {a.name!r}: frozen level {self.levels[a.name]} is not one of its "
                                         f"levels {numbers}.")
                idx.append(numbers.index(self.levels[a.name]))
            else:
                idx.append(knee_level(a))
        return _equal_shares(self, apps, idx, alpha, memory_mb)
