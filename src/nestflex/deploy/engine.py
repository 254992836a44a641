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

**Split apps** (issue 41): an app added with ``tail=`` (a ``nestflex serve`` address, or a tail
client) runs its frames through the same queue with the
:class:`~nestflex.deploy.split.offload.Offloader`: head, send and local continuation on the worker at
the app's share, the wait for the server and the fallback on waiter threads of the app's own (a
fallback that runs the whole tail goes back to the worker, charged to the app; :mod:`._engine_split`),
so a failing server or link never stalls the other apps, and every frame is answered. With a joint
scheduler (``"joint_total"``, ``"joint_max"``, a :class:`~nestflex.deploy.scheduler.joint.JointScheduler`)
the engine plans level x exit operating point x split x bitwidth for all apps at once over the shared
device, memory, link and server (:mod:`._engine_joint`); other schedulers run split apps on the device.

Re-planning happens on events: an app joins or leaves, a budget changes, or the profiler's
slowdown factor drifts by more than ``replan_drift`` from the value the last plan used (another
process took a core). Schedulers are the registry's (:func:`~nestflex.deploy.scheduler.get_scheduler`):
``greedy_*``, ``cached_*``, ``exact_*``, ``knee`` (the status quo), ``fixed`` (levels frozen)
and ``flexdnn`` (largest level, thresholds adapted).

Frames are numpy float32 arrays (a torch tensor is accepted too, and its answer's logits come
back as a tensor); the runtimes run on onnxruntime unless a plan says otherwise, so the engine
needs no torch.

Beside this module: :mod:`nestflex.deploy.operating_points` reads an exit set's operating points
from the bundle; :mod:`._engine_apps` holds what the engine keeps per app and measures when it
joins; :mod:`._engine_plan` holds the engine's decisions as pure functions of its apps;
:mod:`._engine_split` serves split apps, :mod:`._engine_joint` builds the joint planner's options.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from nestflex.deploy._arrays import as_numpy, is_torch
from nestflex.deploy._engine_apps import MB, App, Frame, Measured, app_stats, measure_app, row_latency
from nestflex.deploy._engine_plan import app_profiles, budget_message, choose_point, enforce_memory
from nestflex.deploy._engine_split import SplitServing, close_split
from nestflex.deploy._memory import rss_bytes
from nestflex.deploy.backends.plan import ExecutionPlan
from nestflex.deploy.bundle.loader import Bundle, load
from nestflex.deploy.operating_points import ExitPoint, operating_points
from nestflex.deploy.profiler import OnlineProfiler
from nestflex.deploy.runtime.capacity import CapacityRuntime, resolve_plan
from nestflex.deploy.runtime.progressive import ProgressiveRuntime
from nestflex.deploy.scheduler import Decision, Scheduler, SchedulerError, get_scheduler
from nestflex.deploy.scheduler.joint import JointScheduler
from nestflex.errors import NestflexError

__all__ = ["EngineError", "ExitPoint", "FrameResult", "Engine", "operating_points"]


class EngineError(NestflexError, ValueError):
    """An engine call names an unknown app, gives a bad frame or goal, or a budget no app fits."""


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
        where: a split app's frame: ``"device"``, ``"local"``, ``"server"`` or ``"fallback"``
            (:class:`~nestflex.deploy.split.offload.SplitAnswer`); ``None`` for the engine's own runtimes.
        bytes_sent: request bytes a split app's frame sent.

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
    where: str | None = None
    bytes_sent: int = 0

    @property
    def answered(self) -> bool:
        return not self.dropped


