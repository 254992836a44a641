"""Split runtime (head / tail / combine), wire format and the split scheduler: in-process, no network.

The split runtime runs on onnxruntime, numpy in and numpy out; torch appears here only as the
eager reference (``torch_program.run_program``) and to check that torch in gives torch out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nestflex.deploy as nd
import nestflex.deploy.split as split_pkg
import nestflex.serve as serve_pkg
from nestflex.deploy.backends.torch_program import run_program
from nestflex.deploy.bundle.loader import bundle_id
from nestflex.deploy.bundle.weights import level_tensors
from nestflex.deploy.codec import decode, encode
from nestflex.deploy.engine import operating_points
from nestflex.deploy.exits import apply_policy
from nestflex.deploy.scheduler import SchedulerError
from nestflex.deploy.scheduler.split import SplitCosts, SplitScheduler
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs
from nestflex.deploy.split.runtime import SERVER_ONLY, HeadResult, SplitRuntime, TailResult, split_names
from nestflex.deploy.split.wire import (
    WireError,
    decode_response,
    encode_response,
    parse_request_metadata,
    request_metadata,
)
from tests.deploy.split_bundle import write_split_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return nd.load(write_split_bundle(tmp_path_factory.mktemp("split")))


def _x(n=12, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def _assert_same_answer(out, ref, name=""):
    # invariant 4: the same graphs' arithmetic on both paths, so equal (not merely close)
    np.testing.assert_array_equal(out.logits, ref.logits, err_msg=name)
    np.testing.assert_array_equal(out.exit_index, ref.exit_index, err_msg=name)
    np.testing.assert_array_equal(out.answer_index, ref.answer_index, err_msg=name)
    # the unsplit runtime's fused single-frame graph computes its softmax in onnxruntime: an ulp apart
    np.testing.assert_allclose(out.confidence, ref.confidence, rtol=1e-6, atol=0, err_msg=name)


@pytest.mark.parametrize("thresholds", [None, [0.0, 0.0], [1.0, 1.0], [0.15, 0.2]])
def test_head_tail_combine_equals_the_unsplit_runtime_at_every_split(bundle, thresholds):
    x = _x()
    prog = nd.ProgressiveRuntime(bundle, exit_set="exits")
    ref = prog(x, thresholds=thresholds)
    for name in split_names(bundle):
        rt = SplitRuntime(bundle, name, "exits")
        head = rt.head(x, thresholds)
        tail = rt.tail(head.crossing, thresholds) if head.rest.size else None
        out = rt.combine(head, tail)
        assert all(type(a) is np.ndarray for a in (out.logits, out.exit_index, out.answer_index, out.confidence))
        _assert_same_answer(out, ref, name)


def test_single_frames_equal_the_unsplit_runtime(bundle):
    # one frame is what a device sends; the unsplit runtime answers it with its fused graph
    prog = nd.ProgressiveRuntime(bundle, exit_set="exits")
    rts = [SplitRuntime(bundle, name, "exits") for name in split_names(bundle)]
    for i in range(4):
        x = _x(1, seed=i)
        for thresholds in (None, [0.15, 0.2]):
            ref = prog(x, thresholds=thresholds)
            for rt in rts:
                _assert_same_answer(rt(x, thresholds), ref, rt.split)


def test_a_bundle_shipping_onnx_splits_its_programs_graphs_and_runs_its_shipped_heads(tmp_path_factory):
    # the unsplit runtime runs the stage graphs torch.onnx wrote; the split runs graphs written from
    # the program (any cut): float32 rounding apart, the same decisions
    from nestflex.export import export_bundle
    from tests.export.bundles import exits_on, nested_vgg

    tmp = tmp_path_factory.mktemp("split_onnx")
    net = nested_vgg(tmp)
    export_bundle(tmp / "o.nfx", net, exits=exits_on(net), thresholds=[0.5, 0.6], onnx=True,
                  mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    bundle = nd.load(tmp / "o.nfx")
    assert {o.kind for o in bundle.spec.onnx} >= {"stage", "exit"}
    x = _x(8, seed=3)
    prog = nd.ProgressiveRuntime(bundle, exit_set="exits")
    for thresholds in (None, [0.15, 0.2]):
        ref = prog(x, thresholds)
        for name in split_names(bundle):
            out = SplitRuntime(bundle, name, "exits")(x, thresholds)
            np.testing.assert_allclose(out.logits, ref.logits, atol=1e-5, rtol=0, err_msg=name)
            np.testing.assert_array_equal(out.exit_index, ref.exit_index, err_msg=name)
            np.testing.assert_array_equal(out.answer_index, ref.answer_index, err_msg=name)


def _eager_reference(bundle, x, thresholds):
    """The exit set's answer from the torch eager interpreter: the whole program at the largest level,
    each head's program on its tap, then the shared policy."""
    top = bundle.num_levels - 1
    nodes = bundle.spec.capacity.program.nodes
    tensors = {k: torch.from_numpy(v) for k, v in level_tensors(bundle, top).items()}
    env = {nodes[0].name: torch.from_numpy(x)}
    final = run_program(nodes, env, tensors, top)
    ex = bundle.spec.exit_set("exits")
    logits = []
    for tap, head in zip(ex.taps, ex.heads):
        hnodes = head.program.nodes
        weights = level_tensors(bundle, 0, head.program.tensor_names(), {}, 1)
        logits.append(run_program(hnodes, {hnodes[0].name: env[tap]}, {k: torch.from_numpy(v) for k, v in
                                                                        weights.items()}, 0))
    return apply_policy([*logits, final], ex.thresholds if thresholds is None else thresholds, ex.confidence,
                        ex.fallback)


