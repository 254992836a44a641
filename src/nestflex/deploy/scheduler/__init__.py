"""NestDNN's resource-aware scheduler (METHODS §1.5): which level and compute share each app gets.

* :mod:`.profile` - :class:`AppProfile` (an app's levels and goals) and :func:`knee_level`;
* :mod:`.base` - the cost function :func:`cost`, the :class:`Decision` records, the
  :class:`Scheduler` base class;
* :mod:`.greedy` - the greedy heuristic (MinTotalCost, MinMaxCost) and its cached variant;
* :mod:`.exact` - the exact dynamic-programming solver (to measure the heuristic's gap);
* :mod:`.static` - the status-quo baseline (fixed knee model, equal shares);
* :mod:`.joint` - one scheduler over levels x exits x splits x bitwidths for apps sharing a
  device, a link and a server (:class:`JointScheduler`, its exact yardstick);
* :mod:`.registry` - schedulers by name.

Examples:
    >>> rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
    ...         {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
    >>> apps = [AppProfile.from_levels(n, rows, max_latency_ms=10.0) for n in ("a", "b", "c")]
    >>> d = get_scheduler("greedy_max").schedule(apps, memory_mb=4.0, alpha=0.2, unit=0.01)
    >>> d.memory_mb <= 4.0, round(sum(a.share for a in d.allocations), 6)
    (True, 1.0)
"""

from nestflex.deploy.scheduler.base import OBJECTIVES, Allocation, Decision, Scheduler, check_problem, cost
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.exact import ExactScheduler
from nestflex.deploy.scheduler.greedy import CachedGreedyScheduler, GreedyScheduler
from nestflex.deploy.scheduler.joint import (ExactJointScheduler, JointApp, JointDecision, JointOption, JointResources,
                                             JointScheduler)
from nestflex.deploy.scheduler.profile import DEFAULT_FPS, AppProfile, LevelProfile, knee_level
from nestflex.deploy.scheduler.registry import get_scheduler, list_schedulers, register_scheduler
from nestflex.deploy.scheduler.static import FixedScheduler, KneeScheduler, LargestScheduler

__all__ = [
    "SchedulerError",
    "OBJECTIVES",
    "DEFAULT_FPS",
    "LevelProfile",
    "AppProfile",
    "knee_level",
    "cost",
    "check_problem",
    "Allocation",
    "Decision",
    "Scheduler",
    "GreedyScheduler",
    "CachedGreedyScheduler",
    "ExactScheduler",
    "KneeScheduler",
    "LargestScheduler",
    "FixedScheduler",
    "JointOption",
    "JointApp",
    "JointResources",
    "JointDecision",
    "JointScheduler",
    "ExactJointScheduler",
    "register_scheduler",
    "list_schedulers",
    "get_scheduler",
]
