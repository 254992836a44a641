"""Split apps in the engine and the engine's joint planner (issue 41 items 1-3), over real sockets on
127.0.0.1: the in-process tail server, a ``nestflex serve`` process killed mid-stream, and a link
outage through the link emulator. Every frame is answered, and a failing server or link never
stalls the other apps."""

from __future__ import annotations

import gc
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import torch

import nestflex.deploy as nd
from nestflex.capacity import extract_level
from nestflex.deploy.engine import EngineError
from nestflex.deploy.scheduler.joint import JointAllocation, JointScheduler
from nestflex.deploy.split.client import SplitError, TailCall, TailClient
from nestflex.deploy.split.offload import Offloader, SplitConfig
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime
from nestflex.export import export_bundle
from nestflex.profiling import profile_split_quantization
from nestflex.serve import TailServer
from nestflex.testing.link import LinkModel, LinkProxy
from tests.deploy.test_engine import CALIBRATION, _rows
from tests.export.bundles import LEVELS, exits_on, nested_vgg

SPLIT = "features.relu4"


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """A 3-level nested VGG-11 x0.125 with level accuracies, calibrated SDN exits on its largest
    level and a split quantisation profile at 2/4/8 bits."""
    tmp = tmp_path_factory.mktemp("engine_split")
    net = nested_vgg(tmp)
    exits = exits_on(net)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(2)]
    profile = profile_split_quantization(extract_level(net, LEVELS - 1), batches, bitwidths=(2, 4, 8), size_samples=4)
    info = export_bundle(tmp / "split.nfx", net, exits=exits, levels=_rows(net), calibration=CALIBRATION,
                         onnx=False, split_profile=profile)
    return info["bundle"]


@pytest.fixture(scope="module")
def bundle(path):
    return nd.load(path)


@pytest.fixture(scope="module")
def server(bundle):
    with TailServer(bundle, max_wait_ms=1.0).run_in_thread() as handle:
        yield handle


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((3, 32, 32)).astype(np.float32)


class Pinned(JointScheduler):
    """The joint scheduler, with the split app pinned to one split configuration (the others as
    decided): a test needs to know which configuration runs."""

    def __init__(self, app: str, split: str | None, bits: int | None) -> None:
        super().__init__("total")
        self.app, self.split, self.bits = app, split, bits

    def schedule(self, apps, resources, *, alpha=0.5):
        d = super().schedule(apps, resources, alpha=alpha)
        app = next(a for a in apps if a.name == self.app)
        if resources.link_mbps == 0:  # the link is down: what the planner decided
            return d
        # the most accurate operating point at that split and bitwidth
        want = max((o for o in app.options if o.split == self.split and o.bits == self.bits), key=lambda o: o.accuracy)
        allocs = tuple(JointAllocation(a.app, want, a.cost, a.slowdown, a.fps) if a.app == self.app else a
                       for a in d.allocations)
        return type(d)(d.scheduler, d.objective, d.alpha, d.value, allocs, d.loads, d.memory_mb)


def test_a_split_app_answers_through_the_engine_as_its_offloader_does(bundle, server):
    with nd.Engine(Pinned("cam", SPLIT, None), max_pending=64, max_delay_periods=1e6) as engine:
        engine.add_app("cam", bundle, fps=30, tail=server.address, profile_repeats=1)
        engine.add_app("local", bundle, fps=30, profile_repeats=1)
        stats = engine.stats()["apps"]["cam"]
        assert stats["split"]["config"]["split"] == SPLIT and stats["split"]["config"]["bits"] is None
        got = [engine.infer("cam", _x(i), timeout=30) for i in range(12)]
        local = [engine.infer("local", _x(i), timeout=30) for i in range(3)]
        thresholds = engine.stats()["apps"]["cam"]["split"]["config"]["thresholds"]
    with TailClient(server.address, bundle) as c:
        off = Offloader(bundle, c, SplitConfig(SPLIT, bits=None, thresholds=None if thresholds is None
                                               else tuple(thresholds)))
        ref = [off.infer(_x(i)[None]) for i in range(12)]
    assert all(r.answered and r.where in ("device", "local", "server") for r in got)
    assert [r.prediction for r in got] == [int(np.argmax(a.result.logits[0])) for a in ref]
    for r, a in zip(got, ref):  # float32 crossing tensors: the server's answer is the offloader's
        np.testing.assert_allclose(r.logits, a.result.logits[0], rtol=1e-5, atol=1e-5)
    assert sum(r.bytes_sent for r in got) > 0 and any(r.where == "server" for r in got)
    assert all(r.answered and r.where is None for r in local)