@pytest.mark.parametrize("thresholds", [None, [1.0, 1.0], [0.15, 0.2]])
def test_every_split_agrees_with_the_torch_eager_reference(bundle, thresholds):
    x = _x(8, seed=5)
    ref = _eager_reference(bundle, x, thresholds)
    for name in split_names(bundle):
        out = SplitRuntime(bundle, name, "exits")(x, thresholds)
        np.testing.assert_allclose(out.logits, ref.logits.numpy(), atol=1e-4, rtol=0, err_msg=name)
        np.testing.assert_array_equal(out.exit_index, ref.exit_index.numpy(), err_msg=name)
        np.testing.assert_array_equal(out.answer_index, ref.answer_index.numpy(), err_msg=name)


def test_a_device_opens_the_heads_sessions_and_the_tails_only_when_a_frame_runs_them(bundle):
    x = _x(4)
    for split in split_names(bundle):
        rt = SplitRuntime(bundle, split)
        # what crosses the cut, named by the bundle, is what the first tail session reads
        first = rt._server[0].run.open().session.get_inputs()
        assert rt.crossing_shapes == [tuple(int(d) for d in i.shape[1:]) for i in first], split
        rt = SplitRuntime(bundle, split)
        assert rt.resident_bytes == rt.device_bytes(continue_locally=False) < rt.own_bytes, split
        never = [1.0] * (rt.num_exits - 1)
        head = rt.head(x, never)
        assert rt.resident_bytes == rt.device_bytes(False)  # the head ran on what was open
        if rt.next_exit is not None:
            rt.next_local_exit(head)
            assert rt.resident_bytes == rt.device_bytes(continue_locally=True) > rt.device_bytes(False), split
        rt.combine(head, rt.tail(head.crossing, never))
        assert rt.resident_bytes == rt.own_bytes, split  # a frame ran the tail here: every session is open
    assert SplitRuntime(bundle, SERVER_ONLY).device_bytes(False) == 0  # sending the input needs no session
    # a config switch opens what its frames run, between frames (no frame opens a session)
    from nestflex.deploy.split.offload import Offloader, SplitConfig

    split = next(s for s in split_names(bundle) if SplitRuntime(bundle, s).next_exit is not None)
    for local in (True, False):
        off = Offloader(bundle, object(), SplitConfig(split, continue_locally=local))  # a client never called
        rt = off.runtime(split)
        assert rt.resident_bytes == rt.device_bytes(local), local
    off = Offloader(bundle, None, SplitConfig(split))  # no server: the device runs the whole network
    assert off.runtime(split).resident_bytes == off.runtime(split).own_bytes


