"""What the engine keeps per app (:class:`App`, its queued :class:`Frame`), how it measures an app on
this device when the app joins (:func:`measure_app`), and the app's row in the engine's stats.

Private to :mod:`nestflex.deploy.engine`: an app's fields are touched only by the engine's worker
thread after registration.
"""

from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.operating_points import ExitPoint
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
from nestflex.deploy.timing import median_ms

__all__ = ["MB", "App", "Frame", "Measured", "measure_app", "app_stats", "row_latency"]

MB = 1e6

#: what :func:`measure_app` keeps per bundle: level latencies (ms), exit latencies (ms), bytes held
#: at each level, bytes the exit set holds
Measured = tuple[list[float], list[float], list[int], int]


@dataclass
class Frame:
    x: np.ndarray  # (1, *shape) float32
    back: Callable[[Any], Any]  # numpy -> the caller's array type
    tag: Any
    seq: int
    arrival: float
    future: Future


@dataclass
class App:
    """Everything the engine keeps per app; touched only by the worker thread after registration."""

    name: str
    bundle: Bundle
    fps: float
    min_accuracy: float | None
    priority: float
    exit_key: str | None
    shape: list[int] = field(default_factory=list)
    plan: Any = None  # the ExecutionPlan both runtimes run (the engine's threads applied)
    runtime: Any = None  # CapacityRuntime
    progressive: Any = None  # ProgressiveRuntime, held while the app runs its largest level with its exit set
    level_ms: list[float] = field(default_factory=list)
    level_mem: list[int] = field(default_factory=list)  # bytes the capacity runtime holds at each level
    exit_ms: list[float] = field(default_factory=list)
    exits_bytes: int = 0  # bytes the exit set's runtime holds (its own sessions), measured
    points: list[ExitPoint] = field(default_factory=list)
    lossless: int | None = None
    accuracy_ref: float | None = None
    level: int = 0
    point: int | None = None
    share: float = 1.0
    queue: deque = field(default_factory=deque)
    # device work a split app owes frames already accepted (a fallback's whole tail, queued by a waiter
    # thread under the engine's lock): callables returning their ms, run before its next frame, never dropped
    jobs: deque = field(default_factory=deque)
    finish: float = 0.0
    seq: int = 0
    joined: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {
        "submitted": 0, "answered": 0, "dropped": 0, "failed": 0, "switches": 0, "page_in_bytes": 0,
        "page_out_bytes": 0})
    latencies: deque = field(default_factory=lambda: deque(maxlen=2048))
    split: Any = None  # _engine_split.SplitApp of an app with a tail server
    joint: Any = None  # (JointApp, option -> RunSpec) when the engine plans with the joint scheduler

    @property
    def period_ms(self) -> float:
        return 1000.0 / self.fps

    @property
    def top(self) -> int:
        return self.bundle.num_levels - 1

    def level_bytes(self, level: int) -> int:
        """What the app holds at ``level``: the capacity runtime there and, at the largest level of
        an app with an exit set, the exit set's runtime (both measured)."""
        exits = self.exits_bytes if level == self.top and self.exit_key is not None else 0
        return self.level_mem[level] + exits

    @property
    def resident_bytes(self) -> int:
        return self.runtime.resident_bytes + (self.progressive.own_bytes if self.progressive is not None else 0)

    def level_accuracy(self, level: int) -> float:
        acc = self.bundle.levels[level].get("accuracy")
        return float(acc) if acc is not None else float("nan")

    def point_ms(self, i: int) -> float:
        p = self.points[i]
        if len(p.exit_rate) == len(self.exit_ms):
            return float(sum(r * ms for r, ms in zip(p.exit_rate, self.exit_ms)))
        return self.exit_ms[-1]  # not calibrated: assume every frame runs to the end

    def point_accuracy(self, i: int) -> float:
        """Expected accuracy at operating point ``i``: the largest level's accuracy moved by the point's
        calibrated gain or loss against the exit set's own final exit (same split, so the difference
        is meaningful even where the two accuracies were measured on different data)."""
        p, base = self.points[i], self.level_accuracy(self.top)
        if p.accuracy is None or self.accuracy_ref is None:
            return base
        return min(1.0, max(0.0, base + p.accuracy - self.accuracy_ref))

    def config_accuracy(self) -> float:
        return self.point_accuracy(self.point) if self.point is not None else self.level_accuracy(self.level)


def row_latency(row: Mapping[str, Any]) -> float | None:
    """A level row's batch-1 latency in ms, ``None`` when the bundle has none."""
    lat = row.get("latency_ms")
    if isinstance(lat, Mapping):
        lat = lat.get("1")
    return float(lat) if isinstance(lat, (int, float)) and lat > 0 else None


