"""The cost function, the decision records and the base class every scheduler implements.

Cost of running descendant m of app v with compute share u (NestDNN Eq. 2, METHODS §1.5)::

    C(m, u, v) = max(0, A_min(v) - A(m)) + alpha * max(0, L(m)/u - L_max(v)) / L_max(v)

A(m) is a fraction in [0, 1] and L(m) the latency at 100 % compute. The paper adds accuracy and
milliseconds; we divide the latency overshoot by L_max(v) so both terms are unit-free and
``alpha`` in [0, 1] means the same for a 1 ms and a 100 ms model: at ``alpha = 1`` one point of
accuracy (0.01) weighs as much as running 1 % slower than the goal.

Both objectives share the constraints ``sum_v S(m_v) <= S_max`` (memory) and ``sum_v u_v <= 1``
(compute, in whole units of ``unit``; every app gets at least one unit so that it runs):

* ``"total"`` (MinTotalCost): minimise ``sum_v C``;
* ``"max"`` (MinMaxCost): minimise ``max_v C``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.profile import AppProfile

__all__ = [
    "OBJECTIVES",
    "cost",
    "Allocation",
    "Decision",
    "Scheduler",
    "check_problem",
]

#: the two objectives of NestDNN §3.3.3
OBJECTIVES: tuple[str, ...] = ("total", "max")

# memory sums are compared with this slack so that an allocation that fills the budget exactly is
# not rejected for a rounding error in the last bit
MEMORY_TOL = 1e-9


def _cost(deficit: float, latency_ms: float, max_latency_ms: float, share: float, alpha: float) -> float:
    # the same arithmetic, in the same order, as the numpy tables of the exact solver, so that
    # both give bit-identical costs for the same allocation
    return deficit + alpha * (max(0.0, latency_ms / share - max_latency_ms) / max_latency_ms)


def cost(app: AppProfile, level_index: int, share: float, alpha: float) -> float:
    """C(m, u, v): the cost of running ``app.levels[level_index]`` with compute share ``share``.

    Args:
        app: the application (its goals A_min and L_max are ``app.goal_accuracy`` and
            ``app.goal_latency_ms``).
        level_index: index into ``app.levels``.
        share: compute share u in (0, 1].
        alpha: latency weight in [0, 1].

    Returns:
        The cost (0 when the level meets both goals at that share).

    Raises:
        SchedulerError: ``share`` or ``alpha`` out of range, or ``level_index`` not a level.

    Examples:
        >>> rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
        ...         {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
        >>> app = AppProfile.from_levels("cam", rows, max_latency_ms=10.0)
        >>> round(cost(app, 0, 0.1, alpha=0.5), 4)   # 0.05 accuracy short, 2 ms/0.1 = 2x the goal
        0.55
    """
    if not (0.0 < share <= 1.0):
        raise SchedulerError(f"`share` must be in (0, 1], got {share}.")
    _check_alpha(alpha)
    if not (0 <= level_index < len(app.levels)):
        raise SchedulerError(
            f"`level_index`={level_index} is not a level of app {app.name!r} (0..{len(app.levels) - 1})."
        )
    lv = app.levels[level_index]
    return _cost(max(0.0, app.goal_accuracy - lv.accuracy), lv.latency_ms, app.goal_latency_ms, share, alpha)


@dataclass(frozen=True)
class Allocation:
    """What one app gets: a level and a compute share, with the chosen level's profile.

    Attributes:
        app: application name.
        level: the chosen level (the profile's ``level`` number).
        share: compute share u in (0, 1].
        cost: C(m, u, v) of this allocation.
        accuracy: A(m) of the chosen level.
        latency_ms: L(m) at 100 % compute.
        memory_mb: S(m).
    """

    app: str
    level: int
    share: float
    cost: float
    accuracy: float
    latency_ms: float
    memory_mb: float


@dataclass(frozen=True)
class Decision:
    """A scheduler's answer for one set of apps.

    Attributes:
        scheduler: registry name of the scheduler that decided.
        objective: ``"total"`` or ``"max"``.
        value: the objective's value (sum or maximum of the apps' costs).
        alpha: latency weight used.
        unit: compute unit used (0 for schedulers that do not work in units).
        memory_budget_mb: S_max.
        allocations: one per app, in the order the apps were given.
    """

    scheduler: str
    objective: str
    value: float
    alpha: float
    unit: float
    memory_budget_mb: float
    allocations: tuple[Allocation, ...]

    @property
    def memory_mb(self) -> float:
        """Memory the chosen levels use together."""
        return math.fsum(a.memory_mb for a in self.allocations)

    def allocation(self, app: str) -> Allocation:
        """The allocation of the app named ``app``.

        Raises:
            SchedulerError: no app of that name is in the decision.
        """
        for a in self.allocations:
            if a.app == app:
                return a
        raise SchedulerError(f"no app {app!r} in this decision; apps: {[a.app for a in self.allocations]}.")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        d = asdict(self)
        d["allocations"] = [asdict(a) for a in self.allocations]
        return d


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise SchedulerError(
            f"`alpha` must be in [0, 1], got {alpha!r}. HINT: 0 cares only about accuracy, 1 weighs "
            "one accuracy point like a 1 % latency overshoot."
        )


def check_problem(apps: Sequence[AppProfile], memory_mb: float, alpha: float, unit: float | None) -> int:
    """Validate a scheduling problem; return the number of compute units (0 if ``unit`` is None).

    Args:
        apps: the running applications (:class:`AppProfile`, unique names).
        memory_mb: S_max, memory available to all apps together, in MB.
        alpha: latency weight in [0, 1].
        unit: indivisible compute unit; ``1 / unit`` must be a whole number at least the number
            of apps. ``None``: no compute split to check.

    Raises:
        SchedulerError: no apps, duplicate names, a non-AppProfile, memory budget below the
            smallest configuration, ``unit`` not dividing 1 (or too coarse for the apps), or
            ``alpha`` out of [0, 1].
    """
    if len(apps) == 0:
        raise SchedulerError("`apps` is empty: there is nothing to schedule. HINT: pass at least one AppProfile.")
    for a in apps:
        if not isinstance(a, AppProfile):
            raise SchedulerError(
                f"`apps` must hold AppProfile objects, got {type(a).__name__}. "
                "HINT: build them with AppProfile.from_levels / from_json / from_bundle."
            )
    names = [a.name for a in apps]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SchedulerError(f"app names must be unique, got duplicates {dupes}. HINT: AppProfile.renamed(...).")
    _check_alpha(alpha)
    smallest = math.fsum(a.levels[0].memory_mb for a in apps)
    if not (isinstance(memory_mb, (int, float)) and memory_mb >= smallest - MEMORY_TOL):
        raise SchedulerError(
            f"`memory_mb`={memory_mb!r} is smaller than the smallest configuration ({smallest:.4f} MB: every "
            f"app at level 0). HINT: raise the budget or run fewer apps ({len(apps)} given)."
        )
    if unit is None:
        return 0
    n_units = round(1.0 / unit) if isinstance(unit, (int, float)) and unit > 0 else 0
    if n_units < 1 or abs(n_units * unit - 1.0) > 1e-9:
        raise SchedulerError(
            f"`unit` must divide 1 into whole units (e.g. 0.01, 0.05, 0.1), got {unit!r}."
        )
    if n_units < len(apps):
        raise SchedulerError(
            f"`unit`={unit} gives {n_units} units, fewer than the {len(apps)} apps (each needs one). "
            "HINT: use a finer unit, e.g. 0.01."
        )
    return n_units


class Scheduler(ABC):
    """Decides a level and a compute share for every app.

    Subclasses set ``name`` and ``objective`` and implement :meth:`schedule`. Register a factory
    with :func:`nestflex.deploy.scheduler.register_scheduler` to choose it by name.
    """

    name: str = "scheduler"
    objective: str = "total"

    @abstractmethod
    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        """Decide for ``apps`` under the memory budget ``memory_mb`` (MB).

        Args:
            apps: the running applications (unique names).
            memory_mb: S_max, memory available to all apps together.
            alpha: latency weight in [0, 1].
            unit: indivisible compute unit; ``1 / unit`` must be a whole number.

        Returns:
            The decision.

        Raises:
            SchedulerError: invalid problem (see :func:`check_problem`).
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, objective={self.objective!r})"


def _check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise SchedulerError(f"`objective` must be one of {list(OBJECTIVES)}, got {objective!r}.")
    return objective


def _decision(
    name: str, objective: str, apps: Sequence[AppProfile], levels: Sequence[int], shares: Sequence[float],
    alpha: float, unit: float, memory_mb: float,
) -> Decision:
    """Build the decision record; costs recomputed by the one cost function."""
    allocs = []
    for app, m, u in zip(apps, levels, shares):
        lv = app.levels[m]
        c = _cost(max(0.0, app.goal_accuracy - lv.accuracy), lv.latency_ms, app.goal_latency_ms, u, alpha)
        allocs.append(Allocation(app.name, lv.level, u, c, lv.accuracy, lv.latency_ms, lv.memory_mb))
    costs = [a.cost for a in allocs]
    value = math.fsum(costs) if objective == "total" else max(costs)
    return Decision(name, objective, value, float(alpha), float(unit), float(memory_mb), tuple(allocs))