class Engine(SplitServing):
    """Serves several apps on one device, adapting each app's configuration as resources change.

    Args:
        scheduler: a registered scheduler name or a :class:`~nestflex.deploy.scheduler.Scheduler`
            (``knee`` is the status quo: fixed knee level, equal shares, memory not planned), or
            ``"joint_total"`` / ``"joint_max"`` / a :class:`~nestflex.deploy.scheduler.joint.JointScheduler`
            (levels, exits, splits and bitwidths planned together).
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
        link_mbps: the joint planner's uplink bandwidth until the network profiler has measured it.
        server_capacity: server seconds per second the apps may use (the joint planner's capacity).
        server_speedup: how much faster the server runs a segment than this device (split apps' profiles).
        probe_every_s: while the link counts as down, or no split app sent for this long, probe it.

    Raises:
        EngineError: an argument out of range; SchedulerError for an unknown scheduler name.
    """

    _result, _error = FrameResult, EngineError  # for SplitServing's methods

    def __init__(
        self,
        scheduler: str | Scheduler | JointScheduler = "greedy_total",
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
        link_mbps: float = 10.0,
        server_capacity: float = 1.0,
        server_speedup: float = 1.0,
        probe_every_s: float = 1.0,
    ) -> None:
        from nestflex.deploy._engine_joint import JOINT_NAMES

        self.scheduler: Scheduler | JointScheduler = (
            JointScheduler(JOINT_NAMES[scheduler]) if isinstance(scheduler, str) and scheduler in JOINT_NAMES
            else scheduler if isinstance(scheduler, JointScheduler) else get_scheduler(scheduler))
        self._check_budget(memory_mb, cpu)
        for arg, value, ok in (("alpha", alpha, 0 <= alpha <= 1), ("unit", unit, 0 < unit <= 1),
                               ("replan_drift", replan_drift, replan_drift > 0),
                               ("min_replan_s", min_replan_s, min_replan_s >= 0),
                               ("max_delay_periods", max_delay_periods, max_delay_periods > 0),
                               ("link_mbps", link_mbps, link_mbps > 0), ("server_capacity", server_capacity,
                                                                          server_capacity >= 0),
                               ("server_speedup", server_speedup, server_speedup > 0),
                               ("probe_every_s", probe_every_s, probe_every_s > 0)):
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
        self.link_mbps, self.server_capacity = float(link_mbps), float(server_capacity)
        self.server_speedup, self.probe_every_s = float(server_speedup), float(probe_every_s)
        self.network: Any = None  # the shared link's NetworkProfiler, made when the first split app joins
        self._link: Any = None  # _engine_split.LinkState, with it
        self._link_event: str | None = None  # a waiter saw the link change: re-plan between frames
        self._plan_link = (0.0, True)  # (bandwidth, up) the last plan used
        self.decision: Decision | None = None
        self.plans: deque[dict[str, Any]] = deque(maxlen=256)
        self._apps: dict[str, App] = {}
        # what each bundle measured on this device (bundle path, exit set, timed), so an app that
        # comes back is not timed again
        self._measured: dict[tuple[str, str | None, bool], Measured] = {}
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
        tail: Any = None,
        deadline_ms: float = 500.0,
        depth: int = 2,
        split_bits: tuple[int, ...] = (2, 4, 8),
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
            tail: a tail server for split inference: a ``host:port`` address (``nestflex serve``)
                or a tail client (:class:`~nestflex.deploy.split.client.TailClient`, ``RayTailClient``,
                used and left open); ``None``: the app runs on the device only. Its exits then run in
                the :class:`~nestflex.deploy.split.offload.Offloader` (the bundle's ``exits``), so
                ``exit_set`` must be ``"auto"`` or ``None``.
            deadline_ms: a split request's deadline; past it the frame is answered on the device.
            depth: a split app's requests in flight; a frame beyond them runs on the device.
            split_bits: bitwidths the planner considers for the tensors sent (float32 always).

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
        if not profile and any(row_latency(r) is None for r in b.levels):
            raise EngineError(f"app {name!r}: bundle {str(b.path)!r} has no batch-1 latency per level. "
                              f"HINT: pass profile=True to time the levels on this device")
        if tail is not None:
            if exit_set not in ("auto", None):
                raise EngineError(f"app {name!r}: with a `tail` the exits run in the offloader (the bundle's "
                                  f"'exits'), got exit_set={exit_set!r}. HINT: pass exit_set='auto' or None")
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise EngineError(f"app {name!r}: `depth` must be an int >= 1 (requests in flight), got {depth!r}")
            if not (isinstance(deadline_ms, (int, float)) and math.isfinite(deadline_ms) and deadline_ms > 0):
                raise EngineError(f"app {name!r}: `deadline_ms` must be a number > 0, got {deadline_ms!r}")
            if not isinstance(tail, str) and not hasattr(tail, "submit"):
                raise EngineError(f"app {name!r}: `tail` must be a 'host:port' address or a tail client (with "
                                  f"submit()), got {type(tail).__name__}")
            exit_set = None
        app = App(name, b, float(fps), min_accuracy, float(priority), _choose_exit_set(name, b, exit_set),
                   [int(v) for v in b.input_spec["shape"]])
        split = (tail, float(deadline_ms), depth, tuple(split_bits)) if tail is not None else None
        return self._control(lambda: self._join(app, profile, profile_repeats, split))

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
            smallest = sum(a.level_bytes(0) for a in self._apps.values()) / MB
            if mem is not None and self._apps and smallest > mem:
                raise EngineError(budget_message(mem, list(self._apps.values())))
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
            frame_rec = Frame(x, back, tag, app.seq, time.perf_counter(), fut)
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
        """Bytes resident for all apps (sessions and paged weights; split runtimes once per bundle)."""
        return self._control(self._resident)

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
        for a in self._apps.values():
            if a.split is not None:
                close_split(a.split)
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

    def _app(self, name: str) -> App:
        app = self._apps.get(name)
        if app is None:
            raise EngineError(f"no app {name!r} in the engine; apps: {sorted(self._apps)}. "
                              f"HINT: register it with engine.add_app({name!r}, bundle)")
        return app

    @staticmethod
    def _check_frame(app: App, frame: Any) -> tuple[np.ndarray, Callable[[Any], Any]]:
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
        self.profiler.watch_thread()  # this thread's waits for a CPU enter the slowdown (profiler.py)
        while True:
            with self._cond:
                while not self._closed and not self._controls and not any(
                        a.queue or a.jobs for a in self._apps.values()):
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
                if self._link is not None:
                    self._link_tick()
        with self._cond:
            for a in self._apps.values():
                while a.queue:
                    self._drop(a, a.queue.popleft(), "closed")
            for fn, fut in self._controls:
                fut.set_exception(EngineError("the engine closed before this call ran"))
            self._controls.clear()
        for a in self._apps.values():  # fallbacks owed to frames already accepted: answered
            self._run_owed(a)

    def _drop(self, app: App, frame: Frame, reason: str) -> None:
        app.counts["dropped"] += 1
        latency = 1e3 * (time.perf_counter() - frame.arrival)
        frame.future.set_result(FrameResult(app.name, frame.seq, frame.tag, None, None, None, None, latency, 0.0,
                                            True, reason))

    def _pick(self) -> tuple[App, Frame | Callable[[], float]] | None:
        """Start-time fair queueing over the backlogged apps (a frame, or a job a split app owes);
        stale and superseded frames dropped. Called with the lock held."""
        now = time.perf_counter()
        best, best_tag = None, math.inf
        for app in self._apps.values():
            q = app.queue
            if not app.jobs:  # a split app's owed fallback (_engine_split) runs first and is never dropped
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
        return best, (best.jobs or best.queue).popleft()

    def _serve(self, app: App, frame: Frame | Callable[[], float]) -> None:
        if not isinstance(frame, Frame):
            return self._serve_job(app, frame)
        s = app.split
        if s is not None and s.config is not None and s.inflight < s.depth:
            return self._serve_split(app, frame)
        level, point = app.level, app.point
        self.profiler.frame_started()
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
        latency = 1e3 * (end - frame.arrival)
        with self._cond:  # a split app's waiters count too
            app.counts["answered"] += 1
            app.latencies.append(latency)
        scores = logits.tolist()  # arg-max in Python: an array call costs more than the 10-100 values
        frame.future.set_result(FrameResult(app.name, frame.seq, frame.tag, max(range(len(scores)), key=scores.__getitem__),
                                            frame.back(logits), level, exit_k, latency, compute_ms))
        self._after_frame(app, level, exit_k, compute_ms,
                          app.exit_ms[exit_k] if exit_k is not None else app.level_ms[level], end)

    def _after_frame(self, app: App, level: int, exit_k: int | None, compute_ms: float, predicted: float | None,
                     end: float) -> None:
        """The fair queue's tag, the profiler, the CPU quota and a drift re-plan after a frame's device work."""
        app.finish = self._vclock + compute_ms / max(app.share, 1e-6)
        self.profiler.record(app.name, level, exit_k, compute_ms, predicted)
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
    def _join(self, app: App, profile: bool, repeats: int, split: tuple | None = None) -> dict[str, Any]:
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
        if self.memory_mb is not None and (others + app.level_mem[0]) / MB > self.memory_mb:
            raise EngineError(f"app {app.name!r} does not fit: " + budget_message(
                self.memory_mb, [*self._apps.values(), app]))
        key = (str(Path(app.bundle.path).resolve()), app.exit_key, profile)
        total = math.inf if self.memory_mb is None else self.memory_mb * MB
        kept = measure_app(app, profile, repeats, total - others, total, self._measured.get(key))
        if kept is not None:
            self._measured[key] = kept
        try:
            if split is not None:
                self._open_split(app, split, repeats)
            if self._joint:
                from nestflex.deploy._engine_joint import joint_app

                app.joint = joint_app(app)
        except NestflexError as e:
            if app.split is not None:
                close_split(app.split)
            raise EngineError(f"app {app.name!r}: its split configurations cannot be set up: {e}") from e
        app.joined = time.perf_counter()
        with self._cond:
            self._apps[app.name] = app
        try:
            self._plan("join")
        except BaseException:
            with self._cond:
                del self._apps[app.name]
            if app.split is not None:
                close_split(app.split)
            raise
        return self._stats()["apps"][app.name]

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
        self._run_owed(app)
        self.profiler.forget(name)
        app.runtime = app.progressive = None  # release the resident weights
        if app.split is not None:
            close_split(app.split)
        if self._apps:
            self._plan("leave")
        else:
            self.decision = None

    def _plan(self, reason: str) -> Decision | None:
        apps = list(self._apps.values())
        if not apps:
            self.decision = None
            return None
        t0 = time.perf_counter()
        slow = self.profiler.slowdown()
        scale = slow / self.cpu
        specs = None
        try:
            if self._joint:
                # an app that offloads runs in its offloader's split runtime; its capacity runtime stays
                # where it is, or waits at level 0 (as the planner charged it) when the budget needs it
                decision, specs, shares, levels = self._plan_joint(apps, scale)
            else:
                profiles = app_profiles(apps, scale)
                memory = (self.memory_mb if self.memory_mb is not None
                          else sum(p.levels[-1].memory_mb for p in profiles) + 1)
                decision = self.scheduler.schedule(profiles, memory_mb=memory, alpha=self.alpha, unit=self.unit)
                levels = {a.app: a.level for a in decision.allocations}
                shares = {a.app: a.share for a in decision.allocations}
        except SchedulerError as e:
            raise EngineError(f"the scheduler refused the apps {[a.name for a in apps]}: {e}") from e
        if not enforce_memory(apps, levels, self.memory_mb):  # unreachable: add_app and set_budget check level 0
            raise EngineError(budget_message(self.memory_mb, apps))
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
            a.point = choose_point(a, scale, self.adapt_exits) if a.progressive is not None else None
            if specs is not None:  # the joint decision chose the point, and a split app's configuration
                a.point = specs[a.name].point if a.progressive is not None else None
                if a.split is not None:
                    option = decision.allocation(a.name).option
                    a.split.set_config(specs[a.name].config, option.device_ms if specs[a.name].config else None)
        t2 = time.perf_counter()
        self.decision, self._plan_slowdown, self._last_plan = decision, slow, t2
        self.plans.append({"t": round(t2 - self._t0, 4), "reason": reason, "slowdown": round(slow, 4),
                           "plan_ms": round(1e3 * (t1 - t0), 4), "apply_ms": round(1e3 * (t2 - t1), 4),
                           "apps": {a.name: {"level": a.level, "point": a.point, "share": round(a.share, 4),
                                             **({"option": decision.allocation(a.name).option.label}
                                                if specs is not None else {})} for a in apps}})
        return decision

    def _stats(self) -> dict[str, Any]:
        now = time.perf_counter()
        with self._cond:  # a split app's waiters update its counts under the lock
            apps = {a.name: app_stats(a, now) for a in self._apps.values()}
        rss = rss_bytes()
        return {"scheduler": self.scheduler.name, "memory_mb": self.memory_mb, "cpu": self.cpu,
                "resident_bytes": self._resident(),
                # what the process really holds (the OS's resident set; None where it gives none), and
                # its growth since the engine was made: the sessions' arenas, kernels and the runtime
                # libraries loaded for the first app, beside the bytes the budget plans with
                "process_rss_bytes": rss,
                "rss_growth_bytes": None if rss is None or self._rss0 is None else rss - self._rss0,
                "slowdown": round(self.profiler.slowdown(), 4), "plans": len(self.plans),
                "last_plan": self.plans[-1] if self.plans else None, "apps": apps,
                "network": None if self.network is None else {**self.network.stats(), "up": self._link.up}}

    def __repr__(self) -> str:
        return (f"Engine(scheduler={self.scheduler.name!r}, apps={sorted(self._apps)}, memory_mb={self.memory_mb}, "
                f"cpu={self.cpu})")


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