def measure_app(app: App, measure: bool, repeats: int, budget: float, total: float, seen: Measured | None) -> Measured | None:
    """Fill ``app``'s memory and batch-1 latency of every level, and what its exit set holds and the
    latency of stopping at each exit, on this device now. Returns what to keep for the next app of
    this bundle, or ``None`` when nothing should be kept.

    Memory is measured, not computed from the weights: the runtime is switched to the level and
    its resident bytes read (an onnxruntime session holds its graph, a few kB more than the
    level's weights; the process's real resident set is reported beside it in the engine's stats);
    an exit set's runtime holds its own sessions, backbone included
    (:attr:`ProgressiveRuntime.own_bytes`), so it is made only while the app runs its largest
    level and counted there. What is measured is made for real, so only what fits in ``budget``
    (the bytes the other apps leave) is: a level whose weights would not is never switched to (its
    memory is its weight bytes times the largest overhead measured, its time scaled from the
    largest timed level by MACs, a lower bound on this CPU corrected by the profiler's slowdown
    factor once the level runs), and an exit set that would not is left out (levels only). With
    ``seen`` (the same bundle and exit set measured before) nothing is made: an app that comes
    back starts at once, with its exits if they fit ``total`` (the whole budget) alone.

    Args:
        app: the joining app, its capacity runtime at level 0.
        measure: time the levels and exits here; if false, use the bundle's ``latency_ms`` rows.
        repeats: timed runs per level and exit.
        budget: bytes this app may hold now (``math.inf``: unlimited).
        total: the whole memory budget in bytes (``math.inf``: unlimited).
        seen: what an earlier call returned for this bundle and exit set, or ``None``.
    """
    rows, rt, top = app.bundle.levels, app.runtime, app.top
    if seen is not None:
        (app.level_ms, app.exit_ms, app.level_mem), app.exits_bytes = (list(v) for v in seen[:3]), seen[3]
        if app.exit_key is not None and app.level_mem[top] + app.exits_bytes > total:
            app.exit_key, app.points, app.exit_ms = None, [], []  # its exits never fit the budget
        return seen
    x = np.random.default_rng(0).standard_normal((1, *app.bundle.input_spec["shape"]), dtype=np.float32)
    app.level_ms, mem = [], []
    macs = [float(r.get("macs") or 0) for r in rows]
    for k in range(app.bundle.num_levels):
        fits = rt.level_bytes(k) <= budget
        if fits:  # its weights fit: switch to it, run a frame, and read what it holds
            rt.set_level(k)
            mem.append(rt.resident_bytes)
        else:
            mem.append(None)
        if not measure:
            app.level_ms.append(float(row_latency(rows[k])))
        elif fits:
            app.level_ms.append(median_ms(lambda: rt(x), repeats))
        else:
            j = len(app.level_ms) - 1  # level 0 always fits: the engine refuses an app whose level 0 does not
            scale = macs[k] / macs[j] if macs[j] > 0 and macs[k] > 0 else 1.0
            app.level_ms.append(app.level_ms[j] * scale)
    overhead = max(m / max(rt.level_bytes(k), 1) for k, m in enumerate(mem) if m is not None)
    app.level_mem = [m if m is not None else math.ceil(rt.level_bytes(k) * overhead) for k, m in enumerate(mem)]
    if app.exit_key is not None and rt.level_bytes(top) <= budget:
        prog = ProgressiveRuntime(app.bundle, rt, exit_set=app.exit_key, plan=app.plan)
        # a frame as the engine serves them, through every exit, opens all that serving holds
        # (sessions open on first use)
        prog(x, thresholds=[1.0] * (prog.num_exits - 1))
        app.exits_bytes = prog.own_bytes
        if app.level_mem[top] + app.exits_bytes <= budget:
            early = prog.num_exits - 1
            for k in range(early + 1):
                # confidence > 0: every frame leaves at exit k, or at the first exit after it the
                # plan keeps (a frame that would leave at an exit the plan dropped, by the exit
                # rates calibrated with every exit, is counted at the next kept one)
                thr = [1.0] * k + [0.0] * (early - k)
                if measure:
                    app.exit_ms.append(median_ms(lambda t=thr: prog(x, thresholds=t), repeats))
                else:
                    ex = app.bundle.exit_sets[app.exit_key]
                    frac = [m / ex["backbone_macs"] for m in ex["macs"]] if ex.get("macs") else [1.0] * (early + 1)
                    app.exit_ms.append(app.level_ms[top] * frac[k])
        del prog  # made again when the app runs its largest level
    rt.set_level(0)
    app.level = 0
    if app.exit_key is not None and not app.exit_ms:
        app.exit_key, app.points = None, []  # the exits do not fit beside the others now: levels only
        return None  # not kept: next time there may be room to measure them
    return list(app.level_ms), list(app.exit_ms), list(app.level_mem), app.exits_bytes


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])


def app_stats(a: App, now: float) -> dict[str, Any]:
    """One app's row of :meth:`Engine.stats`: its configuration, counts, frames/s, latency
    percentiles and what it holds (plain JSON values)."""
    lat = sorted(a.latencies)
    elapsed = max(now - a.joined, 1e-9)
    return {
        "level": a.level, "exit_set": a.exit_key, "point": a.point,
        "thresholds": list(a.points[a.point].thresholds) if a.point is not None else None,
        "share": round(a.share, 4), "fps_goal": a.fps,
        "expected_accuracy": round(a.config_accuracy(), 4),
        # the configuration's time on this device's profile (before the slowdown factor)
        "predicted_ms": round(a.point_ms(a.point) if a.point is not None else a.level_ms[a.level], 4),
        **a.counts, "fps": round(a.counts["answered"] / elapsed, 3),
        "p50_ms": round(_percentile(lat, 50), 4) if lat else None,
        "p95_ms": round(_percentile(lat, 95), 4) if lat else None,
        "resident_bytes": a.resident_bytes,
        # what the scheduler plans with: bytes held at each level, the exit set's included
        "level_bytes": [a.level_bytes(k) for k in range(a.bundle.num_levels)],
        "level_ms": [round(v, 4) for v in a.level_ms], "exit_ms": [round(v, 4) for v in a.exit_ms],
        "split": a.split.stats() if a.split is not None else None,
    }

