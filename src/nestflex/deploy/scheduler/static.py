"""The status-quo baseline as a scheduler: every app runs its fixed knee model, equal shares.

Resource-agnostic on purpose (NestDNN §4.3.1): the level never changes with the number of apps
or with ``alpha``, the OS gives every app the same share of the compute, and the memory budget
is not consulted (the decision still reports the memory it uses, so callers can see overruns).
The decision's ``value`` is the objective computed with the same cost function, for comparison.
"""

from __future__ import annotations

from typing import Sequence

from nestflex.deploy.scheduler.base import Decision, Scheduler, _check_alpha, _check_objective, _decision
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.profile import AppProfile, knee_level

__all__ = ["KneeScheduler"]


class KneeScheduler(Scheduler):
    """Fixed knee level per app (:func:`knee_level`), compute split equally.

    Args:
        objective: objective used to report ``Decision.value`` (``"total"`` or ``"max"``).
        resource: resource axis of the knee (``"macs"``, ``"memory_mb"`` or ``"latency_ms"``).

    Example:
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
        if len(apps) == 0:
            raise SchedulerError("`apps` is empty: there is nothing to schedule. HINT: pass at least one AppProfile.")
        _check_alpha(alpha)
        levels = [knee_level(a, self.resource) for a in apps]
        share = 1.0 / len(apps)
        return _decision(self.name, self.objective, apps, levels, [share] * len(apps), alpha, 0.0, memory_mb)
