"""Split runtime (head / tail / combine), wire format and the split scheduler: in-process, no network."""

from __future__ import annotations

import pytest
import torch

import nestflex.deploy as nd
from nestflex.deploy.codec import decode, encode
from nestflex.deploy.engine import operating_points
from nestflex.deploy.scheduler import SchedulerError
from nestflex.deploy.scheduler.split import SplitCosts, SplitScheduler
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime, split_names
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs
from nestflex.deploy.split.wire import WireError, decode_response, encode_response, parse_request_metadata, request_metadata
from nestflex.deploy.bundle.loader import bundle_id
from tests.deploy.split_bundle import write_split_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return nd.load(write_split_bundle(tmp_path_factory.mktemp("split")))


def _x(n=12, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("thresholds", [None, [0.0, 0.0], [1.0, 1.0], [0.15, 0.2]])
def test_head_tail_combine_equals_the_unsplit_runtime_at_every_split(bundle, thresholds):
    x = _x()
    prog = nd.ProgressiveRuntime(bundle, exit_set="exits")
    ref = prog(x, thresholds=thresholds)
    for name in split_names(bundle):
        rt = SplitRuntime(bundle, name, "exits")
        head = rt.head(x, thresholds)
        tail = rt.tail(head.crossing, thresholds) if head.rest.numel() else None
        out = rt.combine(head, tail)
        assert torch.equal(out.logits, ref.logits), name
        assert torch.equal(out.exit_index, ref.exit_index) and torch.equal(out.answer_index, ref.answer_index), name


def test_every_exit_passes_at_some_split_and_samples_leave_before_the_cut(bundle):
    x = _x()
    rt = SplitRuntime(bundle, "features.relu5", "exits")  # both exits (relu3, relu5) on the device
    assert rt.device_exits == 2 and rt.next_exit is None
    head = rt.head(x, [0.0, 0.0])  # exit 0 takes every sample: nothing crosses
    assert head.rest.numel() == 0 and head.crossing[0].shape[0] == 0
    assert torch.equal(rt.combine(head, None).exit_index, torch.zeros(12, dtype=torch.long))


def test_backbone_alone_and_server_only_split(bundle):
    x = _x(4)
    final = nd.CapacityRuntime(bundle, bundle.num_levels - 1)(x)
    for name in (SERVER_ONLY, "features.relu2"):
        rt = SplitRuntime(bundle, name, None)
        assert rt.num_exits == 1
        assert torch.equal(rt(x).logits, final)
    assert SplitRuntime(bundle, SERVER_ONLY, None).crossing_shapes == [(3, 32, 32)]


def test_without_the_server_the_device_answers_from_its_best_exit(bundle):
    x = _x()
    rt = SplitRuntime(bundle, "features.relu4", "exits")  # exit 0 on the device, exit 1 after the split
    head = rt.head(x, [1.0, 1.0])
    out = rt.combine(head, None)
    assert torch.equal(out.exit_index, torch.zeros(12, dtype=torch.long))
    assert torch.equal(out.logits, nd.ProgressiveRuntime(bundle, exit_set="exits").exit_logits(x, 0))
    # SPINN's continuation: the next exit after the split, on the device
    logits, conf, k = rt.next_local_exit(head)
    assert k == 1 and torch.equal(logits, nd.ProgressiveRuntime(bundle, exit_set="exits").exit_logits(x, 1))
    with pytest.raises(nd.BundleError, match="no device exit"):
        SplitRuntime(bundle, SERVER_ONLY, "exits").combine(SplitRuntime(bundle, SERVER_ONLY, "exits").head(x), None)


def test_bad_split_and_bad_crossing_tensors_are_refused(bundle):
    with pytest.raises(nd.BundleError, match="`split` must be one of"):
        SplitRuntime(bundle, "features.nope")
    rt = SplitRuntime(bundle, "features.relu2", "exits")
    with pytest.raises(nd.BundleError, match="per-sample shapes"):
        rt.tail([torch.zeros(1, 3, 32, 32)])


def test_a_float_frame_carries_the_crossing_tensors_exactly(bundle):
    x = _x(3)
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    head = rt.head(x, [1.0, 1.0])
    sent = [torch.from_numpy(t) for t in decode(encode(list(head.crossing), bits=None, codec="blosc_lz4"))]
    assert all(torch.equal(a, b) for a, b in zip(sent, head.crossing))
    assert torch.equal(rt.combine(head, rt.tail(sent, [1.0, 1.0])).logits,
                       nd.ProgressiveRuntime(bundle, exit_set="exits")(x, thresholds=[1.0, 1.0]).logits)


def test_wire_metadata_and_response_round_trip(bundle):
    md = request_metadata(bundle_id(bundle), "features.relu3", "exits", [0.5, 0.25])
    req = parse_request_metadata(md)
    assert (req.split, req.exit_set, req.thresholds) == ("features.relu3", "exits", [0.5, 0.25])
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    tail = rt.tail(rt.head(_x(5), [1.0, 1.0]).crossing, [1.0, 1.0])
    back = decode_response(encode_response(tail), 5, 10, rt.num_exits)
    assert torch.equal(back.logits, tail.logits) and torch.equal(back.exit_index, tail.exit_index)
    assert torch.equal(back.passed, tail.passed)


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


# -- offline profiles and the scheduler ----------------------------------------------------------------


def test_measured_profiles_cover_every_split(bundle):
    costs = measure_costs(bundle, "exits", repeats=3)
    assert len(costs.segment_ms) == len(costs.cuts) + 1 and all(t > 0 for t in costs.segment_ms)
    assert set(costs.split_at) == set(split_names(bundle)) and set(costs.head_ms) == {0, 1}
    sizes = measure_bytes(bundle, _x(4), bits=(None, 4))
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
