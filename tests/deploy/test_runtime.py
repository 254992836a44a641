"""Parity of the deploy runtimes with the training model; paging and memory of set_level."""

import pytest
import torch

import nestflex.deploy as nd
from nestflex.capacity import set_level
from nestflex.capacity.profile import used_masks
from tests.export.bundles import LEVELS, write_bundle


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    info, net, exits = write_bundle(tmp_path_factory.mktemp("runtime"), onnx=False)
    return nd.load(info["bundle"]), net, exits


def test_every_level_matches_the_training_model(loaded):
    bundle, net, _ = loaded
    rt = nd.CapacityRuntime(bundle, level=0)
    x = torch.randn(6, 3, 32, 32)
    for k in [0, 2, 1, 2, 0, 1]:  # up and down, skipping levels
        rt.set_level(k)
        set_level(net, k)
        torch.testing.assert_close(rt(x), net(x), atol=1e-5, rtol=0)


def _expected_paging(net):
    """Page-in/out bytes by capacity.profile's masks (BatchNorm counters are not deploy weights)."""
    masks = {n: m for n, m in used_masks(net).items() if not n.endswith("num_batches_tracked")}
    state = net.state_dict()
    out = {}
    for a in range(LEVELS):
        for b in range(LEVELS):
            pin = sum(int((m[b] & ~m[a]).sum()) * state[n].element_size() for n, m in masks.items())
            pout = sum(int((m[a] & ~m[b]).sum()) * state[n].element_size() for n, m in masks.items())
            out[(a, b)] = (pin, pout)
    return out


def test_set_level_pages_exactly_the_delta_and_reports_it(loaded):
    bundle, net, _ = loaded
    expected = _expected_paging(net)
    rt = nd.CapacityRuntime(bundle, level=0, plan="eager")  # the paged backend: one copy of the nested weights
    first = rt.last_report
    assert first.from_level is None and first.page_in_bytes == rt.level_bytes(0) == first.resident_bytes
    for a, b in [(0, 1), (1, 2), (2, 0), (0, 2), (2, 1), (1, 0), (0, 0)]:
        assert rt.level == a
        report = rt.set_level(b)
        assert (report.from_level, report.to_level) == (a, b)
        assert (report.page_in_bytes, report.page_out_bytes) == expected[(a, b)]
        assert report.seconds >= 0 and report.resident_bytes == rt.resident_bytes == rt.level_bytes(b)
    # resident weights never exceed the largest level (<= 1.1x required)
    largest = bundle.manifest["capacity"]["largest_level_bytes"]
    assert max(rt.level_bytes(k) for k in range(LEVELS)) == largest
    rt.set_level(LEVELS - 1)
    assert rt.resident_bytes <= 1.1 * largest


def test_every_level_keeps_its_session_ready_or_only_the_active_one(loaded):
    bundle, net, _ = loaded
    ready = nd.CapacityRuntime(bundle, level=0)
    built = ready.resident_bytes
    assert ready.backend == "onnxruntime" and built == ready.last_report.resident_bytes
    for k in [1, 2, 0, 2]:  # every session was built up front: a switch builds and pages nothing
        report = ready.set_level(k)
        assert (report.page_in_bytes, report.page_out_bytes, report.resident_bytes) == (0, 0, built)
    one = nd.CapacityRuntime(bundle, level=0, keep="active")
    sizes = []
    for k in [0, 1, 2]:
        one.set_level(k)
        sizes.append(one.resident_bytes)
    assert sum(sizes) == built and sizes == sorted(sizes)  # each level's own session, nested sizes
    x = torch.randn(4, 3, 32, 32)
    for k in range(LEVELS):
        ready.set_level(k), one.set_level(k), set_level(net, k)
        torch.testing.assert_close(ready(x), net(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(one(x), net(x), atol=1e-5, rtol=0)
    with pytest.raises(nd.BundleError, match=r"`keep` must be one of 'all', 'active', got 'some'"):
        nd.CapacityRuntime(bundle, keep="some")


def test_numpy_in_numpy_out_and_torch_in_torch_out(loaded):
    import numpy as np

    bundle, net, _ = loaded
    rt, prog = nd.CapacityRuntime(bundle), nd.ProgressiveRuntime(bundle)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    assert type(rt(x)) is np.ndarray and type(prog(x).logits) is np.ndarray
    np.testing.assert_array_equal(rt(x), rt(torch.from_numpy(x)).numpy())
    assert isinstance(prog(torch.from_numpy(x)).exit_index, torch.Tensor)


@pytest.mark.parametrize("plan", ["onnxruntime", "eager"])
def test_every_exit_and_the_batched_policy_match_training(loaded, plan):
    bundle, net, exits = loaded
    prog = nd.ProgressiveRuntime(bundle, plan=plan)
    assert prog.num_exits == exits.num_exits == 3 and prog.thresholds == [0.5, 0.6]
    x = torch.randn(32, 3, 32, 32)
    for got, want in zip(prog.all_exits(x), exits(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for thr, fallback in [(None, None), (0.0, "final"), (0.3, "most_confident"), (1.0, "final")]:
        got = prog(x, thresholds=thr, fallback=fallback)
        want = exits.early_exit(x, thresholds=prog.thresholds if thr is None else thr,
                                fallback=prog.fallback if fallback is None else fallback)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=0)
        assert torch.equal(got.exit_index, want.exit_index) and torch.equal(got.answer_index, want.answer_index)
    if plan == "eager":  # heads on the shared backbone add only their own bytes
        heads = sum(t.nbytes for t in prog._head_store.tensors.values())
        assert prog.resident_bytes == bundle.manifest["capacity"]["largest_level_bytes"] + heads


def test_split_head_and_tail_give_the_whole_model(loaded):
    bundle, net, _ = loaded
    rt = nd.CapacityRuntime(bundle)
    set_level(net, LEVELS - 1)
    x = torch.randn(3, 3, 32, 32)
    for split in bundle.splits:
        head, tail = rt.split(split["name"])
        sent = head(x)
        assert [list(t.shape[1:]) for t in sent][: len(split["tensors"])] == [s for _, s in split["tensors"]]
        torch.testing.assert_close(tail(*sent), net(x), atol=1e-5, rtol=0)


def test_runtime_misuse_is_explained(loaded):
    bundle, _, _ = loaded
    rt = nd.CapacityRuntime(bundle, level=1)
    with pytest.raises(nd.BundleError, match=r"`level` must be an int in \[0, 2\] \(the bundle's levels\), got 3"):
        rt.set_level(3)
    with pytest.raises(nd.BundleError, match=r"`x` must be a float array of shape \(N, 3, 32, 32\), got float32 \(3, 32, 32\)"):
        rt(torch.randn(3, 32, 32))
    with pytest.raises(nd.BundleError, match=r"no split point 'nope' in the bundle; split points: features.relu1"):
        rt.split("nope")
    prog = nd.ProgressiveRuntime(bundle, rt)
    assert rt.level == LEVELS - 1
    rt.set_level(0)
    with pytest.raises(nd.BundleError, match=r"the exits sit on level 2, but the shared CapacityRuntime is at level 0. "
                                             r"HINT: call capacity.set_level\(2\) first"):
        prog(torch.randn(1, 3, 32, 32))
