"""NestDNN's greedy heuristic (§3.3.4) for both objectives, and its cached variant.

Compute is split into ``U = 1 / unit`` indivisible units. Every app starts with one unit at its
smallest level (the smallest configuration; it must fit the memory budget). Then, one unit at a
time until all are given:

* **MinTotalCost** (``"total"``): over every app v and every level m that fits the memory left
  (with v's own current level given back), give the unit to the pair whose cost falls the most,
  ``C(m, u_v + du, v) - C(m_v, u_v, v)``; v switches to m.
* **MinMaxCost** (``"max"``): give the unit to the app with the highest cost, and switch it to its
  cheapest level (lowest cost at its new share) that fits the memory.

Ties go to the app with fewer units, then to the earlier app, then to the smaller level, so a
decision is a pure function of its input.

Why it is cheap: each step looks at ``n x M`` candidates at most, and only the app that got the
unit needs a fresh look unless some app changed level (which changes the memory left for all).
A decision is ``O(U * M)`` cost evaluations plus ``O(n * M)`` per level change.

**Cached variant** (:class:`CachedGreedyScheduler`): a full run records its partial state when
``cache_fraction`` of the units are given (70 % by default, as in the paper). The next call
starts from that state: apps that left give their units back, apps that arrived join with one
unit at level 0, and only the remaining units are handed out. With the same apps and settings
this reproduces the full run exactly (the greedy is deterministic, so resuming from its own
intermediate state retraces it). Every ``refresh_every``-th call, and whenever the cached state
does not fit (memory, units) or the settings changed, a full run replaces the cache so it does
not drift from what the full greedy would decide.
"""

from __future__ import annotations

import math
from typing import Sequence

from nestflex.deploy.scheduler.base import MEMORY_TOL, Decision, Scheduler, _check_objective, _decision, check_problem
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.profile import AppProfile

__all__ = ["GreedyScheduler", "CachedGreedyScheduler", "greedy_allocate"]


class _Problem:
    """Flat per-app tables the greedy loop reads (plain lists: faster than numpy at this size)."""

    __slots__ = ("n", "unit", "alpha", "budget", "U", "deficit", "lat", "lmax", "mem", "k_goal")

    def __init__(self, apps: Sequence[AppProfile], memory_mb: float, alpha: float, unit: float, U: int):
        self.n = len(apps)
        self.unit, self.alpha, self.budget, self.U = unit, alpha, memory_mb, U
        self.deficit = [[max(0.0, a.goal_accuracy - lv.accuracy) for lv in a.levels] for a in apps]
        self.lat = [[lv.latency_ms for lv in a.levels] for a in apps]
        self.lmax = [a.goal_latency_ms for a in apps]
        self.mem = [[lv.memory_mb for lv in a.levels] for a in apps]
        # fewest units with which each level meets its app's latency goal (U + 1: never)
        self.k_goal = [[self._k_goal(v, m) for m in range(len(self.lat[v]))] for v in range(self.n)]

    def _k_goal(self, v: int, m: int) -> int:
        k = max(1, math.ceil(self.lat[v][m] / (self.lmax[v] * self.unit) - 1e-9))
        while k <= self.U and self.cost(v, m, k) > self.deficit[v][m]:
            k += 1  # the float ceil may be one short
        return min(k, self.U + 1)

    def cost(self, v: int, m: int, k: int) -> float:
        # inlined _cost (same arithmetic, same order): this is the hot loop
        lmax = self.lmax[v]
        return self.deficit[v][m] + self.alpha * (max(0.0, self.lat[v][m] / (k * self.unit) - lmax) / lmax)

    def mem_used(self, levels: Sequence[int]) -> float:
        # recomputed from the levels (fsum: order-free) so the state is a pure function of them
        return math.fsum(self.mem[v][m] for v, m in enumerate(levels))