def test_torch_in_gives_torch_out_and_the_parts_stay_numpy(bundle):
    x = _x(6, seed=2)
    rt = SplitRuntime(bundle, "features.relu4", "exits")
    want = rt(x, [0.15, 0.2])
    head = rt.head(torch.from_numpy(x), [0.15, 0.2])
    assert isinstance(head, HeadResult) and all(type(a) is np.ndarray for a in (head.logits, head.rest, *head.crossing))
    tail = rt.tail(head.crossing, [0.15, 0.2])
    assert isinstance(tail, TailResult) and all(type(a) is np.ndarray for a in vars(tail).values())
    got = rt.combine(head, tail)
    assert all(isinstance(a, torch.Tensor) for a in (got.logits, got.exit_index, got.answer_index, got.confidence))
    assert got.exit_index.dtype == torch.int64 and got.confidence.dtype == torch.float32
    np.testing.assert_array_equal(got.logits.numpy(), want.logits)
    np.testing.assert_array_equal(got.answer_index.numpy(), want.answer_index)
    # a torch tensor crossing is read as numpy
    np.testing.assert_array_equal(rt.tail([torch.from_numpy(t) for t in head.crossing], [0.15, 0.2]).logits,
                                  tail.logits)


def test_the_offloader_answers_in_the_type_of_its_frames(bundle):
    from nestflex.deploy.split.offload import Offloader, SplitConfig

    x = _x(3, seed=4)
    want = nd.ProgressiveRuntime(bundle, exit_set="exits")(x)
    off = Offloader(bundle, None, SplitConfig(None))  # device only: head and tail run here
    got = off.infer(x)
    assert got.where == "device" and type(got.result.logits) is np.ndarray
    _assert_same_answer(got.result, want)
    got = off.infer(torch.from_numpy(x)).result
    assert isinstance(got.logits, torch.Tensor) and isinstance(got.answer_index, torch.Tensor)
    np.testing.assert_array_equal(got.logits.numpy(), want.logits)


def test_every_exit_passes_at_some_split_and_samples_leave_before_the_cut(bundle):
    x = _x()
    rt = SplitRuntime(bundle, "features.relu5", "exits")  # both exits (relu3, relu5) on the device
    assert rt.device_exits == 2 and rt.next_exit is None
    head = rt.head(x, [0.0, 0.0])  # exit 0 takes every sample: nothing crosses
    assert head.rest.size == 0
    assert [t.shape for t in head.crossing] == [(0, *s) for s in rt.crossing_shapes]
    np.testing.assert_array_equal(rt.combine(head, None).exit_index, np.zeros(12, dtype=np.int64))
    empty = rt.tail(head.crossing, [0.0, 0.0])  # an empty batch is answered with no rows
    assert empty.logits.shape == (0, 10) and empty.passed.shape == (0,)


def test_backbone_alone_and_server_only_split(bundle):
    x = _x(4)
    final = nd.CapacityRuntime(bundle, bundle.num_levels - 1)(x)
    for name in (SERVER_ONLY, "features.relu2"):
        rt = SplitRuntime(bundle, name, None)
        assert rt.num_exits == 1
        np.testing.assert_array_equal(rt(x).logits, final)
    assert SplitRuntime(bundle, SERVER_ONLY, None).crossing_shapes == [(3, 32, 32)]


def test_without_the_server_the_device_answers_from_its_best_exit(bundle):
    x = _x()
    prog = nd.ProgressiveRuntime(bundle, exit_set="exits")
    rt = SplitRuntime(bundle, "features.relu4", "exits")  # exit 0 on the device, exit 1 after the split
    head = rt.head(x, [1.0, 1.0])
    out = rt.combine(head, None)
    np.testing.assert_array_equal(out.exit_index, np.zeros(12, dtype=np.int64))
    np.testing.assert_array_equal(out.logits, prog.exit_logits(x, 0))
    # SPINN's continuation: the next exit after the split, on the device
    logits, _, k = rt.next_local_exit(head)
    assert k == 1
    np.testing.assert_array_equal(logits, prog.exit_logits(x, 1))
    with pytest.raises(nd.BundleError, match="no device exit"):
        SplitRuntime(bundle, SERVER_ONLY, "exits").combine(SplitRuntime(bundle, SERVER_ONLY, "exits").head(x), None)


