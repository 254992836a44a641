"""One scheduler for the whole device: level x exits x split x bitwidth for several apps (issue 41).

NestDNN's scheduler picks a level and a compute share per app; SPINN's and DynO's pick a split,
an exit operating point and a bitwidth for one app. Here every app has one list of
configurations, each a :class:`JointOption` (a level, an exit operating point, local or a split
point and bitwidth) with its predicted cost per frame on every shared resource:

* the device: ``device_ms`` per frame at the whole device;
* the uplink: ``bytes`` sent per frame (the share of frames sent times one frame's bytes);
* the server: ``server_ms`` per frame (the share sent times the tail's time);
* memory: ``memory_mb`` resident while the configuration runs.

**Load model.** App ``v`` runs at its goal rate ``f_v`` (frames/s, its frame period ``1000 /
f_v`` ms is NestDNN's ``L_max``). Each resource is shared in proportion to demand (processor
sharing), so its load is ``rho_r = sum_v f_v d_{v,r} / capacity_r`` and, when ``rho_r > 1``,
every app using ``r`` is slowed by ``rho_r`` (a frame's stage on ``r`` takes ``rho_r`` times its
period). App ``v``'s slowdown is ``s_v = max(1, max_{r used by v} rho_r)`` - the device always, the
link and the server only when it sends frames - and its cost extends NestDNN's Eq. 2::

    C_v = max(0, A_min(v) - A(c_v)) + alpha * (s_v - 1)

``s_v - 1`` is NestDNN's relative latency overshoot ``(L / u - L_max) / L_max`` with shares
proportional to demand; a pipelined app's period is its slowest stage, which is why the slowdown
is the largest load it meets, not a sum. Memory is a hard budget. ``objective="total"`` minimises
``sum_v C_v`` (MinTotalCost), ``"max"`` the largest ``C_v`` (MinMaxCost).

**Hard constraints per app** (SPINN): ``min_accuracy_floor`` removes the options below it; when
none is left the most accurate option stays (SPINN's relaxation: best effort, reported in
``JointDecision.relaxed``). The soft targets are the cost above, one number per app, so that apps
can be traded against each other; SPINN's lexicographic order breaks ties among equal costs
(fewer bytes, then less server time).

**Search.** Each app's options are first cut to their Pareto front (no other option at least as
accurate and no more costly on every resource), so the search runs over small fronts.
:class:`JointScheduler` (the live heuristic) does coordinate descent from several starts (every
app on its lightest option, every app on its most accurate one, and the last decision when the
apps are the same): it moves one app at a time to its best option given the others, until no
move helps; from the best of those ends, moves of two apps at once as well. :class:`ExactJointScheduler` enumerates every combination of the fronts (small
instances) to measure the heuristic's gap.

Examples:
    >>> local = JointOption(level=1, accuracy=0.90, device_ms=20.0, memory_mb=4.0)
    >>> small = JointOption(level=0, accuracy=0.80, device_ms=8.0, memory_mb=2.0)
    >>> split = JointOption(level=1, accuracy=0.89, device_ms=4.0, memory_mb=4.0, split="s1", bits=4,
    ...                     sent=1.0, bytes=2000.0, server_ms=5.0)
    >>> apps = [JointApp(n, (local, small, split), fps=30.0) for n in ("a", "b")]
    >>> res = JointResources(memory_mb=8.0, link_mbps=20.0, server_capacity=1.0)
    >>> d = JointScheduler().schedule(apps, res, alpha=1.0)
    >>> [(a.app, a.option.label) for a in d.allocations]  # both local: 2 x 30 x 20 ms fill the device 1.2x
    [('a', 'L1'), ('b', 'L1@s1:4')]
    >>> round(d.loads["device"], 2), round(d.value, 4)  # one offloads, giving up 1 point, and both keep 30 fps
    (0.72, 0.01)
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from nestflex.deploy.scheduler.base import MEMORY_TOL, OBJECTIVES
from nestflex.deploy.scheduler.errors import SchedulerError

__all__ = [
    "JointOption",
    "JointApp",
    "JointResources",
    "JointAllocation",
    "JointDecision",
    "pareto_front",
    "JointScheduler",
    "ExactJointScheduler",
    "joint_options",
]

#: the resources an option loads, in the order of :meth:`JointOption.demand`
RESOURCES: tuple[str, ...] = ("device", "link", "server")


@dataclass(frozen=True)
class JointOption:
    """One configuration of one app and its predicted cost per frame.

    Attributes:
        level: the capacity level.
        accuracy: predicted accuracy in [0, 1] (the operating point's, less the split's
            quantisation drop on the frames sent).
        device_ms: device time per frame at the whole device (exit heads and early exits included).
        memory_mb: memory resident while it runs.
        point: the exit operating point's index (``None``: no early exit).
        split: the split point (``None``: everything on the device).
        bits: the bitwidth of the sent tensors (``None``: float32).
        sent: share of frames sent to the server.
        bytes: bytes sent per frame (``sent`` x one frame's bytes).
        server_ms: server time per frame (``sent`` x the tail's time).
        continue_locally: a split option that runs past the split to the next exit while the request
            is in flight (SPINN's local continuation, the :class:`~nestflex.deploy.split.offload.Offloader`'s
            default); ``False``: the device sends and waits (its ``device_ms`` is then only the head
            and the send, and a failed request runs the rest of the network on the device).
    """

    level: int
    accuracy: float
    device_ms: float
    memory_mb: float
    point: int | None = None
    split: str | None = None
    bits: int | None = None
    sent: float = 0.0
    bytes: float = 0.0
    server_ms: float = 0.0
    continue_locally: bool = True

    def __post_init__(self) -> None:
        for name in ("accuracy", "device_ms", "memory_mb", "sent", "bytes", "server_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SchedulerError(f"JointOption `{name}` must be a finite number >= 0, got {v!r}")
        if self.split is None and (self.sent or self.bytes or self.server_ms):
            raise SchedulerError(f"a local JointOption (split=None) sends nothing, got sent={self.sent}, "
                                 f"bytes={self.bytes}, server_ms={self.server_ms}. HINT: name its split")
        if self.split is None and not self.continue_locally:
            raise SchedulerError("a local JointOption (split=None) has no local continuation to turn off, got "
                                 "continue_locally=False. HINT: leave it True")

    @property
    def label(self) -> str:
        """``L<level>[/p<point>][@<split>:<bits or f32>[:direct]]``, e.g. ``L4/p2@conv3:4``
        (``:direct``: without the local continuation)."""
        out = f"L{self.level}" + ("" if self.point is None else f"/p{self.point}")
        if self.split is None:
            return out
        return out + f"@{self.split}:{self.bits or 'f32'}" + ("" if self.continue_locally else ":direct")

    def demand(self) -> tuple[float, float, float]:
        """(device ms, bytes, server ms) per frame."""
        return (self.device_ms, self.bytes, self.server_ms)


@dataclass(frozen=True)
class JointApp:
    """An app: its options and goals.

    Attributes:
        name: unique name.
        options: its configurations (at least one).
        fps: goal frame rate; ``1000 / fps`` is NestDNN's ``L_max``.
        min_accuracy: ``A_min`` of the cost; ``None``: the best option's accuracy (every point
            given up is charged).
        min_accuracy_floor: hard floor (SPINN): options below it are not run, unless none is
            above it.
    """

    name: str
    options: tuple[JointOption, ...]
    fps: float = 30.0
    min_accuracy: float | None = None
    min_accuracy_floor: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))  # frozen: the scheduler caches its front
        if not self.options:
            raise SchedulerError(f"app {self.name!r} has no options. HINT: build them with joint_options(...)")
        if not all(isinstance(o, JointOption) for o in self.options):
            raise SchedulerError(f"app {self.name!r}: `options` must hold JointOption objects. HINT: "
                                 f"joint_options(...) builds them from a bundle's profiles")
        if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not self.fps > 0:
            raise SchedulerError(f"app {self.name!r}: `fps` must be a number > 0, got {self.fps!r}")

    @property
    def goal_accuracy(self) -> float:
        return float(self.min_accuracy) if self.min_accuracy is not None else max(o.accuracy for o in self.options)


@dataclass(frozen=True)
class JointResources:
    """What the apps share.

    Attributes:
        memory_mb: the memory budget.
        link_mbps: uplink bandwidth (the network profiler's estimate); 0: no link.
        server_capacity: server time per second of wall time, in seconds (1.0: one server core's
            worth for these apps; 0: no server).
        device_slowdown: the online profiler's factor on every ``device_ms`` (1: as profiled).
        server_slowdown: the same for ``server_ms``.
    """

    memory_mb: float
    link_mbps: float = 0.0
    server_capacity: float = 0.0
    device_slowdown: float = 1.0
    server_slowdown: float = 1.0

    def __post_init__(self) -> None:
        for name in ("memory_mb", "link_mbps", "server_capacity"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise SchedulerError(f"JointResources `{name}` must be a finite number >= 0, got {v!r}")
        for name in ("device_slowdown", "server_slowdown"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SchedulerError(f"JointResources `{name}` must be a finite number > 0, got {v!r}")

    def capacity(self) -> np.ndarray:
        """Per second: device ms, link bytes, server ms (inf-safe: 0 means none)."""
        return np.array([1000.0 / self.device_slowdown, self.link_mbps * 1e6 / 8,
                         1000.0 * self.server_capacity / self.server_slowdown])


@dataclass(frozen=True)
class JointAllocation:
    """One app's configuration and its predicted outcome.

    Attributes:
        app: the app's name.
        option: the chosen configuration.
        cost: its cost ``C_v``.
        slowdown: its predicted slowdown ``s_v`` (>= 1) from sharing the device, link and server.
        fps: the predicted frame rate ``fps / s_v``.
    """

    app: str
    option: JointOption
    cost: float
    slowdown: float
    fps: float


@dataclass(frozen=True)
class JointDecision:
    """A joint scheduler's answer.

    Attributes:
        scheduler: name of the scheduler that decided.
        objective: ``"total"`` (MinTotalCost) or ``"max"`` (MinMaxCost).
        alpha: the latency weight it was decided with, in [0, 1].
        value: the objective's value (the sum or the maximum of the apps' costs).
        allocations: one per app, in the order given.
        loads: ``rho`` of the device, the link and the server.
        memory_mb: memory the chosen options use together.
        relaxed: apps whose accuracy floor no option met (they run their most accurate option).
        front_sizes: options per app after the floor and the Pareto cut.
        decision_ms: time the decision took.
    """

    scheduler: str
    objective: str
    alpha: float
    value: float
    allocations: tuple[JointAllocation, ...]
    loads: dict[str, float]
    memory_mb: float
    relaxed: tuple[str, ...] = ()
    front_sizes: tuple[int, ...] = ()
    decision_ms: float = 0.0

    def allocation(self, app: str) -> JointAllocation:
        for a in self.allocations:
            if a.app == app:
                return a
        raise SchedulerError(f"no app {app!r} in this decision; apps: {[a.app for a in self.allocations]}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for a, src in zip(d["allocations"], self.allocations):
            a["option"]["label"] = src.option.label
        return d


def pareto_front(options: Sequence[JointOption], accuracy_eps: float = 0.0, cost_eps: float = 0.0) -> list[int]:
    """Indices of the options no other option dominates (as accurate or more, and no more costly on
    device time, bytes, server time and memory, better on one), in the given order; of exact
    duplicates the first stays.

    With ``accuracy_eps`` / ``cost_eps`` > 0 the front is thinned (epsilon-dominance): from the
    most accurate down, an option is dropped when a kept one is within ``accuracy_eps`` of its
    accuracy and within a factor ``1 + cost_eps`` of each of its costs. A real bundle has
    hundreds of non-dominated split x bitwidth x operating point options that differ by a tenth
    of a point; the thinned front keeps one per step of that size, so the search stays small.

    >>> a = JointOption(level=0, accuracy=0.8, device_ms=5.0, memory_mb=1.0)
    >>> b = JointOption(level=1, accuracy=0.9, device_ms=9.0, memory_mb=2.0)
    >>> c = JointOption(level=1, accuracy=0.7, device_ms=9.0, memory_mb=2.0)  # worse than b everywhere
    >>> d = JointOption(level=1, accuracy=0.899, device_ms=8.9, memory_mb=2.0)  # a hair cheaper than b
    >>> pareto_front([a, b, c, d]), pareto_front([a, b, c, d], accuracy_eps=0.002, cost_eps=0.05)
    ([0, 1, 3], [0, 1])
    """
    rows = np.array([[-o.accuracy, o.device_ms, o.bytes, o.server_ms, o.memory_mb] for o in options]).reshape(-1, 5)
    keep = []
    n = len(rows)
    cols = [rows[:, k] for k in range(5)]
    for lo in range(0, n, 256):  # blocks of rows against all, one column at a time (2-D, contiguous)
        blk = [c[lo:lo + 256, None] for c in cols]
        no_worse, better, same = np.ones((len(blk[0]), n), dtype=bool), np.zeros((len(blk[0]), n), dtype=bool), None
        for c, b in zip(cols, blk):
            no_worse &= c[None, :] <= b
            better |= c[None, :] < b
        same = no_worse & ~better & (np.arange(n)[None, :] < np.arange(lo, lo + len(blk[0]))[:, None])
        keep += [lo + int(i) for i in np.flatnonzero(~(no_worse & better).any(axis=1) & ~same.any(axis=1))]
    if accuracy_eps <= 0 and cost_eps <= 0:
        return keep
    order = sorted(keep, key=lambda i: (rows[i, 0], tuple(rows[i, 1:])))  # most accurate first
    r = rows[order]
    # covers[j, i]: option j (in that order) is within the steps of option i on accuracy and every cost
    covers = r[:, None, 0] <= r[None, :, 0] + accuracy_eps
    for k in range(1, 5):
        covers &= r[:, None, k] <= r[None, :, k] * (1 + cost_eps) + 1e-12
    kept = np.zeros(len(order), dtype=bool)
    for i in range(len(order)):
        kept[i] = not (covers[:i, i] & kept[:i]).any()
    return sorted(order[i] for i in np.flatnonzero(kept))


def _rows(options: Sequence[JointOption]) -> np.ndarray:
    """(accuracy, device ms, bytes, server ms, memory MB) per option."""
    return np.array([[o.accuracy, o.device_ms, o.bytes, o.server_ms, o.memory_mb] for o in options],
                    dtype=np.float64).reshape(-1, 5)


@dataclass(frozen=True)
class _Table:
    front: list[int]
    rows: np.ndarray  # the front's _rows
    lowest_accuracy: float  # over all the options
    best_accuracy: float
    index: dict[JointOption, int]  # option -> its place in the front (a warm start's lookup)

    def all_above(self, floor: float) -> bool:
        return self.lowest_accuracy >= floor


#: an app's front and its arrays, by the options tuple's identity: an app's options do not change
#: between the re-plans of a live engine, only the resources do (an entry holds its tuple, so the id
#: is not reused while it is cached)
_TABLES: dict[tuple[int, float, float], tuple[tuple[JointOption, ...], _Table]] = {}


def _table(options: tuple[JointOption, ...], accuracy_eps: float, cost_eps: float) -> _Table:
    key = (id(options), accuracy_eps, cost_eps)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is options:
        return hit[1]
    if len(_TABLES) >= 256:
        _TABLES.clear()
    front = pareto_front(options, accuracy_eps, cost_eps)
    accuracy = [o.accuracy for o in options]
    table = _Table(front, _rows([options[i] for i in front]), min(accuracy), max(accuracy),
                   {options[i]: k for k, i in enumerate(front)})
    _TABLES[key] = (options, table)
    return table


class _Problem:
    """The apps' fronts as arrays, and the objective of any assignment."""

    def __init__(self, apps: Sequence[JointApp], res: JointResources, alpha: float, objective: str,
                 accuracy_eps: float = 0.0, cost_eps: float = 0.0) -> None:
        if not apps:
            raise SchedulerError("`apps` is empty: there is nothing to schedule. HINT: pass at least one JointApp")
        names = [a.name for a in apps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SchedulerError(f"app names must be unique, got duplicates {dupes}")
        if objective not in OBJECTIVES:
            raise SchedulerError(f"`objective` must be one of {list(OBJECTIVES)}, got {objective!r}")
        if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
            raise SchedulerError(f"`alpha` must be in [0, 1], got {alpha!r}")
        self.apps, self.res, self.alpha, self.objective = list(apps), res, float(alpha), objective
        cap = res.capacity()
        self.fronts: list[list[JointOption]] = []
        self.index: list[dict[JointOption, int]] = []
        self.relaxed: list[str] = []
        tables, goals = [], []
        for app in apps:
            table = _table(app.options, accuracy_eps, cost_eps)  # the whole app's front, cached
            goals.append(table.best_accuracy if app.min_accuracy is None else float(app.min_accuracy))
            floor = app.min_accuracy_floor
            if (cap[1] > 0 and cap[2] > 0 and (floor is None or table.all_above(floor))):
                front, rows, index = [app.options[i] for i in table.front], table.rows, table.index
            else:  # a missing link or server, or a floor: the front of what is left
                usable = [o for o in app.options
                          if (o.bytes == 0 or cap[1] > 0) and (o.server_ms == 0 or cap[2] > 0)]
                if not usable:
                    raise SchedulerError(f"app {app.name!r}: every option sends frames, and there is no link or "
                                         f"server (link_mbps={res.link_mbps}, server_capacity="
                                         f"{res.server_capacity}). HINT: give it a local option (split=None)")
                ok = [o for o in usable if floor is None or o.accuracy >= floor]
                if not ok:  # SPINN: the hard constraint becomes best effort
                    self.relaxed.append(app.name)
                    best = max(o.accuracy for o in usable)
                    ok = [o for o in usable if o.accuracy == best]
                front = [ok[i] for i in pareto_front(ok, accuracy_eps, cost_eps)]
                rows, index = _rows(front), {o: k for k, o in enumerate(front)}
            self.fronts.append(front)
            self.index.append(index)
            tables.append(rows)
        smallest = math.fsum(float(r[:, 4].min()) for r in tables)
        if smallest > res.memory_mb + MEMORY_TOL:
            raise SchedulerError(f"`memory_mb`={res.memory_mb} is below the smallest configuration of these apps "
                                 f"({smallest:.4f} MB). HINT: raise the budget or run fewer apps ({len(apps)} given)")
        safe = np.where(cap > 0, cap, 1.0)
        # per app and option: demand per second on each resource as a share of its capacity
        self.load = [r[:, 1:4] * app.fps / safe for app, r in zip(apps, tables)]
        # which shared resources an option waits on, as one of four patterns (the device always):
        # 0 device, 1 + link, 2 + server, 3 all three; an app's slowdown is the peak load of its pattern
        self.pattern = [((r[:, 2] > 0).astype(np.int64) + 2 * (r[:, 3] > 0)) for r in tables]
        self.deficit = [np.maximum(0.0, goal - r[:, 0]) for goal, r in zip(goals, tables)]
        self.memory = [r[:, 4] for r in tables]
        # SPINN's tie-break among equal costs: fewer bytes, then less server time
        self.tie = [r[:, 2] * 1e-12 + r[:, 3] * 1e-15 for r in tables]
        # the same, padded to the largest front and stacked (n, M, ...), for evaluating many assignments at once
        width = max(len(f) for f in self.fronts)

        def stack(arrays: list[np.ndarray], fill: Any) -> np.ndarray:
            out = np.full((len(arrays), width, *arrays[0].shape[1:]), fill, dtype=arrays[0].dtype)
            for v, a in enumerate(arrays):
                out[v, :len(a)] = a
            return out

        self.s_load, self.s_pattern = stack(self.load, 0.0), stack(self.pattern, 0)
        self.s_deficit, self.s_memory, self.s_tie = stack(self.deficit, 0.0), stack(self.memory, 0.0), stack(self.tie, 0.0)
        self.rows_n = np.arange(len(apps))
        # where each option's own slowdown sits in _single_moves' (M, 4) peaks, flattened
        self.own_peak = [np.arange(len(f)) * 4 + pat for f, pat in zip(self.fronts, self.pattern)]
        self.budget = res.memory_mb + MEMORY_TOL

    def costs(self, choice: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cost per app, slowdown per app, loads) of one assignment (:func:`_evaluate` of one row)."""
        cost, slow, rho, _, _ = _evaluate(self, np.asarray(choice, dtype=np.int64)[None, :])
        return cost[0], slow[0], rho[0]

    def value(self, cost: np.ndarray) -> float:
        return float(math.fsum(cost)) if self.objective == "total" else float(np.max(cost))

    def fits(self, choice: Sequence[int]) -> bool:
        return math.fsum(self.memory[v][c] for v, c in enumerate(choice)) <= self.budget

    def decision(self, name: str, choice: Sequence[int], start: float) -> JointDecision:
        cost, slow, rho = self.costs(choice)
        allocs = tuple(JointAllocation(app.name, self.fronts[v][c], float(cost[v]), float(slow[v]), app.fps / slow[v])
                       for v, (app, c) in enumerate(zip(self.apps, choice)))
        return JointDecision(name, self.objective, self.alpha, self.value(cost), allocs,
                             dict(zip(RESOURCES, (float(r) for r in rho))),
                             math.fsum(a.option.memory_mb for a in allocs), tuple(self.relaxed),
                             tuple(len(f) for f in self.fronts), (time.perf_counter() - start) * 1e3)


@dataclass
class JointScheduler:
    """The live heuristic: coordinate descent over the apps' Pareto fronts from several starts.

    Args:
        objective: ``"total"`` (MinTotalCost) or ``"max"`` (MinMaxCost).
        max_sweeps: passes over the apps per start (each pass moves every app to its best option
            given the others; it stops earlier when a pass changes nothing).
        pair_candidates: options per app tried in the moves of two apps at once (its best alone).
        accuracy_eps: the front's thinning in accuracy (:func:`pareto_front`): options within
            ``accuracy_eps`` of accuracy (0.002: 0.2 points) and ``cost_eps`` of every cost of a
            kept one are one step of the search.
        cost_eps: the front's thinning in every cost, relative (0.05: 5%).
        last: the previous decision (set by :meth:`schedule`); when it covers the same apps,
            its assignment is one more start of the search (a warm start). ``None``: none.
    """

    objective: str = "total"
    max_sweeps: int = 20
    pair_candidates: int = 6
    accuracy_eps: float = 0.002
    cost_eps: float = 0.05
    last: JointDecision | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"joint_{self.objective}"

    def schedule(self, apps: Sequence[JointApp], resources: JointResources, *, alpha: float = 0.5) -> JointDecision:
        """Decide every app's configuration for these resources.

        Raises:
            SchedulerError: no apps, duplicate names, ``alpha`` or ``objective`` out of range, or a
                memory budget below the apps' smallest configurations.
        """
        start = time.perf_counter()
        p = _Problem(apps, resources, alpha, self.objective, self.accuracy_eps, self.cost_eps)
        starts = [[int(np.argmin(l[:, 0] + m * 1e-9)) for l, m in zip(p.load, p.memory)],  # lightest
                  [int(np.argmax(-d)) for d in p.deficit]]  # most accurate
        if self.last is not None and [a.app for a in self.last.allocations] == [a.name for a in apps]:
            prev = [index.get(a.option) for index, a in zip(p.index, self.last.allocations)]
            if None not in prev:
                starts.append(prev)
        best, best_key = None, None
        seen: set[tuple[int, ...]] = set()
        for choice in starts:  # single moves from each start: the pair moves' cost is paid once, below
            choice = self._fit(p, list(choice))
            done = self._descend(p, choice, seen, pairs=False)
            if done is not None and (best_key is None or _better(done[1], best_key)):
                best, best_key, keys = done
        best, _, _ = self._descend(p, best, set(), pairs=True, keys=keys)  # the best of them, with pair moves too
        self.last = p.decision(self.name, best, start)
        return self.last

    @staticmethod
    def _fit(p: _Problem, choice: list[int]) -> list[int]:
        """Within the memory budget: move the app that frees the most memory per accuracy point to its
        smallest option until it fits (the lightest start always fits: checked in _Problem)."""
        while not p.fits(choice):
            v = max(range(len(choice)), key=lambda v: p.memory[v][choice[v]] - p.memory[v].min())
            choice[v] = int(np.argmin(p.memory[v] + p.deficit[v] * 1e-6))
        return choice

    def _descend(self, p: _Problem, choice: list[int], seen: set[tuple[int, ...]], pairs: bool = True,
                 keys: list[np.ndarray] | None = None) -> tuple[list[int], np.ndarray, list[np.ndarray]] | None:
        """Moves that improve the objective until none does: one app at a time over its whole front
        (:func:`_single_moves`, a few array operations per app), then (when that is stuck) the best
        move of two apps at once over each one's ``pair_candidates`` best options given the others,
        all pairs in one evaluation, which is what trades memory or load between two apps (only with
        ``pairs``: :meth:`schedule` runs them on the best start's end, not on every start's). Returns
        the assignment, its sort key and each app's single-move keys, or ``None`` when it reaches
        an assignment an earlier start passed through (``seen``, the assignments at the start of each
        pass): the descent is deterministic, so from there it ends where that one did, which is
        already a candidate. ``keys``: the single-move keys of ``choice`` where a descent that
        ended there returned them (no single move helps: it goes on with pair moves at once)."""
        n = len(choice)
        cur = _keys(p, np.asarray(choice, dtype=np.int64)[None, :])[0]
        totals = _totals(p, choice)
        per_app: list[np.ndarray] = list(keys) if keys is not None else [np.empty(0)] * n  # each app's keys
        quiet = n if keys is not None else 0  # apps in a row at their best given the others: n end the singles
        step = 0
        while step < self.max_sweeps * n:
            step += 1
            if quiet >= n:  # no app moved in the last n, so each one's keys are given the others as they are now
                if n < 2 or not pairs:
                    break
                picks = _pair_moves(choice, [_order(k)[:self.pair_candidates] for k in per_app])
                pair_keys = _keys(p, picks)
                best = int(_order(pair_keys)[0])
                if best == 0 or not _better(pair_keys[best], pair_keys[0]):  # row 0 is the current assignment
                    break
                choice, cur, quiet = [int(c) for c in picks[best]], pair_keys[best], 0
                totals = _totals(p, choice)
                continue
            v = (step - 1) % n
            if v == 0:
                state = tuple(choice)
                if state in seen:
                    return None
                seen.add(state)
            row_keys = _single_moves(p, choice, v, totals)
            first = _first(row_keys)
            per_app[v] = row_keys
            # against the current option in the same evaluation: float noise is no improvement
            if first != choice[v] and _better(row_keys[first], row_keys[choice[v]]):
                totals = _moved(p, totals, v, choice[v], first)
                choice[v], cur, quiet = first, row_keys[first], 1  # v is at its best given the others now
            else:
                quiet += 1
        return choice, cur, (per_app if quiet >= n else None)


def _peaks(rho: np.ndarray) -> np.ndarray:
    """(G, 4) slowdown of an app of each resource pattern (see ``_Problem.pattern``) under the loads
    ``rho`` (G, 3): the peak load of the resources it waits on, at least 1."""
    out = np.empty((len(rho), 4))  # filled in place: np.stack's own overhead is this loop's cost
    np.maximum(rho[:, 0], 1.0, out=out[:, 0])
    np.maximum(out[:, 0], rho[:, 1], out=out[:, 1])
    np.maximum(out[:, 0], rho[:, 2], out=out[:, 2])
    np.maximum(out[:, 1], rho[:, 2], out=out[:, 3])
    return out


def _evaluate(p: _Problem, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cost per app (G, n), slowdown per app (G, n), loads (G, 3), memory (G,) and tie-break (G,)
    of each assignment row of ``picks`` (G, n): the one cost model every search and the decision use."""
    rows = p.rows_n[None, :]
    rho = p.s_load[rows, picks].sum(axis=1)  # (G, 3)
    slow = np.take_along_axis(_peaks(rho), p.s_pattern[rows, picks], axis=1)  # (G, n)
    costs = p.s_deficit[rows, picks] + p.alpha * (slow - 1.0)
    return costs, slow, rho, p.s_memory[rows, picks].sum(axis=1), p.s_tie[rows, picks].sum(axis=1)


def _totals(p: _Problem, choice: Sequence[int]) -> tuple[np.ndarray, float, np.ndarray, float, float]:
    """Sums over every app of ``choice``: loads (3,), deficits, apps per resource pattern (4,),
    memory and tie-break; :func:`_single_moves` takes one app's part out of them."""
    c = np.asarray(choice, dtype=np.int64)
    pat = p.s_pattern[p.rows_n, c]
    return (p.s_load[p.rows_n, c].sum(axis=0), float(p.s_deficit[p.rows_n, c].sum()),
            np.bincount(pat, minlength=4).astype(np.float64), float(p.s_memory[p.rows_n, c].sum()),
            float(p.s_tie[p.rows_n, c].sum()))


def _moved(p: _Problem, totals: tuple[np.ndarray, float, np.ndarray, float, float], v: int, old: int,
           new: int) -> tuple[np.ndarray, float, np.ndarray, float, float]:
    """:func:`_totals` after app ``v`` moves from option ``old`` to ``new`` (a few scalar updates)."""
    load, deficit, count, memory, tie = totals
    count = count.copy()
    count[p.pattern[v][old]] -= 1.0
    count[p.pattern[v][new]] += 1.0
    return (load - p.load[v][old] + p.load[v][new], deficit - p.deficit[v][old] + p.deficit[v][new], count,
            memory - p.memory[v][old] + p.memory[v][new], tie - p.tie[v][old] + p.tie[v][new])


def _single_moves(p: _Problem, choice: Sequence[int], v: int,
                  totals: tuple[np.ndarray, float, np.ndarray, float, float] | None = None) -> np.ndarray:
    """Sort keys of ``choice`` with app ``v`` on each option of its front, the others fixed.

    The same cost model as :func:`_evaluate`, by resource pattern: every other app meets the
    slowdown of its pattern, so the others' costs need only their deficits and how many of them
    wait on each pattern - (M, 4) work per app instead of (M, n) gathers. ``totals``
    (:func:`_totals` of ``choice``) saves the sums over the others: this is the search's inner loop,
    and its cost is numpy's per-call overhead, not arithmetic."""
    c = int(choice[v])
    load, deficit_all, count, memory_all, tie_all = _totals(p, choice) if totals is None else totals
    rho = (load - p.load[v][c]) + p.load[v]  # (M, 3)
    peaks = _peaks(rho)  # (M, 4)
    mine = np.take(peaks, p.own_peak[v])  # each option's own slowdown (its pattern's peak)
    others = count.copy()
    others[p.pattern[v][c]] -= 1.0
    # sum of costs: own deficit + alpha (own slowdown - 1) + the others' deficits + alpha (their slowdowns - 1)
    base = (deficit_all - float(p.deficit[v][c])) - p.alpha * (1.0 + float(others.sum()))
    total = p.deficit[v] + p.alpha * (mine + peaks @ others) + base
    if p.objective == "total":
        value = None
    else:  # the worst other app of each pattern is its largest deficit there
        own = p.deficit[v] + p.alpha * (mine - 1.0)
        keep = p.rows_n != v
        on, oc = p.rows_n[keep], np.asarray(choice, dtype=np.int64)[keep]
        worst = np.full(4, -np.inf)
        np.maximum.at(worst, p.s_pattern[on, oc], p.s_deficit[on, oc])
        value = np.maximum(own, (worst + p.alpha * (peaks - 1.0)).max(axis=1)) if len(on) else own
    fits = p.memory[v] <= p.budget - (memory_all - float(p.memory[v][c]))
    tie = (tie_all - p.tie[v][c]) + p.tie[v]
    return _key_rows(value, total, fits, tie)


def _pair_moves(choice: Sequence[int], best_alone: Sequence[np.ndarray]) -> np.ndarray:
    """Assignment rows: ``choice`` itself (row 0), then every pair of apps ``u < v`` set to each
    combination of their ``best_alone`` options."""
    n, k = len(choice), max(len(b) for b in best_alone)
    # each app's candidates padded to k with its best (a repeated row is harmless)
    cand = np.array([np.concatenate([b, np.full(k - len(b), b[0])]) for b in best_alone], dtype=np.int64)
    u, v = np.triu_indices(n, 1)  # (P,) pairs
    i, j = np.divmod(np.arange(k * k), k)  # every combination of the two apps' candidates
    picks = np.tile(np.asarray(choice, dtype=np.int64), (1 + len(u) * k * k, 1))
    rows = 1 + np.arange(len(u) * k * k)
    pu, pv = np.repeat(u, k * k), np.repeat(v, k * k)
    picks[rows, pu] = cand[pu, np.tile(i, len(u))]
    picks[rows, pv] = cand[pv, np.tile(j, len(u))]
    return picks


def _keys(p: _Problem, picks: np.ndarray) -> np.ndarray:
    """Sort keys of the assignment rows of ``picks`` (G, n)."""
    costs, _, _, memory, tie = _evaluate(p, picks)
    return _key_rows(None if p.objective == "total" else costs.max(axis=1), costs.sum(axis=1), memory <= p.budget, tie)


def _key_rows(value: np.ndarray | None, total: np.ndarray, fits: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Sort keys, one row per assignment: the objective (``None``: the sum of costs, MinTotalCost;
    inf over the memory budget, where not ``fits``), then the sum of costs (MinMaxCost: lowers the
    apps below the worst one, which gets single moves off a plateau), then bytes and server time.
    Rounded so that float noise in a sum is no improvement."""
    out = np.empty((len(total), 3))
    np.round(total, 12, out=out[:, 1])
    if value is None:
        out[:, 0] = out[:, 1]
    else:
        np.round(value, 12, out=out[:, 0])
    out[~fits, 0] = np.inf
    out[:, 2] = tie
    return out


def _order(keys: np.ndarray) -> np.ndarray:
    """Row indices of ``keys`` from the best."""
    return np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))


def _first(keys: np.ndarray) -> int:
    """``_order(keys)[0]`` without sorting every row: the rows tied on the objective, if several."""
    tied = np.flatnonzero(keys[:, 0] == keys[:, 0].min())
    if len(tied) == 1:
        return int(tied[0])
    sub = keys[tied]
    return int(tied[np.lexsort((sub[:, 2], sub[:, 1]))[0]])


def _better(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether key row ``a`` sorts before ``b``."""
    return tuple(a.tolist()) < tuple(b.tolist())


@dataclass
class ExactJointScheduler:
    """Every combination of the apps' fronts (small instances): the heuristic's yardstick.

    Args:
        objective: ``"total"`` or ``"max"``.
        max_combinations: refuse larger problems (it exists to check the heuristic offline).
        accuracy_eps: the same thinning as the heuristic's, so that the gap measured is the
            search's; 0 (with ``cost_eps`` 0): the full fronts.
        cost_eps: the heuristic's thinning in every cost, relative.
    """

    objective: str = "total"
    max_combinations: int = 2_000_000
    accuracy_eps: float = 0.002
    cost_eps: float = 0.05

    @property
    def name(self) -> str:
        return f"exact_joint_{self.objective}"

    def schedule(self, apps: Sequence[JointApp], resources: JointResources, *, alpha: float = 0.5) -> JointDecision:
        start = time.perf_counter()
        p = _Problem(apps, resources, alpha, self.objective, self.accuracy_eps, self.cost_eps)
        sizes = [len(f) for f in p.fronts]
        total = math.prod(sizes)
        if total > self.max_combinations:
            raise SchedulerError(f"exact joint solver: {total} combinations of fronts {sizes}, more than "
                                 f"`max_combinations`={self.max_combinations}. HINT: use JointScheduler")
        n = len(sizes)
        rest = np.array(list(itertools.product(*[range(s) for s in sizes[1:]])), dtype=np.int64).reshape(-1, n - 1)
        best_key, best_choice = None, None
        for first in range(sizes[0]):  # one block per option of the first app: memory stays ~ the rest's product
            grid = np.concatenate([np.full((len(rest), 1), first, dtype=np.int64), rest], axis=1)
            keys = _keys(p, grid)
            i = int(_order(keys)[0])
            if best_key is None or _better(keys[i], best_key):
                best_key, best_choice = keys[i], grid[i]
        return p.decision(self.name, [int(c) for c in best_choice], start)


def joint_options(levels: Sequence[Any], *, split_rows: Sequence[dict[str, Any]] = (),
                  split_level: int | None = None) -> tuple[JointOption, ...]:
    """An app's options from what its bundle profiles: every level on the device (no early exit),
    plus every split scheduler row (split x bitwidth x exit operating point, with the device-only
    rows of each operating point) on ``split_level`` (default the largest).

    Args:
        levels: the app's :class:`~nestflex.deploy.scheduler.profile.LevelProfile` rows.
        split_rows: :meth:`~nestflex.deploy.scheduler.split.SplitScheduler.static_rows` of the app's
            split scheduler.
        split_level: the level the split rows were profiled on.
    """
    if not levels:
        raise SchedulerError("`levels` is empty. HINT: AppProfile.from_bundle(...).levels")
    out = [JointOption(level=lv.level, accuracy=float(lv.accuracy), device_ms=float(lv.latency_ms),
                       memory_mb=float(lv.memory_mb)) for lv in levels]
    top = levels[-1] if split_level is None else next((lv for lv in levels if lv.level == split_level), None)
    if split_rows and top is None:
        raise SchedulerError(f"`split_level`={split_level} is not one of the levels {[lv.level for lv in levels]}")
    for r in split_rows:
        if r["accuracy"] is None:
            continue  # unknown accuracy (a bitwidth the profile did not measure): cannot be weighed
        out.append(JointOption(level=top.level, accuracy=float(r["accuracy"]), device_ms=float(r["device_ms"]),
                               memory_mb=float(top.memory_mb), point=r["point"], split=r["split"], bits=r["bits"],
                               sent=float(r["sent"]) if r["split"] is not None else 0.0,
                               bytes=float(r["bytes"]) if r["split"] is not None else 0.0,
                               server_ms=float(r["server_ms"]) if r["split"] is not None else 0.0))
    return tuple(out)