def greedy_allocate(
    p: _Problem,
    objective: str,
    units: list[int],
    levels: list[int],
    snapshot_at: int | None = None,
    jump: bool = False,
) -> tuple[list[int], list[int], tuple[list[int], list[int]] | None]:
    """Hand out the units left after ``units`` (modified in place).

    ``jump=False`` is the paper's rule, one unit per step. ``jump=True`` (MinTotalCost only) also
    offers, for every level m, the step that gives app v at once the units m needs to meet its
    latency goal (``k_goal(m) - u_v`` units), judged by cost decrease per unit: one unit more
    rarely pays for a bigger level, so the one-unit rule leaves apps stuck on small levels.
    (For MinMaxCost the same jump hands the top app many units early and starves the others;
    measured far worse, so it is not offered.)

    Returns the final units and levels and, if ``snapshot_at`` is reached, the state at the first
    step where at least ``snapshot_at`` units had been given.
    """
    n, U = p.n, p.U
    allocated = sum(units)
    snapshot = None
    mem_used = p.mem_used(levels)
    cur = [p.cost(v, levels[v], units[v]) for v in range(n)]
    if objective == "total":
        best_rate = [0.0] * n
        best_c = [0.0] * n
        best_m = [0] * n
        best_j = [1] * n

        def refresh(v: int) -> None:
            slack = p.budget - (mem_used - p.mem[v][levels[v]]) + MEMORY_TOL
            k = units[v]
            rem = U - allocated
            mems, now = p.mem[v], cur[v]
            br, bc, bm, bj = -math.inf, now, levels[v], 1
            for m in range(len(mems)):
                if mems[m] > slack:
                    break  # memory is non-decreasing in the level
                c = p.cost(v, m, k + 1)
                if now - c > br:
                    br, bc, bm, bj = now - c, c, m, 1
                if jump:
                    j = p.k_goal[v][m] - k
                    if 1 < j <= rem:
                        c = p.deficit[v][m]
                        if (now - c) / j > br:
                            br, bc, bm, bj = (now - c) / j, c, m, j
            best_rate[v], best_c[v], best_m[v], best_j[v] = br, bc, bm, bj

        for v in range(n):
            refresh(v)
        while allocated < U:
            if snapshot is None and snapshot_at is not None and allocated >= snapshot_at:
                snapshot = (list(units), list(levels))
            rem = U - allocated
            for i in range(n):
                if best_j[i] > rem:
                    refresh(i)
            v = min(range(n), key=lambda i: (-best_rate[i], units[i], i))
            m = best_m[v]
            changed = m != levels[v]
            levels[v] = m
            units[v] += best_j[v]
            allocated += best_j[v]
            cur[v] = best_c[v]
            if changed:
                mem_used = p.mem_used(levels)
                for i in range(n):
                    refresh(i)
            else:
                refresh(v)
    else:
        while allocated < U:
            if snapshot is None and snapshot_at is not None and allocated >= snapshot_at:
                snapshot = (list(units), list(levels))
            v = max(range(n), key=lambda i: (cur[i], -units[i], -i))
            k = units[v]
            slack = p.budget - (mem_used - p.mem[v][levels[v]]) + MEMORY_TOL
            mems = p.mem[v]
            bc, bm, bj = math.inf, levels[v], 1
            for m in range(len(mems)):
                if mems[m] > slack:
                    break
                c = p.cost(v, m, k + 1)
                if c < bc:
                    bc, bm, bj = c, m, 1
            changed = bm != levels[v]
            levels[v] = bm
            units[v] = k + bj
            allocated += bj
            cur[v] = bc
            if changed:
                mem_used = p.mem_used(levels)
    return units, levels, snapshot


class GreedyScheduler(Scheduler):
    """The greedy heuristic, from scratch on every call.

    Args:
        objective: ``"total"`` (MinTotalCost) or ``"max"`` (MinMaxCost).
        jump: also offer, at each step, the move that gives an app at once the units a level
            needs to meet its latency goal, judged by cost decrease per unit (``"total"``
            only; ``False``: the paper's one-unit rule, see :func:`greedy_allocate`).

    Raises:
        SchedulerError: an unknown objective, or ``jump`` with objective ``"max"``.

    Examples:
        >>> rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
        ...         {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
        >>> apps = [AppProfile.from_levels(n, rows, max_latency_ms=10.0) for n in ("a", "b")]
        >>> d = GreedyScheduler("total").schedule(apps, memory_mb=3.0, alpha=0.5, unit=0.01)
        >>> [(a.app, a.level) for a in d.allocations], round(sum(a.share for a in d.allocations), 6)
        ([('a', 1), ('b', 0)], 1.0)
    """

    def __init__(self, objective: str = "total", jump: bool = False):
        self.objective, self.jump = _check_objective(objective), _check_jump(jump, objective)
        self.name = f"greedy_{objective}" + ("_jump" if jump else "")

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        U = check_problem(apps, memory_mb, alpha, unit)
        p = _Problem(apps, memory_mb, alpha, unit, U)
        units, levels, _ = greedy_allocate(p, self.objective, [1] * p.n, [0] * p.n, jump=self.jump)
        return _decision(self.name, self.objective, apps, levels, [k * unit for k in units], alpha, unit, memory_mb)


