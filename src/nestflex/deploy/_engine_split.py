"""Split apps in the engine (issue 41 item 1): an app added with a tail server runs its frames
through the engine's queue with the :class:`~nestflex.deploy.split.offload.Offloader`.

One frame of a split app, when the planner gave it a split configuration:

* on the engine's worker, at the app's compute share (its time advances the app's virtual finish
  tag like any other frame): the head up to the split with the exits before it, packing, the
  send, and the local continuation to the next exit (SPINN), which cancels the request when it is
  confident (:meth:`Offloader._finish_here`): the device work, so it is what the fair queue shares;
* on one of the app's ``depth`` waiter threads: the wait for the server, up to the deadline, and
  the fallback to the best local exit when the server or the link fails
  (:meth:`Offloader._finish_remote`). The worker never waits on the network, so a dead server or
  a link outage costs the other apps nothing; a frame that finds ``depth`` requests of its app in
  flight runs on the device at the app's level instead (answered, not queued behind the link).
  A fallback with no exit to answer from (a server-only split, :meth:`Offloader._tail_on_device`)
  runs the frame again on the app's capacity runtime at its level (not the split runtime's tail,
  whose sessions would hold the model a second time): the waiter hands it back to the engine as a
  job of the app (``App.jobs``), which the worker runs before the app's next frame and charges to
  the app's virtual time like a frame, so it stays within the app's share and the CPU quota.

Every frame is answered: by the server, by a local exit, or by the device alone. The shared
:class:`~nestflex.deploy.split.network.NetworkProfiler` is fed by every app's transfers (the link and
the server are shared), and :class:`LinkState` says whether they answer at all: after ``fails``
failed requests in a row the planner treats the link as down (no option sends) and the engine
probes it every ``probe_every_s`` seconds until a request gets through.

A split runtime holds onnxruntime sessions, so the apps of one bundle share them (:data:`_RUNTIMES`),
counted per app and released when the last of them leaves (:func:`close_split`); the other caches
here and in :mod:`._engine_joint` hold plain data, and a bounded number of entries.

Private to :mod:`nestflex.deploy.engine`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from nestflex.deploy.split.client import SplitError
from nestflex.deploy.split.network import NetworkProfiler
from nestflex.deploy.split.offload import Offloader, SplitAnswer, SplitConfig
from nestflex.deploy.split.runtime import SERVER_ONLY
from nestflex.errors import NestflexError

if TYPE_CHECKING:
    from nestflex.deploy._engine_apps import App, Frame

__all__ = ["LinkState", "SplitApp", "SplitServing", "open_split", "serve_split", "probe", "close_split",
           "split_runtime_bytes"]


class LinkState:
    """Whether the link and the server answer, from the outcomes of every split app's requests.

    Down after ``fails`` failed requests in a row (refused, unavailable, past the deadline), up
    again at the first that succeeds. Thread-safe: the apps' waiter threads report to it.

    Args:
        fails: failed requests in a row that make the link count as down (``>= 1``).
    """

    def __init__(self, fails: int = 3) -> None:
        self.fails, self.up, self._streak = int(fails), True, 0
        self._lock = threading.Lock()
        self.last_probe = self.last_ok = 0.0  # perf_counter times of the last probe and the last answer

    def record(self, ok: bool) -> bool:
        """One request's outcome; returns whether the state changed (the planner should re-plan)."""
        with self._lock:
            was = self.up
            self._streak = 0 if ok else self._streak + 1
            if ok:
                self.last_ok = time.perf_counter()
            self.up = ok or (self.up and self._streak < self.fails)
            return self.up != was


@dataclass
class SplitApp:
    """What the engine keeps for an app that has a tail server."""

    offloader: Offloader
    client: Any
    owns_client: bool  # made from an address here, closed when the app leaves
    depth: int
    deadline_ms: float
    waiters: ThreadPoolExecutor
    config: SplitConfig | None = None  # None: the planner runs it on the device (the engine's runtimes)
    predicted_ms: float | None = None  # the configuration's device time per frame (the profiler's reference)
    inflight: int = 0
    last_x: Any = None
    where: Counter = field(default_factory=Counter)
    bytes_sent: int = 0
    server_ms: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)  # SplitScheduler.static_rows, measured at join
    points: list[Any] = field(default_factory=list)  # the exit set's operating points the rows index
    accuracy_ref: float | None = None  # their calibration accuracy of the final exit
    runtime_key: str | None = None  # its entry in _RUNTIMES while it holds one (None once released)

    def set_config(self, config: SplitConfig | None, predicted_ms: float | None) -> None:
        """Run the next frames under ``config`` (builds its split runtime now, between frames); the
        bundle's split runtimes no app runs any more are dropped (:func:`_use_runtime`)."""
        if config is not None:  # also when unchanged: its runtime may have been dropped while unused
            self.offloader.set_config(config)
        self.config, self.predicted_ms = config, predicted_ms
        _use_runtime(self, None if config is None else self.offloader.runtime(config.split))

    def stats(self) -> dict[str, Any]:
        return {"config": None if self.config is None else
                {"split": self.config.split, "bits": self.config.bits,
                 "thresholds": None if self.config.thresholds is None else list(self.config.thresholds)},
                "where": dict(self.where), "bytes_sent": self.bytes_sent, "server_ms": round(self.server_ms, 4),
                "inflight": self.inflight}