def test_bad_split_and_bad_crossing_tensors_are_refused(bundle):
    with pytest.raises(nd.BundleError, match="`split` must be one of"):
        SplitRuntime(bundle, "features.nope")
    with pytest.raises(nd.BundleError, match="`exit_set` must be one of"):
        SplitRuntime(bundle, "features.relu2", "nope")
    with pytest.raises(nd.BundleError, match="`threads` must be an int >= 1"):
        SplitRuntime(bundle, "features.relu2", threads=0)
    with pytest.raises(nd.BundleError, match="`providers` must be None"):
        SplitRuntime(bundle, "features.relu2", providers="CPUExecutionProvider")
    rt = SplitRuntime(bundle, "features.relu2", "exits")
    with pytest.raises(nd.BundleError, match="per-sample shapes"):
        rt.tail([np.zeros((1, 3, 32, 32), np.float32)])
    with pytest.raises(nd.BundleError, match="`x` must be a float array"):
        rt.head(np.zeros((1, 3, 16, 16), np.float32))


def test_a_float_frame_carries_the_crossing_tensors_exactly(bundle):
    x = _x(3)
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    head = rt.head(x, [1.0, 1.0])
    sent = decode(encode(list(head.crossing), bits=None, codec="blosc_lz4"))
    assert all(np.array_equal(a, b) for a, b in zip(sent, head.crossing))
    np.testing.assert_array_equal(rt.combine(head, rt.tail(sent, [1.0, 1.0])).logits,
                                  nd.ProgressiveRuntime(bundle, exit_set="exits")(x, thresholds=[1.0, 1.0]).logits)


def test_wire_metadata_and_response_round_trip(bundle):
    md = request_metadata(bundle_id(bundle), "features.relu3", "exits", [0.5, 0.25])
    req = parse_request_metadata(md)
    assert (req.split, req.exit_set, req.thresholds) == ("features.relu3", "exits", [0.5, 0.25])
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    head = rt.head(_x(5), [1.0, 1.0])
    median = float(np.median(rt.next_local_exit(head)[1]))  # exit 1 (after the split) takes some samples
    tail = rt.tail(head.crossing, [1.0, median])
    assert tail.passed.any() and not tail.passed.all()  # both kinds of rows go over the wire
    back = decode_response(encode_response(tail), 5, 10, rt.num_exits)
    for name, a in vars(tail).items():
        b = getattr(back, name)
        assert type(b) is np.ndarray and b.dtype == a.dtype, name
        np.testing.assert_array_equal(b, a, err_msg=name)


@pytest.mark.parametrize("edit, match", [
    ({"nf-protocol": "2"}, "protocol version"),
    ({"nf-split": ""}, "nf-split"),
    ({"nf-split": "x" * 300}, "nf-split"),
    ({"nf-thresholds": "0.5,nan"}, "thresholds"),
    ({"nf-thresholds": "0.5,abc"}, "comma-separated"),
    ({"nf-thresholds": ",".join(["0.5"] * 65)}, "at most"),
])
def test_bad_request_metadata_is_a_wire_error(bundle, edit, match):
    md = dict(request_metadata(bundle_id(bundle), "features.relu3", "exits", [0.5, 0.5]))
    md.update(edit)
    with pytest.raises(WireError, match=match):
        parse_request_metadata(md)


def test_a_forged_response_is_refused(bundle):
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    tail = rt.tail(rt.head(_x(2), [1.0, 1.0]).crossing, [1.0, 1.0])
    tail.exit_index[0] = 7  # no such exit
    with pytest.raises(WireError, match="exit indices"):
        decode_response(encode_response(tail), 2, 10, rt.num_exits)
    with pytest.raises(WireError, match="must hold logits"):
        decode_response(encode_response(tail), 3, 10, rt.num_exits)


# -- no torch ------------------------------------------------------------------------------------------

_OWNED = [*sorted(Path(split_pkg.__file__).parent.glob("*.py")), *sorted(Path(serve_pkg.__file__).parent.glob("*.py"))]


def test_split_and_serve_sources_never_import_torch():
    # also catches an import in a function body or a branch no run takes
    for path in _OWNED:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path.name}:{node.lineno}"