class CachedGreedyScheduler(Scheduler):
    """The greedy heuristic resumed from a cached partial allocation (stateful).

    Args:
        objective: ``"total"`` or ``"max"``.
        cache_fraction: share of the units given when the partial state is cached, in (0, 1).
        refresh_every: every this many calls a full greedy run refreshes the cache (>= 1; 1 means
            always full).
        jump: also offer, at each step, the move that gives an app at once the units a level
            needs to meet its latency goal, judged by cost decrease per unit (``"total"``
            only; ``False``: the paper's one-unit rule, see :func:`greedy_allocate`).

    Raises:
        SchedulerError: an argument out of range, or ``jump`` with objective ``"max"``.

    Attributes:
        last_used_cache: whether the last :meth:`schedule` call resumed from the cache.
        calls: number of :meth:`schedule` calls so far.

    Examples:
        >>> rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
        ...         {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
        >>> apps = [AppProfile.from_levels(n, rows, max_latency_ms=10.0) for n in ("a", "b")]
        >>> s = CachedGreedyScheduler("total")
        >>> first = s.schedule(apps, memory_mb=3.0, alpha=0.5)
        >>> again = s.schedule(apps, memory_mb=3.0, alpha=0.5)
        >>> s.last_used_cache, again == first
        (True, True)
    """

    def __init__(
        self, objective: str = "total", cache_fraction: float = 0.7, refresh_every: int = 10, jump: bool = False
    ):
        self.objective, self.jump = _check_objective(objective), _check_jump(jump, objective)
        self.name = f"cached_{objective}" + ("_jump" if jump else "")
        if not (isinstance(cache_fraction, (int, float)) and 0.0 < cache_fraction < 1.0):
            raise SchedulerError(
                f"`cache_fraction` must be in (0, 1), got {cache_fraction!r}. HINT: the paper caches at 0.7."
            )
        if not (isinstance(refresh_every, int) and refresh_every >= 1):
            raise SchedulerError(f"`refresh_every` must be an integer >= 1, got {refresh_every!r}.")
        self.cache_fraction = float(cache_fraction)
        self.refresh_every = refresh_every
        self.calls = 0
        self.last_used_cache = False
        self._key: tuple | None = None
        self._cache: dict[str, tuple[AppProfile, int, int]] = {}

    def reset(self) -> None:
        """Forget the cache; the next call runs the full greedy."""
        self._key, self._cache = None, {}

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        U = check_problem(apps, memory_mb, alpha, unit)
        p = _Problem(apps, memory_mb, alpha, unit, U)
        key = (float(memory_mb), float(alpha), float(unit))
        self.calls += 1
        start = None
        if self._key == key and (self.calls - 1) % self.refresh_every != 0:
            start = self._resume_state(apps, p)
        if start is None:
            self.last_used_cache = False
            snap_at = max(p.n, math.ceil(self.cache_fraction * U))
            units, levels, snap = greedy_allocate(
                p, self.objective, [1] * p.n, [0] * p.n, snapshot_at=snap_at, jump=self.jump
            )
            if snap is None:  # the run never passed snap_at (fewer units than apps + 1): nothing to cache
                snap = ([1] * p.n, [0] * p.n)
        else:
            self.last_used_cache = True
            snap = (list(start[0]), list(start[1]))
            units, levels, _ = greedy_allocate(p, self.objective, start[0], start[1], jump=self.jump)
        self._key = key
        self._cache = {a.name: (a, k, m) for a, k, m in zip(apps, snap[0], snap[1])}
        return _decision(self.name, self.objective, apps, levels, [k * unit for k in units], alpha, unit, memory_mb)

    def _resume_state(self, apps: Sequence[AppProfile], p: _Problem) -> tuple[list[int], list[int]] | None:
        units, levels = [], []
        for a in apps:
            hit = self._cache.get(a.name)
            if hit is not None and hit[0] == a:
                units.append(hit[1])
                levels.append(hit[2])
            else:  # a new (or changed) app joins as in a full run: one unit, smallest level
                units.append(1)
                levels.append(0)
        if sum(units) > p.U or p.mem_used(levels) > p.budget + MEMORY_TOL:
            return None
        return units, levels


def _check_jump(jump: bool, objective: str) -> bool:
    """The jump step is a MinTotalCost refinement; MinMaxCost keeps the paper's one-unit rule."""
    if jump and objective != "total":
        raise SchedulerError(
            f"`jump`=True is only for objective 'total', got objective {objective!r}. "
            "HINT: MinMaxCost uses the one-unit rule."
        )
    return bool(jump)
