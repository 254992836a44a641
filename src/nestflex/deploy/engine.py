"""The device engine: several apps, each a bundle, served live on one device under a scheduler.

This is the object that joins the deploy parts (METHODS §1.5-1.6, §2, §3): apps register with a
bundle and goals, frames are submitted (one call, or a paced stream), a single worker thread runs
them on each app's runtime, the :class:`~nestflex.deploy.profiler.OnlineProfiler` measures every
frame, and the scheduler's decisions are applied live, between frames:

* **level**: :meth:`CapacityRuntime.set_level` on a runtime that holds one level at a time
  (``keep="active"``: an onnxruntime level's session is built from the graph cached beside the
  bundle, an eager level pages only the delta); downgrades are applied before upgrades, so
  resident bytes never exceed the memory budget in between;
* **exit set and threshold** (SPINN/FlexDNN): at the largest level an app with a shared exit set
  runs batched early exit at an *operating point* from the bundle's calibration (the threshold
  sweep of ``exits``, the ``operating_points`` of ``flex_exits``): the most accurate point whose
  predicted mean latency fits the compute the app was given (FlexDNN's runtime adaptation). The
  exit set's runtime is made when the app reaches its largest level and released when it leaves
  it: on onnxruntime it holds its own sessions, backbone included;
* **compute share**: start-time fair queueing of frames. Every app has a virtual finish time that
  advances by ``compute_ms / share`` per frame it runs; the worker always runs the backlogged app
  with the earliest start tag. When every app is backlogged each gets its share of the worker's
  time; an idle app's share goes to the others (work-conserving). A frame superseded by a newer
  frame of its app, or older than ``max_delay_periods`` frame periods, is dropped (a camera
  wants the newest frame; a dropped frame counts as not answered);
* **CPU budget**: ``cpu < 1`` duty-cycles the worker (after a frame of ``t`` ms it idles
  ``t (1 / cpu - 1)`` ms), the way a CPU quota does, and the scheduler plans with every latency
  divided by ``cpu``;
* **memory budget**: the sum of every app's resident bytes (its level's session or paged weights,
  plus its exit set's sessions at the largest level, each measured when the app joins) stays
  within ``memory_mb``; schedulers that do not plan memory (the status quo) are enforced
  after the fact by demoting the lowest-priority app one level at a time (every app fits at
  level 0: a budget below that is refused when it is set).

Re-planning happens on events: an app joins or leaves, a budget changes, or the profiler's
slowdown factor drifts by more than ``replan_drift`` from the value the last plan used (another
process took a core). Schedulers are the registry's (:func:`~nestflex.deploy.scheduler.get_scheduler`):
``greedy_*``, ``cached_*``, ``exact_*``, ``knee`` (the status quo), ``fixed`` (levels frozen)
and ``flexdnn`` (largest level, thresholds adapted).

Frames are numpy float32 arrays (a torch tensor is accepted too, and its answer's logits come
back as a tensor); the runtimes run on onnxruntime unless a plan says otherwise, so the engine
needs no torch.

Example::

    import numpy as np, nestflex.deploy as nd
    with nd.Engine(scheduler="greedy_total", memory_mb=8.0) as engine:
        engine.add_app("cam", "runs/vgg_cifar/bundle.nfx", fps=30, min_accuracy=0.85)
        result = engine.infer("cam", np.random.default_rng(0).standard_normal((3, 32, 32), dtype=np.float32))
        result.prediction, result.level, result.latency_ms
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from nestflex.deploy._arrays import as_numpy, is_torch
from nestflex.deploy._memory import rss_bytes
from nestflex.deploy.backends.plan import ExecutionPlan
from nestflex.deploy.bundle.loader import Bundle, load
from nestflex.deploy.profiler import OnlineProfiler
from nestflex.deploy.runtime.capacity import CapacityRuntime, resolve_plan
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
from nestflex.deploy.scheduler import AppProfile, Decision, Scheduler, SchedulerError, get_scheduler
from nestflex.deploy.timing import median_ms
from nestflex.errors import NestflexError

__all__ = ["EngineError", "ExitPoint", "FrameResult", "Engine", "operating_points"]

_MB = 1e6


class EngineError(NestflexError, ValueError):
    """An engine call names an unknown app, gives a bad frame or goal, or a budget no app fits."""


@dataclass(frozen=True)
class ExitPoint:
    """One threshold setting of an exit set, from the bundle's calibration.

    Attributes:
        thresholds: one per early exit.
        accuracy: accuracy at these thresholds on the calibration split.
        exit_rate: share of frames leaving at each exit (final last); empty when not calibrated.
        mean_macs_fraction: mean MACs as a fraction of the backbone's (``None`` if unknown).
    """

    thresholds: tuple[float, ...]
    accuracy: float | None
    exit_rate: tuple[float, ...] = ()
    mean_macs_fraction: float | None = None


@dataclass(slots=True)
class FrameResult:
    """The engine's answer for one frame.

    Attributes:
        app: the app it belongs to.
        seq: per-app sequence number (submission order).
        tag: whatever the caller passed with the frame (e.g. a label), returned untouched.
        prediction: arg-max class, ``None`` when the frame was dropped.
        logits: ``(C,)`` float32 logits in the frame's array type (numpy; a torch tensor for a
            torch frame), ``None`` when dropped.
        level: capacity level that ran it.
        exit: exit index it left at (``None``: the exit set was not in use).
        latency_ms: submission to answer.
        compute_ms: time on the runtime.
        dropped: the engine dropped it (``reason`` says why).
        reason: ``"superseded"``, ``"late"``, ``"queue_full"`` or ``"closed"``.

    Not frozen: one is built per frame, and a frozen dataclass's ``__init__`` costs several times
    more (``object.__setattr__`` per field); treat it as read-only.
    """

    app: str
    seq: int
    tag: Any
    prediction: int | None
    logits: Any
    level: int | None
    exit: int | None
    latency_ms: float
    compute_ms: float
    dropped: bool = False
    reason: str | None = None

    @property
    def answered(self) -> bool:
        return not self.dropped


@dataclass
class _Frame:
    x: np.ndarray  # (1, *shape) float32
    back: Callable[[Any], Any]  # numpy -> the caller's array type
    tag: Any
    seq: int
    arrival: float
    future: Future


@dataclass
class _App:
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
    finish: float = 0.0
    seq: int = 0
    joined: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {
        "submitted": 0, "answered": 0, "dropped": 0, "failed": 0, "switches": 0, "page_in_bytes": 0,
        "page_out_bytes": 0})
    latencies: deque = field(default_factory=lambda: deque(maxlen=2048))

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


# ------------------------------------------------------------------------------------------------
# the bundle's operating points


def _pareto(points: list[ExitPoint]) -> list[ExitPoint]:
    """Points no other point beats on both mean MACs and accuracy, cheapest first."""
    key = [(p.mean_macs_fraction if p.mean_macs_fraction is not None else 1.0, -(p.accuracy or 0.0)) for p in points]
    order = sorted(range(len(points)), key=lambda i: key[i])
    out, best = [], -1.0
    for i in order:
        acc = points[i].accuracy if points[i].accuracy is not None else 0.0
        if acc > best:
            out.append(points[i])
            best = acc
    return out


def _point(row: Mapping[str, Any], early: int) -> ExitPoint | None:
    thr = row.get("thresholds", row.get("threshold"))
    if isinstance(thr, (int, float)) and not isinstance(thr, bool):
        thr = [float(thr)] * early
    if not isinstance(thr, list) or len(thr) != early:
        return None
    rate = row.get("exit_rate")
    rate = tuple(float(r) for r in rate) if isinstance(rate, list) and len(rate) == early + 1 else ()
    acc = row.get("accuracy")
    frac = row.get("mean_macs_fraction", row.get("macs_fraction"))
    return ExitPoint(tuple(float(t) for t in thr), float(acc) if acc is not None else None, rate,
                          float(frac) if frac is not None else None)


def operating_points(bundle: Bundle, exit_key: str) -> tuple[list[ExitPoint], int, float | None]:
    """The operating points of one exit set, cheapest first, with the index of the shipped
    (lossless) thresholds among them and the set's final-exit accuracy on the calibration split.

    SPINN/SDN exits (``exits``) read the threshold sweep of ``profiles/exit_calibration.json`` and
    the lossless thresholds; FlexDNN exits (``flex_exits``) read ``operating_points``. Without a
    calibration the only point is the shipped thresholds (accuracy unknown).
    """
    ex = bundle.exit_sets[exit_key]
    early = len(ex["names"]) - 1
    rows: list[Mapping[str, Any]] = list(ex.get("operating_points") or [])
    ref = None
    cal = ex.get("calibration") or {}
    if exit_key == "exits" and cal.get("file") and cal["file"] in bundle.manifest.get("files", {}):
        import json

        report = json.loads(bundle.file(cal["file"]).read_text(encoding="utf-8"))
        rows += [r for r in report.get("sweep", []) if isinstance(r, Mapping)]
        ref = report.get("final_accuracy")
    lossless_row = dict(cal.get("lossless") or {}) if exit_key == "exits" else dict(cal)
    lossless_row["thresholds"] = list(ex["thresholds"])
    if ref is None:
        ref = cal.get("final_accuracy")
    shipped = _point(lossless_row, early)
    points = [p for p in (_point(r, early) for r in rows) if p is not None]
    points = _pareto(points + ([shipped] if shipped is not None else []))
    if shipped is not None and shipped not in points:  # dominated on calibration, but it is the default
        points.append(shipped)
        points.sort(key=lambda p: p.mean_macs_fraction if p.mean_macs_fraction is not None else 1.0)
    lossless = points.index(shipped) if shipped is not None else len(points) - 1
    if ref is None:
        accs = [p.accuracy for p in points if p.accuracy is not None]
        ref = max(accs) if accs else None
    return points, lossless, (float(ref) if ref is not None else None)


# ------------------------------------------------------------------------------------------------
# the engine


class Engine:
    """Serves several apps on one device, adapting each app's configuration as resources change.

    Args:
        scheduler: a registered scheduler name or a :class:`~nestflex.deploy.scheduler.Scheduler`
            (``knee`` is the status quo: fixed knee level, equal shares, memory not planned).
        memory_mb: memory budget for all apps' resident bytes (``None``: unlimited).
        cpu: share of the device the apps may use, in (0, 1].
        alpha: the scheduler's latency weight.
        unit: the scheduler's compute unit.
        threads: intra-op threads of every level and exit set the engine runs: it replaces the
            thread counts of the app's execution plan (the one ``nestflex tune`` stored beside the
            bundle, else onnxruntime everywhere), the backends stay the plan's (``None``: the
            plan's own counts). One by default, as in the runtimes' default plan: the worker runs
            one frame at a time, and several apps share the device's cores between their frames.
        adapt_exits: choose each app's exit operating point for the compute it gets (FlexDNN); if
            false, exit sets run at their shipped (lossless) thresholds.
        replan_drift: re-plan when the device slowdown moves by more than this fraction.
        min_replan_s: at most one drift-triggered re-plan per this many seconds.
        max_delay_periods: a queued frame older than this many of its app's frame periods is dropped.
        max_pending: frames queued per app before the oldest is dropped.
        profiler: an :class:`OnlineProfiler` (a new one with a 32-frame window if ``None``).

    Raises:
        EngineError: an argument out of range; SchedulerError for an unknown scheduler name.
    """

    def __init__(
        self,
        scheduler: str | Scheduler = "greedy_total",
        *,
        memory_mb: float | None = None,
        cpu: float = 1.0,
        alpha: float = 0.5,
        unit: float = 0.01,
        threads: int | None = 1,
        adapt_exits: bool = True,
        replan_drift: float = 0.25,
        min_replan_s: float = 0.25,
        max_delay_periods: float = 2.0,
        max_pending: int = 4,
        profiler: OnlineProfiler | None = None,
    ) -> None:
        self.scheduler = get_scheduler(scheduler)
        self._check_budget(memory_mb, cpu)
        for arg, value, ok in (("alpha", alpha, 0 <= alpha <= 1), ("unit", unit, 0 < unit <= 1),
                               ("replan_drift", replan_drift, replan_drift > 0),
                               ("min_replan_s", min_replan_s, min_replan_s >= 0),
                               ("max_delay_periods", max_delay_periods, max_delay_periods > 0)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not ok:
                raise EngineError(f"`{arg}` is out of range: {value!r}. HINT: see nestflex.deploy.Engine's docstring")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise EngineError(f"`max_pending` must be an int >= 1, got {max_pending!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise EngineError(f"`threads` must be None or an int >= 1, got {threads!r}")
        self.memory_mb, self.cpu, self.alpha, self.unit = memory_mb, float(cpu), float(alpha), float(unit)
        self.threads, self.adapt_exits = threads, bool(adapt_exits)
        self.replan_drift, self.min_replan_s = float(replan_drift), float(min_replan_s)
        self.max_delay_periods, self.max_pending = float(max_delay_periods), max_pending
        self.profiler = profiler if profiler is not None else OnlineProfiler()
        self.decision: Decision | None = None
        self.plans: deque[dict[str, Any]] = deque(maxlen=256)
        self._apps: dict[str, _App] = {}
        # device profiles of the bundles seen, so an app that comes back is not timed again
        self._profiles_seen: dict[tuple[str, str | None, bool], tuple[list[float], list[float], list[int], int]] = {}
        self._controls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._vclock = 0.0
        self._plan_slowdown = 1.0
        self._last_plan = 0.0
        self._t0 = time.perf_counter()
        self._rss0 = rss_bytes()  # the process before any app: what the apps add is measured from here
        self._worker = threading.Thread(target=self._run, name="nestflex-engine", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ public API
    def add_app(
        self,
        name: str,
        bundle: str | os.PathLike | Bundle,
        *,
        fps: float = 30.0,
        min_accuracy: float | None = None,
        priority: float = 1.0,
        exit_set: str | None = "auto",
        profile: bool = True,
        profile_repeats: int = 5,
    ) -> dict[str, Any]:
        """Register an app and re-plan; returns its :meth:`stats` row.

        Args:
            name: unique app name.
            bundle: a loaded bundle or its path.
            fps: the app's frame rate; its latency goal is one frame period.
            min_accuracy: the accuracy goal A_min in [0, 1] (``None``: the best level's accuracy).
            priority: > 0; under memory pressure lower priorities are demoted first.
            exit_set: ``"auto"`` (a shared-backbone exit set if the bundle has one: FlexDNN's first,
                else SPINN's), ``"exits"``, ``"flex_exits"``, or ``None`` (levels only).
            profile: time every level and exit here, on this device, before planning (batch 1,
                ``profile_repeats`` runs each); if false, use the bundle's ``latency_ms`` rows.
            profile_repeats: timed runs per level and exit.

        Raises:
            EngineError: a duplicate name, a bad goal, a bundle that fails to load or has no level
                accuracies, an exit set it cannot use, or a memory budget this app does not fit in.
        """
        if not isinstance(name, str) or not name:
            raise EngineError(f"app `name` must be a non-empty string, got {name!r}")
        for arg, value, ok in (("fps", fps, fps > 0), ("priority", priority, priority > 0)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not ok:
                raise EngineError(f"app {name!r}: `{arg}` must be a finite number > 0, got {value!r}")
        if min_accuracy is not None and not (isinstance(min_accuracy, (int, float)) and 0 <= min_accuracy <= 1):
            raise EngineError(f"app {name!r}: `min_accuracy` must be in [0, 1] (a fraction), got {min_accuracy!r}")
        if isinstance(profile_repeats, bool) or not isinstance(profile_repeats, int) or profile_repeats < 1:
            raise EngineError(f"app {name!r}: `profile_repeats` must be an int >= 1, got {profile_repeats!r}")
        try:
            b = bundle if isinstance(bundle, Bundle) else load(bundle)
        except NestflexError as e:
            raise EngineError(f"app {name!r}: its bundle failed to load: {e}") from e
        missing = [r.get("level") for r in b.levels if r.get("accuracy") is None]
        if missing:
            raise EngineError(f"app {name!r}: bundle {str(b.path)!r} has no accuracy for levels {missing}, so no "
                              f"scheduler can trade accuracy for time. HINT: export it with "
                              f"levels=profile_levels(model, test_loader) (the recipe's export stage does)")
        if not profile and any(_row_latency(r) is None for r in b.levels):
            raise EngineError(f"app {name!r}: bundle {str(b.path)!r} has no batch-1 latency per level. "
                              f"HINT: pass profile=True to time the levels on this device")
        app = _App(name, b, float(fps), min_accuracy, float(priority), _choose_exit_set(name, b, exit_set),
                   [int(v) for v in b.input_spec["shape"]])
        return self._control(lambda: self._join(app, profile, profile_repeats))

    def remove_app(self, name: str) -> None:
        """Unregister ``name``: its queued frames are dropped (reason ``"closed"``), its runtimes
        released, and the others re-planned.

        Raises:
            EngineError: no such app.
        """
        self._app(name)
        self._control(lambda: self._leave(name))

    def set_budget(self, *, memory_mb: float | None | str = "keep", cpu: float | None = None) -> Decision | None:
        """Change the memory budget (MB; ``None``: unlimited) and/or the CPU share, and re-plan.

        Raises:
            EngineError: a budget out of range, or a memory budget below every app's smallest level
                (the message names the apps).
        """
        mem = self.memory_mb if memory_mb == "keep" else memory_mb
        new_cpu = self.cpu if cpu is None else cpu
        self._check_budget(mem, new_cpu)

        def apply() -> Decision | None:
            smallest = sum(a.level_bytes(0) for a in self._apps.values()) / _MB
            if mem is not None and self._apps and smallest > mem:
                raise EngineError(self._budget_message(mem, list(self._apps.values())))
            self.memory_mb, self.cpu = mem, float(new_cpu)
            return self._plan("budget")

        return self._control(apply)

    def replan(self) -> Decision | None:
        """Re-plan now (the engine also does on every event)."""
        return self._control(lambda: self._plan("request"))

    def submit(self, name: str, frame: Any, tag: Any = None) -> Future:
        """Queue one frame of app ``name``; returns a future of its :class:`FrameResult`.

        Args:
            name: the app.
            frame: one normalised sample, ``(C, H, W)`` or ``(1, C, H, W)``, a float32 numpy array
                (or a torch tensor: its result's logits are one too).
            tag: returned untouched in the result (e.g. the label).

        Raises:
            EngineError: unknown app, or a frame of the wrong shape or dtype (names the app and the
                expected shape).
        """
        app = self._app(name)
        x, back = self._check_frame(app, frame)
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise EngineError("the engine is closed. HINT: create a new Engine")
            if name not in self._apps:
                raise EngineError(f"app {name!r} left the engine")
            frame_rec = _Frame(x, back, tag, app.seq, time.perf_counter(), fut)
            app.seq += 1
            app.counts["submitted"] += 1
            app.queue.append(frame_rec)
            while len(app.queue) > self.max_pending:
                self._drop(app, app.queue.popleft(), "queue_full")
            self._cond.notify()
        return fut

    def infer(self, name: str, frame: Any, tag: Any = None, timeout: float | None = None) -> FrameResult:
        """Submit one frame and wait for its result (see :meth:`submit`)."""
        return self.submit(name, frame, tag).result(timeout)

    def stream(self, name: str, frames: Iterable[Any], fps: float | None = None) -> Iterator[FrameResult]:
        """Run a camera-like source through the engine: results in frame order.

        Args:
            name: the app.
            frames: arrays (or tensors), or ``(frame, tag)`` pairs.
            fps: pace submissions at this rate (default: the app's fps); ``0`` submits as fast as
                the source yields.

        Yields:
            one :class:`FrameResult` per frame (dropped frames included, ``dropped=True``).
        """
        app = self._app(name)
        rate = app.fps if fps is None else fps
        futures: deque[Future] = deque()
        done = threading.Event()
        error: list[BaseException] = []

        def feed() -> None:
            start = time.perf_counter()
            try:
                for i, item in enumerate(frames):
                    if rate:
                        delay = start + i / rate - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                    x, tag = item if isinstance(item, tuple) else (item, None)
                    futures.append(self.submit(name, x, tag))
            except BaseException as e:  # surfaced to the consumer
                error.append(e)
            finally:
                done.set()

        feeder = threading.Thread(target=feed, name=f"nestflex-stream-{name}", daemon=True)
        feeder.start()
        while True:
            if futures:
                yield futures.popleft().result()
            elif done.is_set():
                if futures:
                    continue
                break
            else:
                time.sleep(0.0005)
        feeder.join()
        if error:
            raise error[0]

    @property
    def apps(self) -> list[str]:
        """Registered app names."""
        return list(self._apps)

    def resident_bytes(self) -> int:
        """Bytes resident for all apps (sessions and paged weights)."""
        return self._control(lambda: sum(a.resident_bytes for a in self._apps.values()))

    def stats(self) -> dict[str, Any]:
        """Live view: per app its configuration, counts, frames/s, latency percentiles and paging;
        the budgets, the device slowdown and the last plan (plain JSON values)."""
        return self._control(self._stats)

    def close(self) -> None:
        """Stop the worker; queued frames are answered as dropped (``"closed"``)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._worker.join()
        self.profiler.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_budget(memory_mb: Any, cpu: Any) -> None:
        if memory_mb is not None and (not isinstance(memory_mb, (int, float)) or isinstance(memory_mb, bool)
                                      or not math.isfinite(memory_mb) or memory_mb <= 0):
            raise EngineError(f"`memory_mb` must be None (unlimited) or a finite number > 0, got {memory_mb!r}")
        if not isinstance(cpu, (int, float)) or isinstance(cpu, bool) or not 0 < cpu <= 1:
            raise EngineError(f"`cpu` must be in (0, 1] (the share of the device the apps may use), got {cpu!r}")

    def _app(self, name: str) -> _App:
        app = self._apps.get(name)
        if app is None:
            raise EngineError(f"no app {name!r} in the engine; apps: {sorted(self._apps)}. "
                              f"HINT: register it with engine.add_app({name!r}, bundle)")
        return app

    @staticmethod
    def _check_frame(app: _App, frame: Any) -> tuple[np.ndarray, Callable[[Any], Any]]:
        """The frame as a ``(1, *shape)`` float32 numpy batch (a CPU tensor's own memory), and the
        function that gives an answer back in the frame's array type."""
        shape = app.shape
        if not isinstance(frame, np.ndarray) and not is_torch(frame):
            raise EngineError(f"app {app.name!r}: a frame must be a numpy array (or a torch tensor) of shape "
                              f"{tuple(shape)}, got {type(frame).__name__}")
        if str(frame.dtype) not in ("float32", "torch.float32"):
            raise EngineError(f"app {app.name!r}: a frame must be float32 (normalised), got {frame.dtype}. "
                              f"HINT: prepare inputs as the bundle's input.note says (its scale, mean and std)")
        x, back = as_numpy(frame)
        if list(x.shape) == shape:
            return x[None], back
        if x.ndim == len(shape) + 1 and x.shape[0] == 1 and list(x.shape[1:]) == shape:
            return x, back
        raise EngineError(f"app {app.name!r}: a frame must have shape {tuple(shape)} or {(1, *shape)}, got "
                          f"{tuple(x.shape)}. HINT: submit one frame at a time")

    def _budget_message(self, memory_mb: float, apps: Sequence[_App]) -> str:
        rows = ", ".join(f"{a.name} {a.level_bytes(0) / _MB:.3f} MB" for a in apps)
        return (f"`memory_mb`={memory_mb} is below what every app needs at its smallest level together "
                f"({sum(a.level_bytes(0) for a in apps) / _MB:.3f} MB: {rows}). HINT: raise the budget or remove an app")

    # ------------------------------------------------------------------ worker side
    def _control(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread between frames and return its result (or raise its error)."""
        if threading.current_thread() is self._worker:
            return fn()
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise EngineError("the engine is closed. HINT: create a new Engine")
            self._controls.append((fn, fut))
            self._cond.notify()
        return fut.result()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._controls and not any(
                        a.queue for a in self._apps.values()):
                    self._cond.wait()
                if self._closed:
                    break
                control = self._controls.popleft() if self._controls else None
                work = None if control is not None else self._pick()
            if control is not None:
                fn, fut = control
                try:
                    fut.set_result(fn())
                except BaseException as e:
                    fut.set_exception(e)
                continue
            if work is not None:
                self._serve(*work)
        with self._cond:
            for a in self._apps.values():
                while a.queue:
                    self._drop(a, a.queue.popleft(), "closed")
            for fn, fut in self._controls:
                fut.set_exception(EngineError("the engine closed before this call ran"))
            self._controls.clear()

    def _drop(self, app: _App, frame: _Frame, reason: str) -> None:
        app.counts["dropped"] += 1
        latency = 1e3 * (time.perf_counter() - frame.arrival)
        frame.future.set_result(FrameResult(app.name, frame.seq, frame.tag, None, None, None, None, latency, 0.0,
                                            True, reason))

    def _pick(self) -> tuple[_App, _Frame] | None:
        """Start-time fair queueing over the backlogged apps; stale and superseded frames dropped.
        Called with the lock held."""
        now = time.perf_counter()
        best, best_tag = None, math.inf
        for app in self._apps.values():
            q = app.queue
            if not q:
                continue
            while len(q) > 1:  # a camera wants the newest frame
                self._drop(app, q.popleft(), "superseded")
            if 1e3 * (now - q[0].arrival) > self.max_delay_periods * app.period_ms:
                self._drop(app, q.popleft(), "late")
                continue
            tag = max(self._vclock, app.finish)
            if tag < best_tag:
                best, best_tag = app, tag
        if best is None:
            return None
        self._vclock = best_tag
        return best, best.queue.popleft()

    def _serve(self, app: _App, frame: _Frame) -> None:
        level, point = app.level, app.point
        start = time.perf_counter()
        try:
            if point is not None:
                out = app.progressive(frame.x, thresholds=list(app.points[point].thresholds))
                logits, exit_k = out.logits[0], int(out.exit_index[0])
            else:
                logits, exit_k = app.runtime(frame.x)[0], None
        except BaseException as e:  # one failing app never stops the others
            app.counts["failed"] += 1
            frame.future.set_exception(EngineError(f"app {app.name!r}: frame {frame.seq} failed at level {level}: "
                                                   f"{type(e).__name__}: {e}"))
            return
        end = time.perf_counter()
        compute_ms = 1e3 * (end - start)
        app.finish = self._vclock + compute_ms / max(app.share, 1e-6)
        latency = 1e3 * (end - frame.arrival)
        app.counts["answered"] += 1
        app.latencies.append(latency)
        predicted = app.exit_ms[exit_k] if exit_k is not None else app.level_ms[level]
        self.profiler.record(app.name, level, exit_k, compute_ms, predicted)
        scores = logits.tolist()  # arg-max in Python: an array call costs more than the 10-100 values
        frame.future.set_result(FrameResult(app.name, frame.seq, frame.tag, max(range(len(scores)), key=scores.__getitem__),
                                            frame.back(logits), level, exit_k, latency, compute_ms))
        if self.cpu < 1.0:  # a CPU quota: idle for the rest of this frame's slice
            time.sleep(compute_ms * (1.0 / self.cpu - 1.0) / 1e3)
        slow = self.profiler.slowdown()
        if (abs(slow - self._plan_slowdown) > self.replan_drift * self._plan_slowdown
                and end - self._last_plan >= self.min_replan_s):
            try:
                self._plan("drift")
            except NestflexError as e:  # keep serving on the current plan; the next event tries again
                self._last_plan = time.perf_counter()
                self.plans.append({"t": round(self._last_plan - self._t0, 4), "reason": "drift", "error": str(e)})

    # ------------------------------------------------------------------ joining, leaving, planning
    def _join(self, app: _App, profile: bool, repeats: int) -> dict[str, Any]:
        if app.name in self._apps:
            raise EngineError(f"app {app.name!r} is already registered. HINT: remove_app({app.name!r}) first, or "
                              f"choose another name")
        try:
            app.plan = self._app_plan(app.bundle)
            # one level's sessions at a time: the memory budget is NestDNN's one-model memory, and a
            # switch (between frames) builds the next level's session from its cached graph
            app.runtime = CapacityRuntime(app.bundle, level=0, plan=app.plan, keep="active")
            if app.exit_key is not None:
                app.points, app.lossless, app.accuracy_ref = operating_points(app.bundle, app.exit_key)
        except NestflexError as e:
            raise EngineError(f"app {app.name!r}: its bundle cannot run: {e}") from e
        others = sum(a.resident_bytes for a in self._apps.values())
        app.level_mem = [app.runtime.resident_bytes]  # level 0, as it runs now (the profile measures the rest)
        if self.memory_mb is not None and (others + app.level_mem[0]) / _MB > self.memory_mb:
            raise EngineError(f"app {app.name!r} does not fit: " + self._budget_message(
                self.memory_mb, [*self._apps.values(), app]))
        self._profile(app, profile, repeats, others)
        app.joined = time.perf_counter()
        with self._cond:
            self._apps[app.name] = app
        try:
            self._plan("join")
        except BaseException:
            with self._cond:
                del self._apps[app.name]
            raise
        return self._stats()["apps"][app.name]

    def _profile(self, app: _App, measure: bool, repeats: int, others: int) -> None:
        """What every level holds in memory and its batch-1 latency, and what the exit set holds and
        the latency of stopping at each exit, on this device now.

        Memory is measured, not computed from the weights: the runtime is switched to the level and
        its resident bytes read (an onnxruntime session holds its graph, a few kB more than the
        level's weights; the process's real resident set is reported beside it in :meth:`stats`); an exit set's runtime holds its own sessions, backbone included
        (:attr:`ProgressiveRuntime.own_bytes`), so it is made only while the app runs its largest
        level and counted there. What is measured is made for real, so only what fits beside the
        other apps now is: a level whose weights would not is never switched to (its memory is its
        weight bytes times the largest overhead measured, its time scaled from the largest timed
        level by MACs, a lower bound on this CPU corrected by the profiler's slowdown factor once
        the level runs), and an exit set that would not is left out (levels only). A bundle
        profiled before (same path and exit set) reuses its profile, nothing is made: an app that
        comes back starts at once, with its exits if they fit the budget alone."""
        rows, rt, top = app.bundle.levels, app.runtime, app.top
        total = math.inf if self.memory_mb is None else self.memory_mb * _MB
        budget = total - others
        key = (str(Path(app.bundle.path).resolve()), app.exit_key, measure)
        seen = self._profiles_seen.get(key)
        if seen is not None:
            (app.level_ms, app.exit_ms, app.level_mem), app.exits_bytes = (list(v) for v in seen[:3]), seen[3]
            if app.exit_key is not None and app.level_mem[top] + app.exits_bytes > total:
                app.exit_key, app.points, app.exit_ms = None, [], []  # its exits never fit the budget
            return
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
                app.level_ms.append(float(_row_latency(rows[k])))
            elif fits:
                app.level_ms.append(median_ms(lambda: rt(x), repeats))
            else:
                j = len(app.level_ms) - 1  # level 0 always fits: _join refuses an app whose level 0 does not
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
            return  # not kept: next time there may be room to measure them
        self._profiles_seen[key] = (list(app.level_ms), list(app.exit_ms), list(app.level_mem), app.exits_bytes)

    def _app_plan(self, bundle: Bundle) -> ExecutionPlan:
        """The plan an app's runtimes run: the bundle's tuned plan (else the default), at the
        engine's thread count when it sets one."""
        plan = resolve_plan(bundle, "auto")
        return plan if self.threads is None else plan.with_threads(self.threads, bundle.exit_sets)

    def _leave(self, name: str) -> None:
        with self._cond:
            app = self._apps.pop(name)
            while app.queue:
                self._drop(app, app.queue.popleft(), "closed")
        self.profiler.forget(name)
        app.runtime = app.progressive = None  # release the resident weights
        if self._apps:
            self._plan("leave")
        else:
            self.decision = None

    def _profiles(self, apps: Sequence[_App], scale: float) -> list[AppProfile]:
        out = []
        for a in apps:
            rows = []
            for k, r in enumerate(a.bundle.levels):
                ms = a.level_ms[k]
                if k == a.top and a.exit_key is not None:
                    ms = a.point_ms(a.lossless)  # the largest level runs with its exits
                rows.append({"level": k, "accuracy": a.level_accuracy(k), "latency_ms": max(ms * scale, 1e-6),
                             "memory_mb": a.level_bytes(k) / _MB, "macs": int(r.get("macs") or 0)})
            out.append(AppProfile.from_levels(a.name, rows, min_accuracy=a.min_accuracy, max_latency_ms=a.period_ms))
        return out

    def _plan(self, reason: str) -> Decision | None:
        apps = list(self._apps.values())
        if not apps:
            self.decision = None
            return None
        t0 = time.perf_counter()
        slow = self.profiler.slowdown()
        scale = slow / self.cpu
        profiles = self._profiles(apps, scale)
        memory = self.memory_mb if self.memory_mb is not None else sum(p.levels[-1].memory_mb for p in profiles) + 1
        try:
            decision = self.scheduler.schedule(profiles, memory_mb=memory, alpha=self.alpha, unit=self.unit)
        except SchedulerError as e:
            raise EngineError(f"the scheduler refused the apps {[a.name for a in apps]}: {e}") from e
        levels = {a.app: a.level for a in decision.allocations}
        shares = {a.app: a.share for a in decision.allocations}
        self._enforce_memory(apps, levels)
        t1 = time.perf_counter()
        # downgrades first, so resident bytes never exceed the budget between two switches
        order = sorted(apps, key=lambda a: a.level_bytes(levels[a.name]) - a.resident_bytes)
        for a in order:
            a.share = shares[a.name]
            if levels[a.name] != a.level:
                if levels[a.name] != a.top:  # the exit set runs at the largest level only: its sessions go
                    a.progressive = None
                report = a.runtime.set_level(levels[a.name])
                a.level = levels[a.name]
                a.counts["switches"] += 1
                a.counts["page_in_bytes"] += report.page_in_bytes
                a.counts["page_out_bytes"] += report.page_out_bytes
            if a.level == a.top and a.exit_key is not None and a.progressive is None:
                a.progressive = ProgressiveRuntime(a.bundle, a.runtime, exit_set=a.exit_key, plan=a.plan)
            a.point = self._choose_point(a, scale) if a.progressive is not None else None
        t2 = time.perf_counter()
        self.decision, self._plan_slowdown, self._last_plan = decision, slow, t2
        self.plans.append({"t": round(t2 - self._t0, 4), "reason": reason, "slowdown": round(slow, 4),
                           "plan_ms": round(1e3 * (t1 - t0), 4), "apply_ms": round(1e3 * (t2 - t1), 4),
                           "apps": {a.name: {"level": a.level, "point": a.point, "share": round(a.share, 4)}
                                  for a in apps}})
        return decision

    def _enforce_memory(self, apps: Sequence[_App], levels: dict[str, int]) -> None:
        """Demote the lowest-priority, then largest, app one level at a time until the plan fits the
        budget (schedulers such as the status quo do not plan memory). Every app fits at level 0:
        :meth:`add_app` and :meth:`set_budget` refuse a budget below that."""
        if self.memory_mb is None:
            return
        budget = self.memory_mb * _MB
        while sum(a.level_bytes(levels[a.name]) for a in apps) > budget:
            movable = [a for a in apps if levels[a.name] > 0]
            if not movable:  # unreachable while add_app and set_budget check level 0
                raise EngineError(self._budget_message(self.memory_mb, apps))
            a = min(movable, key=lambda a: (a.priority, -a.level_bytes(levels[a.name]), a.name))
            levels[a.name] -= 1

    def _choose_point(self, app: _App, scale: float) -> int:
        """FlexDNN's runtime adaptation: the most accurate operating point whose predicted time fits
        the app's compute per frame; the cheapest when none fits."""
        if not self.adapt_exits:
            return app.lossless
        budget = app.share * app.period_ms
        fits = [i for i in range(len(app.points)) if app.point_ms(i) * scale <= budget]
        if not fits:
            return min(range(len(app.points)), key=app.point_ms)
        return max(fits, key=lambda i: (app.point_accuracy(i), -app.point_ms(i)))

    def _stats(self) -> dict[str, Any]:
        now = time.perf_counter()
        apps = {}
        for a in self._apps.values():
            lat = sorted(a.latencies)
            elapsed = max(now - a.joined, 1e-9)
            apps[a.name] = {
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
            }
        rss = rss_bytes()
        return {"scheduler": self.scheduler.name, "memory_mb": self.memory_mb, "cpu": self.cpu,
                "resident_bytes": sum(a.resident_bytes for a in self._apps.values()),
                # what the process really holds (the OS's resident set; None where it gives none), and
                # its growth since the engine was made: the sessions' arenas, kernels and the runtime
                # libraries loaded for the first app, beside the bytes the budget plans with
                "process_rss_bytes": rss,
                "rss_growth_bytes": None if rss is None or self._rss0 is None else rss - self._rss0,
                "slowdown": round(self.profiler.slowdown(), 4), "plans": len(self.plans),
                "last_plan": self.plans[-1] if self.plans else None, "apps": apps}

    def __repr__(self) -> str:
        return (f"Engine(scheduler={self.scheduler.name!r}, apps={sorted(self._apps)}, memory_mb={self.memory_mb}, "
                f"cpu={self.cpu})")


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])


def _row_latency(row: Mapping[str, Any]) -> float | None:
    lat = row.get("latency_ms")
    if isinstance(lat, Mapping):
        lat = lat.get("1")
    return float(lat) if isinstance(lat, (int, float)) and lat > 0 else None


def _choose_exit_set(name: str, bundle: Bundle, exit_set: str | None) -> str | None:
    sets = bundle.exit_sets
    if exit_set is None:
        return None
    if exit_set == "auto":
        for key in ("flex_exits", "exits"):
            if key in sets and sets[key].get("backbone") == "shared":
                return key
        return None
    if exit_set not in ("exits", "flex_exits"):
        raise EngineError(f"app {name!r}: `exit_set` must be 'auto', 'exits', 'flex_exits' or None, got {exit_set!r}")
    if exit_set not in sets:
        raise EngineError(f"app {name!r}: bundle {str(bundle.path)!r} has no {exit_set} (present: "
                          f"{sorted(sets) or 'none'}). HINT: pass exit_set='auto' or None")
    if sets[exit_set].get("backbone") != "shared":
        raise EngineError(f"app {name!r}: the {exit_set} of bundle {str(bundle.path)!r} have their own backbone, "
                          f"not the multi-capacity one, so the engine cannot combine them with levels. HINT: train the "
                          f"exits on the grown model's largest level (exits_only), or pass exit_set=None")
    return exit_set