@dataclass
class _Shared:
    """One bundle's split runtimes (by split point), how many split apps use them, and the split
    each of those apps runs now (``None``: none, it runs on the engine's runtimes)."""

    runtimes: dict
    users: int = 0
    active: dict = field(default_factory=dict)  # id(SplitApp) -> the SplitRuntime it runs, or None


#: split runtimes by bundle path and exit set, shared by every offloader of that bundle in this process:
#: a runtime's sessions are built once (on the worker, between frames), not per app; onnxruntime runs a
#: session from several threads (the worker's heads, the waiters' combines). Counted per app and dropped
#: with the last one (:func:`close_split`), so a long-running device process gets the sessions' memory back
_RUNTIMES: dict[str, _Shared] = {}
_RUNTIMES_LOCK = threading.Lock()  # engines in one process join and leave apps on their own workers


def _share_runtimes(off: Offloader, key: str) -> None:
    """Make ``off`` use the runtimes of ``key`` (its own first ones where there are none yet) and
    count it as one more user."""
    with _RUNTIMES_LOCK:
        shared = _RUNTIMES.setdefault(key, _Shared({}))
        for split, rt in off._runtimes.items():  # a runtime already shared stays: frames may be running it
            shared.runtimes.setdefault(split, rt)
        shared.users += 1
    off._runtimes = shared.runtimes


def _use_runtime(s: SplitApp, runtime: Any) -> None:
    """``s`` runs ``runtime`` now (``None``: none): the runtimes of its bundle that no app runs are
    dropped, so what the process holds is what the planner charged (the measurement at the first
    join builds every split point's runtime; a split chosen again is rebuilt from the graphs the
    bundle's tuned folder keeps, as a level switch is). Frames in flight keep the runtime they run."""
    if s.runtime_key is None:
        return
    with _RUNTIMES_LOCK:
        shared = _RUNTIMES.get(s.runtime_key)
        if shared is None:
            return
        shared.active[id(s)] = runtime
        used = {id(rt) for rt in shared.active.values() if rt is not None}
        for name in [n for n, rt in shared.runtimes.items() if id(rt) not in used]:
            del shared.runtimes[name]


def split_runtime_bytes(splits: list[SplitApp]) -> int:
    """What the split runtimes of these apps' bundles hold (their opened sessions), each shared
    runtime counted once."""
    with _RUNTIMES_LOCK:
        keys = {s.runtime_key for s in splits if s.runtime_key is not None}
        return sum(rt.resident_bytes for k in keys if k in _RUNTIMES for rt in list(_RUNTIMES[k].runtimes.values()))


def _release_runtimes(s: SplitApp) -> None:
    """``s`` no longer uses its bundle's runtimes; the last user drops them from :data:`_RUNTIMES`
    (requests still in flight keep the runtime they run until they finish)."""
    key, s.runtime_key = s.runtime_key, None
    if key is None:  # released already
        return
    with _RUNTIMES_LOCK:
        shared = _RUNTIMES.get(key)
        if shared is not None:
            shared.active.pop(id(s), None)
            shared.users -= 1
            if shared.users <= 0:
                del _RUNTIMES[key]