# A fresh interpreter where `import torch` fails. `nestflex.deploy` is a bare package there (its
# __init__ still reaches torch through modules outside split/serve, issue 37), so what is checked
# is the split and serve modules' own imports and their numpy paths: head, tail, combine, the
# continuation, the wire format, the server's decode and batch, the costs.
_WITHOUT_TORCH = """
import importlib.abc, sys, types
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
import nestflex
pkg = types.ModuleType("nestflex.deploy")
pkg.__path__ = [nestflex.__path__[0] + "/deploy"]
sys.modules["nestflex.deploy"] = pkg
import numpy as np
import nestflex.deploy.split as sp
import nestflex.serve.server as server
import nestflex.serve.ray
from nestflex.deploy.bundle.loader import load
from nestflex.deploy.codec import encode
from nestflex.deploy.split.wire import decode_response, encode_response, parse_request_metadata, request_metadata
bundle = load({path!r})
x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
rt = sp.SplitRuntime(bundle, "features.relu4", "exits")
head = rt.head(x, [1.0, 1.0])
assert rt.next_local_exit(head)[2] == 1
core = server.TailCore(bundle, providers="cpu")
req = parse_request_metadata(request_metadata(core.id, rt.split, "exits", [1.0, 1.0]))
arrays, n = core.prepare(req, encode(list(head.crossing), bits=None))
item = types.SimpleNamespace(request=req, tensors=arrays)
tail = core.split_result(core.run_batch([item, item])[0], [n, n])[1]
tail = decode_response(encode_response(tail), n, 10, rt.num_exits)
out = rt.combine(head, tail)
assert np.array_equal(out.logits, rt(x, [1.0, 1.0]).logits)
sp.measure_bytes(bundle, x[:2], bits=(None, 8))
sp.measure_costs(bundle, "exits", repeats=1)
print("torch" in sys.modules)
"""


