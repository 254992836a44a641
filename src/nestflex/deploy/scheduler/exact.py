"""Exact solver for both objectives, to measure how far the greedy heuristic is from optimal.

Same discretisation as the greedy (whole units of ``unit``, at least one per app), so the gap it
measures is the heuristic's, not the discretisation's.

Method: dynamic programming over the apps. A state after apps ``0..i`` is one choice of their
levels (pruned when the memory they use plus the smallest levels of the apps still to come does
not fit) together with ``G[J]``, the best objective of apps ``0..i`` using exactly ``J`` units::

    G_i[J] = min_{1 <= k <= J} G_{i-1}[J - k] (+ or max) C(m_i, k * unit, i)

(``+`` for MinTotalCost, ``max`` for MinMaxCost), a min-plus / min-max convolution done with
numpy. The last app needs no convolution: costs do not increase with the share, so it takes all
units the others left. States are enumerated per level prefix, so the work is
``sum_{i<n} M^i`` convolutions of size ``(U+1)^2`` (781 for 5 levels and 5 apps before the
last): exact for any cost that is non-increasing in the share, and fine for the small instances
(<= 6 apps x 5 levels at 1 %) it exists to check.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from nestflex.deploy.scheduler.base import MEMORY_TOL, Decision, Scheduler, _check_objective, _decision, check_problem
from nestflex.deploy.scheduler.errors import SchedulerError
from nestflex.deploy.scheduler.profile import AppProfile

__all__ = ["ExactScheduler"]


class ExactScheduler(Scheduler):
    """Optimal levels and unit shares by dynamic programming (small instances).

    Args:
        objective: ``"total"`` or ``"max"``.
        max_states: refuse problems whose level prefixes exceed this many states (guards against
            calling it on a problem it would take minutes on).

    Examples:
        >>> rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
        ...         {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
        >>> apps = [AppProfile.from_levels(n, rows, max_latency_ms=10.0) for n in ("a", "b")]
        >>> d = ExactScheduler("total").schedule(apps, memory_mb=3.0, alpha=0.5, unit=0.01)
        >>> sorted(a.level for a in d.allocations)
        [0, 1]
    """

    def __init__(self, objective: str = "total", max_states: int = 200_000):
        self.objective = _check_objective(objective)
        self.name = f"exact_{objective}"
        self.max_states = int(max_states)

    def schedule(
        self, apps: Sequence[AppProfile], *, memory_mb: float, alpha: float = 0.5, unit: float = 0.01
    ) -> Decision:
        U = check_problem(apps, memory_mb, alpha, unit)
        n = len(apps)
        states_bound = sum(math.prod(len(a.levels) for a in apps[:i]) for i in range(1, n))
        if states_bound > self.max_states:
            raise SchedulerError(
                f"exact solver: {n} apps with {[len(a.levels) for a in apps]} levels need up to "
                f"{states_bound} states, more than `max_states`={self.max_states}. HINT: use a greedy "
                "scheduler, or raise max_states for an offline check."
            )
        combine = np.add if self.objective == "total" else np.maximum
        k = np.arange(U + 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = k * unit  # k = 0 is not allowed: its cost is set to inf below
            tables = []
            for a in apps:
                lmax = a.goal_latency_ms
                rows = []
                for lv in a.levels:
                    deficit = max(0.0, a.goal_accuracy - lv.accuracy)
                    c = deficit + alpha * (np.maximum(0.0, lv.latency_ms / share - lmax) / lmax)
                    c[0] = np.inf
                    rows.append(c)
                tables.append(rows)
        mem = [[lv.memory_mb for lv in a.levels] for a in apps]
        # smallest memory the apps from i on need: prunes prefixes that cannot be completed
        rest = [math.fsum(m[0] for m in mem[i:]) for i in range(n + 1)]
        J = np.arange(U + 1)[:, None]
        diff = J - k[None, :]
        valid = diff >= 0
        diff_c = np.where(valid, diff, 0)

        g0 = np.full(U + 1, np.inf)
        g0[0] = 0.0
        # a state: (memory used, levels, G, index of parent state, argmin k per J)
        layers: list[list[tuple[float, tuple[int, ...], np.ndarray, int, np.ndarray | None]]] = [
            [(0.0, (), g0, -1, None)]
        ]
        for i in range(n - 1):
            nxt = []
            for si, (used, lv_prefix, g, _, _) in enumerate(layers[-1]):
                for m, c in enumerate(tables[i]):
                    new_used = used + mem[i][m]
                    if new_used + rest[i + 1] > memory_mb + MEMORY_TOL:
                        break  # memory is non-decreasing in the level
                    mat = combine(g[diff_c], c[None, :])
                    mat[~valid] = np.inf
                    arg = np.argmin(mat, axis=1)
                    nxt.append((new_used, lv_prefix + (m,), mat[np.arange(U + 1), arg], si, arg))
            layers.append(nxt)

        last = n - 1
        best = (math.inf, None, None, None)  # value, state index, level, units before the last app
        for si, (used, _, g, _, _) in enumerate(layers[-1]):
            for m, c in enumerate(tables[last]):
                if used + mem[last][m] > memory_mb + MEMORY_TOL:
                    break
                vals = combine(g, c[::-1])  # prefix uses J units, the last app the other U - J
                j = int(np.argmin(vals))
                if vals[j] < best[0]:
                    best = (float(vals[j]), si, m, j)
        if best[1] is None or not math.isfinite(best[0]):  # pragma: no cover - check_problem prevents it
            raise SchedulerError("exact solver found no feasible allocation.")

        _, si, m_last, j = best
        levels = [0] * n
        units = [0] * n
        levels[last], units[last] = m_last, U - j
        for i in range(n - 1, 0, -1):
            _, lv_prefix, _, parent, arg = layers[i][si]
            levels[i - 1] = lv_prefix[-1]
            units[i - 1] = int(arg[j])
            j -= units[i - 1]
            si = parent
        return _decision(self.name, self.objective, apps, levels, [k_ * unit for k_ in units], alpha, unit, memory_mb)