def open_split(bundle: Any, tail: Any, network: NetworkProfiler, *, deadline_ms: float, depth: int) -> SplitApp:
    """A split app's offloader on ``tail`` (a ``host:port`` address, or a client object such as a
    :class:`~nestflex.deploy.split.client.TailClient` or ``RayTailClient``), feeding ``network``."""
    owns = isinstance(tail, str)
    if owns:
        from nestflex.deploy.split.client import TailClient  # gRPC only where an app has a tail

        client = TailClient(tail, bundle)
    else:
        client = tail
    exit_set = "exits" if "exits" in bundle.exit_sets else None
    # a placeholder config that opens no session (the server-only split, no continuation): the app
    # runs on the engine's runtimes until a plan gives it a split (SplitApp.config), and a device-only
    # config here would open the whole network's sessions at every join, on the worker
    off = Offloader(bundle, client, SplitConfig(SERVER_ONLY, deadline_ms=deadline_ms, continue_locally=False),
                    exit_set=exit_set, profiler=network)
    key = f"{Path(bundle.path).resolve()}|{exit_set}"
    _share_runtimes(off, key)  # the offloader's runtime cache, shared (see _RUNTIMES)
    waiters = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="nestflex-split")
    return SplitApp(off, client, owns, depth, float(deadline_ms), waiters, runtime_key=key)


def serve_split(s: SplitApp, x: np.ndarray, arrival: float, answer: Callable[[SplitAnswer, float], None],
                fail: Callable[[BaseException], None], done: Callable[[bool | None], None], lock: Any,
                defer: Callable[[Callable[[], SplitAnswer], float, int], None]) -> float:
    """Run one frame's device part here (the worker), hand its wait to a waiter thread; returns the
    device time in ms.

    ``answer(split_answer, device_ms)`` is called once with the frame's answer (here or on the
    waiter), ``fail(error)`` instead when the offloader itself raised, and ``done(ok)`` on the
    waiter after a request finished (``ok``: the server answered; ``None``: no request was made),
    holding nothing, before ``answer``. ``lock`` guards ``s.inflight`` (the engine's, which ``done``
    takes to lower it). When the server failed and only the whole tail can answer (a server-only
    split), the waiter calls ``defer(run, device_ms, bytes_sent)`` instead of ``answer``: ``run()``
    is that device work (:meth:`Offloader._fallback`) and returns the frame's answer, for the caller
    to run where the app's device work runs, or to answer the frame its own way.
    """
    start = time.perf_counter()
    s.last_x = x
    f = s.offloader._start(x, arrival)
    here, local = s.offloader._finish_here(f)
    device_ms = 1e3 * (time.perf_counter() - start)
    if here is not None:
        answer(here, device_ms)
        return device_ms
    with lock:
        s.inflight += 1

    def wait() -> None:
        try:
            out = s.offloader._finish_remote(f, local, device_fallback=False)
        except SplitError as e:  # the server failed, and the fallback is the whole tail: device work
            done(False)
            defer(partial(s.offloader._fallback, f, local, e), device_ms, f.call.bytes_sent if f.call is not None else 0)
            return
        except BaseException as e:  # a bug, not the network: the frame still gets its answer (an error)
            done(None)
            fail(e)
            return
        done(out.where == "server")
        answer(out, device_ms)

    s.waiters.submit(wait)
    return device_ms


def probe(s: SplitApp, done: Callable[[bool], None]) -> None:
    """Measure the link with the app's last frame on a waiter thread (feeds the network profiler);
    ``done(ok)`` with the outcome."""
    x = s.last_x

    def run() -> None:
        ok = False
        try:
            ok = bool(s.offloader.probe(x, deadline_ms=s.deadline_ms))
        finally:  # the slot the probe holds is freed whatever happened
            done(ok)

    if x is not None:
        s.waiters.submit(run)


def close_split(s: SplitApp) -> None:
    """Release a split app that left: its share of its bundle's split runtimes now (the last app of
    the bundle frees them), its requests in flight are still answered (on their waiters), then its
    own client is closed, on a thread of its own so the engine's worker does not wait."""
    _release_runtimes(s)

    def finish() -> None:
        s.waiters.shutdown(wait=True)
        if s.owns_client:
            s.client.close()

    threading.Thread(target=finish, name="nestflex-split-close", daemon=True).start()


#: split rows by (bundle path, bitwidths, server speed-up), measured once per process; plain data (rows,
#: operating points), bounded as _engine_joint._BUILT is
_SPLIT_ROWS: dict[tuple, tuple] = {}