def test_split_and_the_tail_server_run_with_torch_blocked(bundle):
    code = _WITHOUT_TORCH.format(path=str(bundle.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"


# -- offline profiles and the scheduler ----------------------------------------------------------------


def test_measured_profiles_cover_every_split(bundle):
    costs = measure_costs(bundle, "exits", repeats=3)
    assert len(costs.segment_ms) == len(costs.cuts) + 1 and all(t > 0 for t in costs.segment_ms)
    assert set(costs.split_at) == set(split_names(bundle)) and set(costs.head_ms) == {0, 1}
    sizes = measure_bytes(bundle, _x(4), bits=(None, 4))
    assert sizes == measure_bytes(bundle, torch.from_numpy(_x(4)), bits=(None, 4))  # torch samples alike
    assert set(sizes) == {(s, b) for s in split_names(bundle) for b in (None, 4)}
    assert all(sizes[(s, 4)] < sizes[(s, None)] for s in split_names(bundle))
    drops = accuracy_drops(bundle)
    assert {b for (_, b) in drops} == {2, 4, 8, None} and all(0 <= v <= 1 for v in drops.values())


def _toy(**kw):
    costs = SplitCosts(cuts=("t0", "s1", "s2"), segment_ms=(2.0, 2.0, 4.0, 2.0), head_ms={0: 0.5},
                       exit_at={"t0": 0}, split_at={SERVER_ONLY: None, "s1": "s1", "s2": "s2"}, num_exits=2)

    class P:
        def __init__(self, thr, acc, rate):
            self.thresholds, self.accuracy, self.exit_rate = thr, acc, rate

    points = [P((0.5,), 0.90, (0.5, 0.5)), P((0.9,), 0.95, (0.1, 0.9))]
    sizes = {(s, b): size / (4 if b == 8 else 1) for s, size in ((SERVER_ONLY, 12000), ("s1", 40000), ("s2", 8000))
             for b in (None, 8)}
    drops = {(s, 8): 0.02 for s in ("s1", "s2", SERVER_ONLY)}
    return SplitScheduler(costs, sizes, points, accuracy_drop=drops, bits=(None, 8), **kw)


def test_predictions_follow_the_documented_model():
    s = _toy(server_speedup=2.0)
    o = s.predict("s2", 8, 0, bandwidth_mbps=8.0, latency_ms=4.0)
    # device: t0 (2 + head 0.5) then half the frames run s1, s2 (2 + 4); sent share 0.5
    assert o.device_ms == pytest.approx(2.5 + 0.5 * 6.0) and o.sent == pytest.approx(0.5)
    assert o.network_ms == pytest.approx(4.0 + 8 * 2000 / 8000) and o.bytes == pytest.approx(1000)
    assert o.server_ms == pytest.approx(2.0 / 2.0)  # the tail, per frame sent, at 2x speed
    assert o.latency_ms == pytest.approx(o.device_ms + 0.5 * (o.network_ms + o.server_ms))
    assert o.accuracy == pytest.approx(0.90 - 0.5 * 0.02)
    assert o.throughput_fps == pytest.approx(1000 / o.latency_ms)
    piped = _toy(server_speedup=2.0, depth=3).predict("s2", 8, 0, bandwidth_mbps=8.0, latency_ms=4.0)
    assert piped.throughput_fps == pytest.approx(min(1000 / max(o.device_ms, 0.5 * o.network_ms, 0.5 * o.server_ms),
                                                     3000 / o.latency_ms))
    device = s.predict(None, None, 1, bandwidth_mbps=8.0, latency_ms=4.0)
    assert device.sent == 0 and device.device_ms == pytest.approx(2.5 + 0.9 * 8.0)


def test_the_choice_follows_bandwidth_and_constraints():
    s = _toy(server_speedup=8.0, depth=4)
    fast = s.plan(bandwidth_mbps=1000.0, latency_ms=0.5)
    slow = s.plan(bandwidth_mbps=0.05, latency_ms=50.0)
    assert fast.option.split == SERVER_ONLY and slow.option.split is None  # offload when the link is good
    acc = _toy(server_speedup=8.0, constraints=[("accuracy", ">=", 0.94)]).plan(bandwidth_mbps=1000.0, latency_ms=0.5)
    assert acc.option.accuracy >= 0.94 and acc.feasible > 0 and not acc.relaxed
    # an impossible SLO is relaxed (best effort: the lowest latency), the accuracy floor still holds
    r = _toy(server_speedup=8.0, constraints=[("accuracy", ">=", 0.94), ("latency_ms", "<=", 0.001)]).plan(
        bandwidth_mbps=10.0, latency_ms=5.0)
    assert r.relaxed == ("latency_ms <= 0.001",) and r.option.accuracy >= 0.94 and r.feasible == 0
    best = min(o.latency_ms for o in _toy(server_speedup=8.0).options(bandwidth_mbps=10.0, latency_ms=5.0)
               if o.accuracy is not None and o.accuracy >= 0.94)
    assert r.option.latency_ms == pytest.approx(best, rel=0.011)


def test_replan_fires_only_when_an_input_moves_more_than_the_threshold():
    s = _toy()
    assert s.needs_replan(bandwidth_mbps=10.0, latency_ms=5.0)
    s.plan(bandwidth_mbps=10.0, latency_ms=5.0)
    assert not s.needs_replan(bandwidth_mbps=10.4, latency_ms=5.1)
    assert s.needs_replan(bandwidth_mbps=11.0, latency_ms=5.0)


def test_bad_rules_are_refused():
    with pytest.raises(SchedulerError, match="constraint"):
        _toy(constraints=[("latency", "<=", 1)])
    with pytest.raises(SchedulerError, match="target"):
        _toy(targets=[("accuracy", "best")])


def test_the_scheduler_plans_a_real_bundle_in_milliseconds(bundle):
    points, _, _ = operating_points(bundle, "exits")
    s = SplitScheduler(measure_costs(bundle, "exits", repeats=3), measure_bytes(bundle, _x(4), bits=(None, 2, 4, 8)),
                       points, accuracy_drop=accuracy_drops(bundle), bits=(None, 2, 4, 8),
                       constraints=[("accuracy", ">=", 0.0)])
    plan = s.plan(bandwidth_mbps=5.0, latency_ms=10.0)
    assert plan.candidates == (len(split_names(bundle)) * 4 + 1) * len(points)
    assert plan.decision_ms < 1000  # measured figures are the benchmark's; this only catches a blow-up
