"""SPINN/DynO's multi-objective scheduler over ``<split point, exit policy, bitwidth>`` (METHODS §3-4).

Every candidate configuration gets predicted metrics from offline profiles scaled by the online
profiler, then:

1. **hard constraints**, in priority order (e.g. latency SLO, accuracy floor, bytes per frame):
   each removes the candidates that break it; when none survives constraint ``i``, the ones
   that met constraints ``1..i-1`` are kept and the rest become best effort (SPINN's relaxation
   rule): ``Plan.relaxed`` lists them;
2. **soft targets**, lexicographic (e.g. max throughput, then min server time, then max
   accuracy); a candidate stays in the running for target ``i`` when it is within ``tolerance``
   (relative) of the best, so later targets can break near-ties.

Predictions for split ``s``, exit operating point ``p`` (thresholds with calibrated exit rates
``r_k``) and bitwidth ``b``, with ``reach(c)`` the share of frames still running at cut ``c``:

* device time = a fixed cost per frame plus the segments up to ``s``, each weighted by its reach,
  plus the exit heads before ``s``, times the device's slowdown factor (measured online: it also
  absorbs packing and per-frame overheads the profile does not see);
* sent share ``q = reach(s)``; bytes per frame = ``q x bytes(s, b)`` (measured frames);
* network time per sent frame = ``L + 8 bytes / B``; server time = the tail's segments and heads
  (conditional on being sent) / ``server_speedup`` x the server's slowdown factor;
* latency = device + q (network + server); throughput = 1 / latency one frame at a time, or with
  ``depth`` frames in flight min(1 / max(device, q transfer, q server), depth / latency) where
  transfer = 8 bytes / B (DynO: the slowest stage bounds a pipeline, and so does the number of
  frames it holds; the link's delay L is not a stage, frames overlap in it);
* accuracy = the operating point's calibrated accuracy minus ``q`` x the split's quantisation
  drop at ``b`` (float accuracy - accuracy at ``b`` on the split's profile).

``split=None`` is device only (every exit local), :data:`~nestflex.deploy.split.SERVER_ONLY`
sends the input. A Neurosurgeon-style baseline is the same scheduler over float32, no exits.

Examples:
    >>> costs = SplitCosts(cuts=("a", "b"), segment_ms=(4.0, 4.0, 2.0), head_ms={}, exit_at={},
    ...                    split_at={"input": None, "s1": "a", "s2": "b"}, num_exits=1)
    >>> bytes_ = {("input", None): 4000, ("s1", None): 40000, ("s2", None): 2000}
    >>> sched = SplitScheduler(costs, bytes_, points=[None], bits=(None,), server_speedup=4.0, depth=4)
    >>> plan = sched.plan(bandwidth_mbps=8.0, latency_ms=5.0)  # 4 frames in flight: the link's rate binds
    >>> plan.option.split, round(plan.option.throughput_fps, 1), round(plan.option.latency_ms, 2)
    ('input', 250.0, 11.5)
    >>> SplitScheduler(costs, bytes_, [None], bits=(None,), server_speedup=4.0).plan(  # one at a time
    ...     bandwidth_mbps=8.0, latency_ms=5.0).option.split is None  # device only: 10 ms beats 11.5 ms
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from nestflex.deploy.scheduler.errors import SchedulerError

__all__ = ["SplitCosts", "SplitOption", "SplitPlan", "SplitScheduler", "METRICS", "DEFAULT_TARGETS"]

#: metrics a constraint or target may name, and whether larger is better
METRICS = {"latency_ms": False, "throughput_fps": True, "accuracy": True, "bytes": False, "server_ms": False,
           "device_ms": False}
#: SPINN's usual soft targets: throughput first, then server cost, then accuracy
DEFAULT_TARGETS: tuple[tuple[str, str], ...] = (("throughput_fps", "max"), ("server_ms", "min"), ("accuracy", "max"))


@dataclass(frozen=True)
class SplitCosts:
    """Offline per-segment latencies of the largest level, cut at every exit tap and split node.

    Attributes:
        cuts: node names in execution order; segment ``i`` ends at ``cuts[i]`` (the last one at the output).
        segment_ms: ``len(cuts) + 1`` times (ms, batch 1).
        head_ms: exit index -> its head's time.
        exit_at: cut node -> the exit whose tap it is.
        split_at: split name -> its node (``None`` for the server-only split).
        num_exits: exits including the final one (1: no exit set).
        frame_ms: the device's fixed cost per frame, whatever the split (input checks, the exit
            policy's bookkeeping, packing a small frame).
    """

    cuts: tuple[str, ...]
    segment_ms: tuple[float, ...]
    head_ms: Mapping[int, float]
    exit_at: Mapping[str, int]
    split_at: Mapping[str, str | None]
    num_exits: int
    frame_ms: float = 0.0

    def __post_init__(self) -> None:
        if len(self.segment_ms) != len(self.cuts) + 1:
            raise SchedulerError(f"`segment_ms` needs one time per segment ({len(self.cuts) + 1}), got "
                                 f"{len(self.segment_ms)}")
        for name, node in self.split_at.items():
            if node is not None and node not in self.cuts:
                raise SchedulerError(f"split {name!r} cuts at node {node!r}, which is not in `cuts`")

    def position(self, split: str | None) -> int:
        """How many segments run before the cut of ``split`` (device only: all of them)."""
        if split is None:
            return len(self.segment_ms)
        node = self.split_at[split]
        return 0 if node is None else self.cuts.index(node) + 1

    def to_json(self) -> dict[str, Any]:
        return {"cuts": list(self.cuts), "segment_ms": list(self.segment_ms),
                "head_ms": {str(k): v for k, v in self.head_ms.items()}, "exit_at": dict(self.exit_at),
                "split_at": dict(self.split_at), "num_exits": self.num_exits, "frame_ms": self.frame_ms}


@dataclass(frozen=True)
class SplitOption:
    """One candidate configuration and its predicted metrics (per frame).

    ``point`` indexes the scheduler's operating points (``None``: no exits); ``thresholds`` are its thresholds.
    """

    split: str | None
    bits: int | None
    point: int | None
    thresholds: tuple[float, ...] | None
    device_ms: float
    network_ms: float
    server_ms: float
    sent: float
    bytes: float
    latency_ms: float
    throughput_fps: float
    accuracy: float | None

    def metric(self, name: str) -> float | None:
        return getattr(self, name)


@dataclass(frozen=True)
class SplitPlan:
    """The scheduler's choice.

    Attributes:
        option: the chosen :class:`SplitOption`.
        candidates: how many configurations were scored.
        feasible: how many of them met every hard constraint.
        relaxed: hard constraints that no candidate could meet together with the earlier ones.
        inputs: bandwidth, latency and slowdowns the plan was made for.
        decision_ms: time the plan took.
    """

    option: SplitOption
    candidates: int
    feasible: int
    relaxed: tuple[str, ...]
    inputs: dict[str, float]
    decision_ms: float

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "option": asdict(self.option)}


def _check_rules(constraints: Sequence[tuple[str, str, float]], targets: Sequence[tuple[str, str]]) -> None:
    for c in constraints:
        if len(c) != 3 or c[0] not in METRICS or c[1] not in ("<=", ">=") or not isinstance(c[2], (int, float)):
            raise SchedulerError(f"a constraint is (metric, '<=' or '>=', number) with a metric in "
                                 f"{', '.join(METRICS)}, got {c!r}")
    for t in targets:
        if len(t) != 2 or t[0] not in METRICS or t[1] not in ("min", "max"):
            raise SchedulerError(f"a target is (metric, 'min' or 'max') with a metric in {', '.join(METRICS)}, got {t!r}")


class SplitScheduler:
    """Chooses split point, exit operating point and bitwidth for one app.

    Args:
        costs: the device's :class:`SplitCosts` (measure with :func:`nestflex.deploy.split.measure_costs`).
        frame_bytes: ``(split, bits) -> bytes`` of one request frame (measured on sample inputs,
            :func:`nestflex.deploy.split.measure_bytes`; ``bits=None`` is float32).
        points: exit operating points (objects with ``thresholds``, ``accuracy``, ``exit_rate``;
            :func:`nestflex.deploy.engine.operating_points`), or ``[None]`` for no exits.
        accuracy_drop: ``(split, bits) -> points lost by quantising that split`` (0 for float);
            a missing entry makes the pair unusable under an accuracy constraint.
        base_accuracy: accuracy without exits (for ``points=[None]``), or ``None``.
        bits: bitwidths to consider (``None`` = float32).
        splits: splits to consider (default: every split in ``costs`` and device only).
        constraints: hard constraints in priority order, e.g. ``[("latency_ms", "<=", 50),
            ("accuracy", ">=", 0.97)]``.
        targets: lexicographic soft targets (default :data:`DEFAULT_TARGETS`).
        tolerance: relative slack within which candidates tie on a target.
        depth: frames in flight (1: one at a time; more: pipelined, DynO), as the device's
            :meth:`~nestflex.deploy.split.offload.Offloader.stream` runs them.
        server_speedup: how much faster the server runs the same segments than this device.
        replan_threshold: :meth:`needs_replan` fires when an input moves by more than this share.
    """

    def __init__(self, costs: SplitCosts, frame_bytes: Mapping[tuple[str, int | None], float],
                 points: Sequence[Any] = (None,), *, accuracy_drop: Mapping[tuple[str, int | None], float] | None = None,
                 base_accuracy: float | None = None, bits: Sequence[int | None] = (None, 8),
                 splits: Sequence[str | None] | None = None,
                 constraints: Sequence[tuple[str, str, float]] = (),
                 targets: Sequence[tuple[str, str]] = DEFAULT_TARGETS, tolerance: float = 0.01,
                 depth: int = 1, server_speedup: float = 1.0, replan_threshold: float = 0.05) -> None:
        _check_rules(constraints, targets)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise SchedulerError(f"`depth` must be an int >= 1 (frames in flight), got {depth!r}")
        if not points:
            raise SchedulerError("`points` must hold at least one operating point (or None for no exits)")
        for name, v in (("server_speedup", server_speedup), ("tolerance", tolerance + 1),
                        ("replan_threshold", replan_threshold + 1)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SchedulerError(f"`{name}` must be a positive number, got {v!r}")
        self.costs, self.frame_bytes, self.points = costs, dict(frame_bytes), list(points)
        self.accuracy_drop = dict(accuracy_drop or {})
        self.base_accuracy = base_accuracy
        self.bits = tuple(bits)
        self.splits = list(splits) if splits is not None else [None, *costs.split_at]
        self.constraints, self.targets = list(constraints), list(targets)
        self.tolerance, self.depth, self.server_speedup = tolerance, depth, float(server_speedup)
        self.replan_threshold = replan_threshold
        self.last: SplitPlan | None = None
        self._build_table()
        self._index = {k: i for i, k in enumerate(self._keys)}

    # -- prediction ----------------------------------------------------------------------------
    # Everything that does not depend on the live inputs (bandwidth, latency, slowdowns) is computed
    # once per candidate in __init__ (`_table`); a plan is then a few numpy operations over all
    # candidates: ~0.1 ms instead of tens of ms of Python per re-plan on the device's thread.

    def _reach(self, point: Any) -> list[float]:
        """Share of frames still running at the start of each segment (and, last, past the end)."""
        c = self.costs
        rates = tuple(point.exit_rate) if point is not None and point.exit_rate else ()
        out, left = [], 1.0
        for i in range(len(c.segment_ms)):
            out.append(max(0.0, left))
            if i < len(c.cuts) and c.cuts[i] in c.exit_at and rates:
                left -= rates[c.exit_at[c.cuts[i]]]
        return out

    def _static(self, split: str | None, bits: int | None, point_index: int | None) -> tuple | None:
        """(device work, sent share, frame bytes, server work per frame sent, accuracy) at unit inputs."""
        c = self.costs
        point = self.points[point_index] if point_index is not None else None
        reach = self._reach(point)
        at = c.position(split)

        def work(lo: int, hi: int) -> float:
            ms = 0.0
            for i in range(lo, hi):
                ms += reach[i] * c.segment_ms[i]
                cut = c.cuts[i] if i < len(c.cuts) else None
                if point is not None and cut in c.exit_at:
                    ms += reach[i] * c.head_ms.get(c.exit_at[cut], 0.0)
            return ms

        device = c.frame_ms + work(0, at)
        if split is None:
            sent, size, server = 0.0, 0.0, 0.0
        else:
            size = self.frame_bytes.get((split, bits))
            if size is None:
                return None
            sent = reach[at] if at < len(reach) else 0.0
            server = work(at, len(c.segment_ms)) / sent if sent > 0 else 0.0
        accuracy = point.accuracy if point is not None else self.base_accuracy
        if accuracy is not None and split is not None:
            drop = 0.0 if bits is None else self.accuracy_drop.get((split, bits))
            accuracy = None if drop is None else accuracy - sent * drop
        return device, sent, float(size), server, math.nan if accuracy is None else float(accuracy)

    def _build_table(self) -> None:
        keys, rows = [], []
        for split in self.splits:
            for bits in ([None] if split is None else self.bits):
                for k in range(len(self.points)):
                    pk = k if self.points[k] is not None else None
                    row = self._static(split, bits, pk)
                    if row is not None:
                        keys.append((split, bits, pk))
                        rows.append(row)
        self._keys = keys
        t = np.array(rows, dtype=np.float64).reshape(-1, 5)
        self._device, self._sent, self._size, self._server, self._accuracy = t.T

    def _metrics(self, bandwidth_mbps: float, latency_ms: float, device_slowdown: float = 1.0,
                 server_slowdown: float = 1.0) -> dict[str, np.ndarray]:
        sent = self._sent
        device = self._device * device_slowdown
        transfer = np.where(sent > 0, 8 * self._size / (max(bandwidth_mbps, 1e-9) * 1000), 0.0)
        net = np.where(sent > 0, latency_ms + transfer, 0.0)
        server = self._server / self.server_speedup * server_slowdown
        latency = device + sent * (net + server)
        with np.errstate(divide="ignore"):
            if self.depth == 1:
                throughput = np.where(latency > 0, 1000.0 / latency, np.inf)
            else:  # the delay L is no stage: frames overlap in it
                slowest = np.maximum(device, np.maximum(sent * transfer, sent * server))
                throughput = np.minimum(np.where(slowest > 0, 1000.0 / slowest, np.inf),
                                        np.where(latency > 0, self.depth * 1000.0 / latency, np.inf))
        return {"device_ms": device, "network_ms": net, "server_ms": server, "sent": sent,
                "bytes": sent * self._size, "latency_ms": latency, "throughput_fps": throughput,
                "accuracy": self._accuracy}

    def _option(self, i: int, m: Mapping[str, np.ndarray]) -> SplitOption:
        split, bits, pk = self._keys[i]
        acc = float(m["accuracy"][i])
        return SplitOption(split, bits, pk, tuple(self.points[pk].thresholds) if pk is not None else None,
                           float(m["device_ms"][i]), float(m["network_ms"][i]), float(m["server_ms"][i]),
                           float(m["sent"][i]), float(m["bytes"][i]), float(m["latency_ms"][i]),
                           float(m["throughput_fps"][i]), None if math.isnan(acc) else acc)

    def predict(self, split: str | None, bits: int | None, point_index: int | None, *, bandwidth_mbps: float,
                latency_ms: float, device_slowdown: float = 1.0, server_slowdown: float = 1.0) -> SplitOption | None:
        """Predicted metrics of one configuration, or ``None`` when it cannot run (no bytes measured)."""
        key = (split, None if split is None else bits, point_index)
        if key not in self._index:
            return None
        m = self._metrics(bandwidth_mbps, latency_ms, device_slowdown, server_slowdown)
        return self._option(self._index[key], m)

    def static_rows(self) -> list[dict[str, Any]]:
        """Every candidate's per-frame costs that do not depend on the live inputs: ``split``,
        ``bits``, ``point``, ``device_ms`` (at the device's profiled speed), ``sent`` (share of
        frames sent), ``bytes`` and ``server_ms`` per frame (times ``sent``; the server's time
        divided by ``server_speedup``) and ``accuracy`` (``None`` when unknown): what the joint
        scheduler (:mod:`nestflex.deploy.scheduler.joint`) weighs across apps."""
        rows = []
        for i, (split, bits, point) in enumerate(self._keys):
            acc = float(self._accuracy[i])
            rows.append({"split": split, "bits": bits, "point": point, "device_ms": float(self._device[i]),
                         "sent": float(self._sent[i]), "bytes": float(self._sent[i] * self._size[i]),
                         "server_ms": float(self._sent[i] * self._server[i] / self.server_speedup),
                         "accuracy": None if math.isnan(acc) else acc})
        return rows

    def options(self, **inputs: float) -> list[SplitOption]:
        """Every candidate's prediction."""
        m = self._metrics(**inputs)
        return [self._option(i, m) for i in range(len(self._keys))]

    # -- choice --------------------------------------------------------------------------------

    def plan(self, *, bandwidth_mbps: float, latency_ms: float, device_slowdown: float = 1.0,
             server_slowdown: float = 1.0) -> SplitPlan:
        """Choose a configuration for these network and load conditions.

        Raises:
            SchedulerError: no candidate can run (no measured frame bytes for any split).
        """
        start = time.perf_counter()
        inputs = {"bandwidth_mbps": float(bandwidth_mbps), "latency_ms": float(latency_ms),
                  "device_slowdown": float(device_slowdown), "server_slowdown": float(server_slowdown)}
        if not self._keys:
            raise SchedulerError("no configuration can be predicted: `frame_bytes` has no entry for the splits and "
                                 "bitwidths considered. HINT: measure them with nestflex.deploy.split.measure_bytes")
        m = self._metrics(**inputs)
        alive = np.ones(len(self._keys), dtype=bool)
        relaxed = []
        for name, op, bound in self.constraints:
            v = m[name]
            with np.errstate(invalid="ignore"):
                ok = (v <= bound) if op == "<=" else (v >= bound)  # NaN (unknown accuracy) never meets
            if (alive & ok).any():
                alive &= ok
            else:  # SPINN: keep what met the earlier constraints; this one becomes best effort
                relaxed.append(f"{name} {op} {bound}")
        feasible = int(alive.sum()) if not relaxed else 0
        # best effort on relaxed constraints: get as close as possible first
        rules = [(c[0], "min" if c[1] == "<=" else "max") for c in self.constraints
                 if f"{c[0]} {c[1]} {c[2]}" in relaxed] + list(self.targets)
        for metric, sense in rules:
            v = np.where(alive, m[metric], np.nan)
            if np.isnan(v).all():
                continue
            best = np.nanmax(v) if sense == "max" else np.nanmin(v)
            slack = self.tolerance * abs(best) if math.isfinite(best) else 0.0
            with np.errstate(invalid="ignore"):
                alive &= (v >= best - slack) if sense == "max" else (v <= best + slack)
        choice = self._option(int(np.flatnonzero(alive)[0]), m)
        plan = SplitPlan(choice, len(self._keys), feasible, tuple(relaxed), inputs, (time.perf_counter() - start) * 1000)
        self.last = plan
        return plan

    def needs_replan(self, **inputs: float) -> bool:
        """True before the first plan, or when any input moved more than ``replan_threshold`` since it."""
        if self.last is None:
            return True
        for k, v in inputs.items():
            old = self.last.inputs.get(k)
            if old is None or v is None:
                continue
            if abs(v - old) > self.replan_threshold * max(abs(old), 1e-9):
                return True
        return False