class SplitServing:
    """The engine's side of split apps and of the joint planner, mixed into
    :class:`~nestflex.deploy.engine.Engine` (kept here for the file-size cap): a split app's tail and
    rows, serving a frame, its answer or failure from a waiter thread, the link's events and
    probes, the joint decision. ``_result`` and ``_error`` are the engine's FrameResult and EngineError."""

    _result: Any
    _error: Any

    def _open_split(self, app: App, split: tuple, repeats: int) -> None:
        """Connect a split app to its tail and measure its split rows (once per bundle)."""
        from nestflex.deploy._engine_joint import measure_split
        from nestflex.deploy.split.network import NetworkProfiler

        tail, deadline_ms, depth, bits = split
        if self.network is None:
            self.network, self._link = NetworkProfiler(), LinkState()
            self._plan_link = (self.link_mbps, True)
        app.split = open_split(app.bundle, tail, self.network, deadline_ms=deadline_ms, depth=depth)
        # measured once per bundle in this process: the segments' times are this device's, whichever
        # engine asks (an engine measuring them on its worker holds every app's frames meanwhile)
        key = (str(Path(app.bundle.path).resolve()), bits, self.server_speedup)
        try:
            if key not in _SPLIT_ROWS:
                if len(_SPLIT_ROWS) >= 64:
                    _SPLIT_ROWS.clear()
                _SPLIT_ROWS[key] = measure_split(app, bits=bits, repeats=repeats,
                                                 server_speedup=self.server_speedup)
        except BaseException:  # the app does not join, whatever failed: its runtimes' share and client go now
            close_split(app.split)
            app.split = None
            raise
        app.split.rows, app.split.points, app.split.accuracy_ref = _SPLIT_ROWS[key]
        app.split.set_config(None, None)  # on the engine's runtimes until a plan: the measured runtimes go

    def _resident(self) -> int:
        """Bytes resident for all apps: their runtimes, and their bundles' split runtimes once each."""
        apps = self._apps.values()
        return sum(a.resident_bytes for a in apps) + split_runtime_bytes([a.split for a in apps if a.split is not None])

    @property
    def _joint(self) -> bool:
        from nestflex.deploy.scheduler.joint import JointScheduler

        return isinstance(self.scheduler, JointScheduler)

    def _plan_joint(self, apps: list[App], scale: float
                    ) -> tuple[Any, dict[str, Any], dict[str, float], dict[str, int]]:
        """The joint scheduler's decision over the device, memory, the link and the server: the
        decision, how each app runs, its compute share, and its capacity runtime's level
        (:func:`~nestflex.deploy._engine_joint.capacity_levels`)."""
        from nestflex.deploy._engine_joint import capacity_levels, plan_joint

        memory = (self.memory_mb if self.memory_mb is not None
                  else sum(max(o.memory_mb for o in a.joint[0].options) for a in apps) + 1)
        up = self._link is not None and self._link.up
        bw = self.network.bandwidth_mbps("realtime", default=self.link_mbps) if up else 0.0
        self._plan_link = (bw or self.link_mbps, up)
        decision, specs, shares = plan_joint(self.scheduler, apps, scale=scale, memory_mb=memory, link_mbps=bw,
                                             server_capacity=self.server_capacity if up else 0.0,
                                             server_slowdown=self.network.server_slowdown() if up else 1.0,
                                             alpha=self.alpha)
        return decision, specs, shares, capacity_levels(apps, decision, specs, self.memory_mb)

    def _serve_split(self, app: App, frame: Frame) -> None:
        """A split app's frame: the device part here, the wait on its waiters (:mod:`._engine_split`)."""
        level = app.level
        try:
            compute_ms = serve_split(app.split, frame.x, frame.arrival,
                                     lambda answer, ms: self._split_answer(app, frame, answer, level, ms),
                                     lambda e: self._split_failed(app, frame, level, e),
                                     lambda ok: self._split_done(app, ok), self._cond,
                                     lambda run, ms, sent: self._split_fallback(app, frame, level, run, ms, sent))
        except BaseException as e:  # one failing app never stops the others
            return self._split_failed(app, frame, level, e)
        self._after_frame(app, level, None, compute_ms, app.split.predicted_ms, time.perf_counter())

    def _split_answer(self, app: App, frame: Frame, answer: Any, level: int, device_ms: float) -> None:
        """A split app's frame answered (on the worker or a waiter thread)."""
        r = answer.result
        self._deliver(app, frame, r.logits[0], level, int(r.exit_index[0]), answer.where, device_ms,
                      answer.bytes_sent, answer.reply.server_ms if answer.reply is not None else 0.0,
                      answer.latency_ms)

    def _deliver(self, app: App, frame: Frame, logits: Any, level: int, exit_k: int | None, where: str,
                 device_ms: float, bytes_sent: int, server_ms: float, latency_ms: float) -> None:
        """Count a split app's answered frame and set its result."""
        s = app.split
        with self._cond:
            app.counts["answered"] += 1
            app.latencies.append(latency_ms)
            s.where[where] += 1
            s.bytes_sent += bytes_sent
            s.server_ms += server_ms
        scores = np.asarray(logits).tolist()
        frame.future.set_result(self._result(app.name, frame.seq, frame.tag, max(range(len(scores)), key=scores.__getitem__),
                                            frame.back(logits), level, exit_k, latency_ms, device_ms, where=where,
                                            bytes_sent=bytes_sent))

    def _split_fallback(self, app: App, frame: Frame, level: int, run: Callable[[], SplitAnswer],
                        device_ms: float, bytes_sent: int) -> None:
        """A split app's frame that no exit can answer after its request failed (from a waiter
        thread): queued as a job of the app, which the worker runs at the app's share and charges
        like a frame (:meth:`_serve_job`); an app that left, or a closed engine, runs it here, so
        the frame is still answered. The job runs the frame again on the app's capacity runtime at
        its level, not ``run`` (the split runtime's tail): the tail's sessions would hold the
        model's weights a second time, which the plan did not charge; ``run`` only once the app
        has left and its capacity runtime is gone."""
        def job() -> float:
            start = time.perf_counter()
            rt, at = app.runtime, app.level
            try:
                if rt is not None:
                    logits = rt(frame.x)[0]
                else:
                    out = run()
            except BaseException as e:  # one failing app never stops the others
                self._split_failed(app, frame, level, e)
                return 1e3 * (time.perf_counter() - start)
            ms = 1e3 * (time.perf_counter() - start)
            if rt is None:
                self._split_answer(app, frame, out, level, device_ms + ms)
            else:
                self._deliver(app, frame, logits, at, None, "fallback", device_ms + ms, bytes_sent, 0.0,
                              1e3 * (time.perf_counter() - frame.arrival))
            return ms

        with self._cond:
            queued = not self._closed and self._apps.get(app.name) is app
            if queued:
                app.jobs.append(job)
                self._cond.notify()
        if not queued:
            job()

    def _serve_job(self, app: App, job: Callable[[], float]) -> None:
        """On the worker: a job the app owes the device (:meth:`_split_fallback`), its time charged
        to the app's virtual finish time and the CPU quota as a frame's is."""
        level = app.level
        ms = job()
        self._after_frame(app, level, None, ms, None, time.perf_counter())

    @staticmethod
    def _run_owed(app: App) -> None:
        """Run the jobs ``app`` still owes now, on this thread: it left, or the engine closed (the
        frames are answered all the same)."""
        while app.jobs:
            app.jobs.popleft()()

    def _split_failed(self, app: App, frame: Frame, level: int, e: BaseException) -> None:
        with self._cond:
            app.counts["failed"] += 1
        frame.future.set_exception(self._error(f"app {app.name!r}: frame {frame.seq} failed at level {level} "
                                               f"(split): {type(e).__name__}: {e}"))

    def _split_done(self, app: App, ok: bool | None) -> None:
        """A request of a split app finished (a waiter thread): its slot is free, and the link's
        state may have changed enough to re-plan."""
        changed = self._link.record(ok) if ok is not None else False
        bw = self.network.bandwidth_mbps("realtime", default=self.link_mbps)
        with self._cond:
            app.split.inflight -= 1
            if changed or abs(bw - self._plan_link[0]) > self.replan_drift * self._plan_link[0]:
                self._link_event = "link" if changed else "bandwidth"
            self._cond.notify()

    def _link_tick(self) -> None:
        """On the worker, after a frame: re-plan on a link event, and probe a link that is down or unused."""
        now = time.perf_counter()
        # the link going down or up is an event, as an app joining is; a bandwidth drift waits min_replan_s
        if self._link_event == "link" or (self._link_event is not None and now - self._last_plan >= self.min_replan_s):
            reason, self._link_event = self._link_event, None
            try:
                self._plan(reason)
            except NestflexError as e:  # keep serving on the current plan; the next event tries again
                self.plans.append({"t": round(now - self._t0, 4), "reason": reason, "error": str(e)})
        idle = now - max(self._link.last_probe, self._link.last_ok) > self.probe_every_s
        if idle and (not self._link.up or self._joint):
            split = next((a.split for a in self._apps.values() if a.split is not None and a.split.inflight == 0
                          and a.split.last_x is not None), None)
            if split is not None:
                self._link.last_probe = now
                with self._cond:
                    split.inflight += 1  # the probe holds one of its slots
                probe(split, lambda ok, a=split: self._probe_done(a, ok))

    def _probe_done(self, split: Any, ok: bool) -> None:
        changed = self._link.record(ok)
        with self._cond:
            split.inflight -= 1
            if changed:
                self._link_event = "link"
            self._cond.notify()