def test_a_killed_server_every_frame_answered_and_the_planner_goes_local(path, bundle):
    proc = subprocess.Popen([sys.executable, "-m", "nestflex", "serve", str(path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, proc.stderr.read()
        address = line.split("listening on ")[1].split(" ")[0]
        with nd.Engine(Pinned("cam", SPLIT, 8), max_pending=64, max_delay_periods=1e6) as engine:
            engine.add_app("cam", bundle, fps=30, tail=address, deadline_ms=2000, profile_repeats=1)
            engine.add_app("other", bundle, fps=30, profile_repeats=1)
            got, other = [], []
            for i in range(16):
                if i == 6:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                got.append(engine.infer("cam", _x(i), timeout=30))
                other.append(engine.infer("other", _x(i), timeout=30))
            stats = engine.stats()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all(r.answered and r.prediction is not None for r in got + other)
    assert any(r.where == "server" for r in got[:6])
    assert any(r.where == "fallback" for r in got[6:])
    # after three failed requests in a row the link counts as down and the planner runs it locally
    assert stats["network"]["up"] is False and stats["apps"]["cam"]["split"]["config"] is None
    assert any(p.get("reason") == "link" for p in engine.plans)
    assert [r.where for r in got[-3:]] == [None] * 3


def test_a_link_outage_never_stalls_the_other_apps(bundle, server):
    port = int(server.address.rsplit(":", 1)[1])
    with LinkProxy(port, LinkModel(None, delay_ms=1.0)).run_in_thread() as link, \
            nd.Engine(Pinned("cam", SPLIT, 8), max_pending=64, max_delay_periods=1e6) as engine:
        engine.add_app("cam", bundle, fps=30, tail=f"127.0.0.1:{link.port}", deadline_ms=1500, profile_repeats=1)
        engine.add_app("other", bundle, fps=30, profile_repeats=1)
        assert engine.infer("cam", _x(0), timeout=30).where in ("server", "local", "device")
        link.proxy.set_down(True)  # a stall: nothing gets through, the request waits for its deadline
        hanging = engine.submit("cam", _x(1))
        other = [engine.infer("other", _x(i), timeout=30) for i in range(5)]
        # the other app was served while the split app's request waited on the link
        waiting = not hanging.done()
        late = hanging.result(timeout=30)  # past its deadline: answered on the device
        link.proxy.set_down(False)
        after = engine.infer("cam", _x(2), timeout=30)
    assert all(r.answered and r.where is None for r in other) and waiting
    assert late.answered and late.where == "fallback" and late.prediction is not None
    assert late.latency_ms >= 1400
    assert after.answered and after.prediction is not None


def test_the_joint_planner_offloads_only_when_the_device_is_short(bundle, server):
    from nestflex.deploy._engine_joint import joint_app

    with nd.Engine("joint_total", link_mbps=1000.0, server_speedup=50.0) as engine:
        engine.add_app("cam", bundle, fps=30, tail=server.address, profile_repeats=1)
        app = engine._apps["cam"]
        opts = app.joint[0].options
        # the app's options: every level, and the split rows of the largest (device-only ones included)
        assert {o.level for o in opts if o.split is None} == set(range(bundle.num_levels))
        assert any(o.split == SPLIT and o.bits == 8 for o in opts)

        def slow_device(factor):
            # a device this much slower at the levels and the device-only rows than at a split's head
            # (the tiny test model's split heads cost more than its levels on this CPU)
            app.level_ms = [v * factor for v in app.level_ms]
            app.split.rows = [{**r, "device_ms": r["device_ms"] * (factor if r["split"] is None else 1.0)}
                              for r in app.split.rows]
            app.joint = joint_app(app)

        engine._control(lambda: slow_device(2000.0))
        engine.replan()
        chosen = engine.decision.allocation("cam").option
        assert chosen.split is not None and chosen.bytes > 0, chosen
        assert engine.stats()["apps"]["cam"]["split"]["config"]["split"] == chosen.split
        engine._link.up = False  # what three failed requests in a row do
        engine.replan()
        assert engine.decision.allocation("cam").option.split is None
        assert engine.stats()["apps"]["cam"]["split"]["config"] is None
    with nd.Engine("joint_total") as engine:  # no tail: levels and exit points only
        engine.add_app("cam", bundle, fps=1, profile_repeats=1)
        assert engine.decision.allocation("cam").option.split is None
        assert engine.stats()["apps"]["cam"]["split"] is None
        assert engine.plans[-1]["apps"]["cam"]["option"] == engine.decision.allocation("cam").option.label


def test_each_split_row_comes_with_and_without_the_local_continuation(bundle, server):
    with nd.Engine("joint_total", link_mbps=1000.0, server_speedup=50.0) as engine:
        engine.add_app("cam", bundle, fps=30, tail=server.address, profile_repeats=1)
        specs = engine._apps["cam"].joint[1]
        sending = [o for o in specs if o.bytes > 0]
        assert sending and all(specs[o].config.continue_locally == o.continue_locally for o in sending)
        key = lambda o: (o.split, o.bits, o.point)  # noqa: E731
        direct = {key(o): o for o in sending if not o.continue_locally}
        with_local = {key(o): o for o in sending if o.continue_locally}
        assert direct.keys() == with_local.keys()
        for k, o in with_local.items():  # the same row, less the continuation's device time and sessions
            d = direct[k]
            assert d.label == o.label + ":direct"
            assert (d.accuracy, d.bytes, d.server_ms) == (o.accuracy, o.bytes, o.server_ms)
            assert d.device_ms <= o.device_ms and d.memory_mb <= o.memory_mb
        # a split point with an exit after it: its continuation runs that exit's segment on every frame sent
        assert any(direct[k].device_ms < o.device_ms and direct[k].memory_mb < o.memory_mb
                   for k, o in with_local.items())
        assert all(o.continue_locally for o in specs if o.split is None)


def test_an_offloading_app_keeps_its_level_unless_the_budget_needs_level_0():
    from types import SimpleNamespace as NS

    from nestflex.deploy._engine_apps import MB
    from nestflex.deploy._engine_joint import RunSpec, capacity_levels
    from nestflex.deploy.split.offload import SplitConfig

    held = [1 * MB, 2 * MB, 4 * MB]  # each level's bytes
    apps = [NS(name=n, level=k, level_bytes=held.__getitem__) for n, k in (("a", 2), ("b", 2), ("c", 1))]
    away = RunSpec(2, None, SplitConfig("s"))
    specs = {"a": away, "b": away, "c": RunSpec(1)}
    decision = NS(memory_mb=2 * (1 + 3) + 2)  # a and b charged level 0 + a 3 MB split runtime, c its level 1
    assert capacity_levels(apps, decision, specs, None) == {"a": 2, "b": 2, "c": 1}
    assert capacity_levels(apps, decision, specs, 16.0) == {"a": 2, "b": 2, "c": 1}  # 10 + 2 x 3 MB above level 0
    assert capacity_levels(apps, decision, specs, 13.0) == {"a": 0, "b": 2, "c": 1}
    assert capacity_levels(apps, decision, specs, 10.0) == {"a": 0, "b": 0, "c": 1}


def _dead_address() -> str:
    """An address on 127.0.0.1 nothing listens on (a port the OS gave and took back)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_server_only_fallback_runs_on_the_engine_worker_charged_to_its_app(bundle, monkeypatch):
    with nd.Engine("greedy_total", max_pending=64, max_delay_periods=1e6) as engine:
        engine.add_app("cam", bundle, fps=30, tail=_dead_address(), deadline_ms=2000, profile_repeats=1)
        engine.add_app("other", bundle, fps=30, profile_repeats=1)
        app = engine._apps["cam"]
        # the whole network on the server and no local continuation: a failed request leaves no exit
        # to answer from, so the frame runs again on the app's capacity runtime (a greedy plan keeps it)
        config = SplitConfig(SERVER_ONLY, bits=8, continue_locally=False, deadline_ms=2000)
        engine._control(lambda: app.split.set_config(config, None))
        runs: list[tuple[str, float]] = []
        capacity = app.runtime
        real_call = type(capacity).__call__

        def timed(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = real_call(self, *args, **kwargs)
            if self is capacity:  # the other app runs the same class
                runs.append((threading.current_thread().name, 1e3 * (time.perf_counter() - t0)))
            return out

        tails = []
        monkeypatch.setattr(SplitRuntime, "tail", lambda self, *a, **k: tails.append(1))
        monkeypatch.setattr(type(capacity), "__call__", timed)
        before = engine._control(lambda: app.finish)
        got, other = [], []
        for i in range(6):
            got.append(engine.infer("cam", _x(i), timeout=30))
            other.append(engine.infer("other", _x(i), timeout=30))
        charged = engine._control(lambda: app.finish) - before
        split_rt = app.split.offloader.runtime(SERVER_ONLY)
        opened = split_rt.resident_bytes
    assert all(r.answered and r.prediction is not None for r in got + other)
    fallbacks = [r for r in got if r.where == "fallback"]
    assert len(fallbacks) >= 3 and runs and not tails
    assert all(r.level == app.level and r.exit is None for r in fallbacks)  # the capacity runtime's answer
    # the split runtime opened no tail session: it holds what sending frames needs (nothing, server only)
    assert opened == split_rt.device_bytes(continue_locally=False) == 0
    # the runs were device work on the worker, never on the app's waiter threads ...
    assert {name for name, _ in runs} == {"nestflex-engine"}, runs
    # ... and advanced the app's virtual finish time (by ms / share, share <= 1) like its frames
    assert charged >= sum(ms for _, ms in runs)


class HeldTail:
    """A tail client whose requests fail (``UNAVAILABLE``): at once, or when released while ``held``."""

    def __init__(self) -> None:
        self.held, self.pending = False, []

    def submit(self, frame, **_):
        fut = Future()
        (self.pending.append if self.held else self.fail)(fut)
        return TailCall(fut, len(frame))

    def ping_ms(self, timeout=5.0):
        raise SplitError("no server", "UNAVAILABLE")

    @staticmethod
    def fail(fut):
        fut.set_exception(SplitError("no server", "UNAVAILABLE"))


@pytest.mark.parametrize("leave", ["remove_app", "close"])
def test_a_fallback_owed_when_its_app_leaves_is_still_answered(bundle, monkeypatch, leave):
    from nestflex.deploy.runtime import CapacityRuntime

    tail, names = HeldTail(), []
    # the fallback runs the frame on the app's capacity runtime, or once that is gone the split
    # runtime's tail: either way on the waiter thread, as no worker serves the app any more
    for cls, method in ((SplitRuntime, "tail"), (CapacityRuntime, "__call__")):
        def named(self, *args, _real=getattr(cls, method), **kwargs):
            names.append(threading.current_thread().name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, named)
    engine = nd.Engine("greedy_total")
    try:
        engine.add_app("cam", bundle, fps=30, tail=tail, deadline_ms=10_000, profile_repeats=1)
        app = engine._apps["cam"]
        config = SplitConfig(SERVER_ONLY, bits=8, continue_locally=False, deadline_ms=10_000)
        engine._control(lambda: app.split.set_config(config, None))
        tail.held = True
        pending = engine.submit("cam", _x(0))
        for _ in range(200):  # the request is in flight, its waiter waiting
            if tail.pending:
                break
            time.sleep(0.01)
        names.clear()
        if leave == "remove_app":
            engine.remove_app("cam")
        else:
            engine.close()
        for fut in tail.pending:  # the server fails once the app is gone: only the tail answers
            tail.fail(fut)
        got = pending.result(timeout=30)
    finally:
        engine.close()
    assert got.answered and got.where == "fallback" and got.prediction is not None
    assert names and all(n.startswith("nestflex-split") for n in names), names  # no worker serves it now


def test_a_split_option_is_charged_its_split_runtime_sessions(bundle, server):
    from nestflex.deploy._engine_apps import MB
    from nestflex.deploy._engine_joint import joint_app
    from nestflex.deploy._engine_split import _RUNTIMES

    with nd.Engine("joint_total", link_mbps=1000.0, server_speedup=50.0) as engine:
        engine.add_app("cam", bundle, fps=30, tail=server.address, profile_repeats=1)
        app = engine._apps["cam"]
        shared = _RUNTIMES[app.split.runtime_key].runtimes
        assert not shared  # measured at the join, then dropped: no app runs a split yet
        level0 = app.level_bytes(0)
        runs_split = [o for o, spec in app.joint[1].items() if spec.config is not None]
        rows = {(r["split"], r["bits"], r["point"]): r for r in app.split.rows}
        for o in runs_split:  # level 0 waits beside the sessions its split runtime opens to run it
            r = rows[(o.split, o.bits, o.point)]
            held = r["runtime_bytes"] if o.continue_locally else r["direct_bytes"]
            assert o.memory_mb == pytest.approx((level0 + held) / MB)
        held = {r["split"]: r["runtime_bytes"] for r in app.split.rows if r["split"] is not None}
        assert held[SPLIT] > 0 and held[SERVER_ONLY] > 0  # the head's sessions, or the continuation's
        # sending the whole frame without the continuation opens nothing on the device
        assert min(o.memory_mb for o in runs_split) == pytest.approx(level0 / MB)

        def slow_device():  # the levels 2000 times slower: the planner wants to offload (as above)
            app.level_ms = [v * 2000.0 for v in app.level_ms]
            app.split.rows = [{**r, "device_ms": r["device_ms"] * (2000.0 if r["split"] is None else 1.0)}
                              for r in app.split.rows]
            app.joint = joint_app(app)

        engine._control(slow_device)
        engine.replan()
        chosen = engine.decision.allocation("cam").option
        level = app.level
        assert chosen.split is not None and level > 0  # no budget: the capacity runtime stays where it was
        # the process holds the split runtime it runs and nothing else of the bundle's
        assert [rt.split for rt in shared.values()] == [chosen.split]
        engine.set_budget(memory_mb=chosen.memory_mb)  # what the option was charged: level 0 and its runtime
        assert engine.decision.allocation("cam").option == chosen and app.level == 0
        assert engine.resident_bytes() <= chosen.memory_mb * MB + 1
        # room for level 0 and less than any continuation's sessions: what runs fits, and is held
        budget = (level0 + min(held.values()) / 2) / MB
        engine.set_budget(memory_mb=budget)
        chosen = engine.decision.allocation("cam").option
        assert chosen.memory_mb <= budget and not (chosen.split is not None and chosen.continue_locally), chosen
        assert app.level == 0 and engine.resident_bytes() <= budget * MB


def test_a_config_taken_up_again_opens_its_sessions_again(bundle, server):
    with nd.Engine("greedy_total") as engine:
        engine.add_app("cam", bundle, fps=30, tail=server.address, profile_repeats=1)
        s = engine._apps["cam"].split
        config = SplitConfig(SPLIT, bits=8, continue_locally=True)
        for c in (config, None, config):  # its runtime is dropped while no app runs it, then rebuilt
            engine._control(lambda c=c: s.set_config(c, None))
        rt = s.offloader.runtime(SPLIT)
        assert rt.next_exit is not None and rt.resident_bytes == rt.device_bytes(continue_locally=True)


def test_apps_of_one_bundle_share_a_split_runtime_released_with_the_last(bundle, server):
    from nestflex.deploy import _engine_split

    with nd.Engine("greedy_total") as engine:
        engine.add_app("a", bundle, fps=30, tail=server.address, profile_repeats=1)
        engine.add_app("b", bundle, fps=30, tail=server.address, profile_repeats=1)
        a, b = engine._apps["a"].split, engine._apps["b"].split
        key = f"{Path(bundle.path).resolve()}|exits"  # one entry per bundle and exit set
        assert a.offloader._runtimes is b.offloader._runtimes
        assert a.offloader.runtime(None) is b.offloader.runtime(None)
        held = weakref.ref(a.offloader.runtime(None))
        del a, b
        engine.remove_app("a")
        assert key in _engine_split._RUNTIMES  # "b" still runs it
        engine.remove_app("b")
        assert key not in _engine_split._RUNTIMES
        # nothing else holds the sessions: they go once the apps' waiters and clients are closed
        for _ in range(100):
            gc.collect()
            if held() is None:
                break
            time.sleep(0.05)
        assert held() is None


def test_bad_split_arguments_are_refused_naming_them(bundle, server):
    with nd.Engine("joint_total") as engine:
        with pytest.raises(EngineError, match=r"app 'cam': with a `tail` the exits run in the offloader"):
            engine.add_app("cam", bundle, tail=server.address, exit_set="flex_exits")
        with pytest.raises(EngineError, match=r"app 'cam': `depth` must be an int >= 1"):
            engine.add_app("cam", bundle, tail=server.address, depth=0)
        with pytest.raises(EngineError, match=r"app 'cam': `tail` must be a 'host:port' address or a tail client"):
            engine.add_app("cam", bundle, tail=5)
    with pytest.raises(EngineError, match=r"`server_capacity` is out of range"):
        nd.Engine("joint_total", server_capacity=-1)
