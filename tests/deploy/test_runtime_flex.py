"""FlexDNN's exits under the deploy runtime: parity with the training network and the shared policy."""

from dataclasses import replace

import pytest
import torch

import nestflex.deploy as nd
from nestflex.capacity import set_level
from tests.export.bundles import LEVELS, write_flex_bundle


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    info, net, exits, flex, spec = write_flex_bundle(tmp_path_factory.mktemp("rt_flex"), onnx=False)
    return nd.load(info["bundle"]), net, exits, flex, spec


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    info, net, exits, flex, spec = write_flex_bundle(tmp_path_factory.mktemp("rt_flex_own"), onnx=False, own=True)
    return nd.load(info["bundle"]), net, exits, flex, spec


def _check_parity(prog, flex, spec):
    assert prog.num_exits == flex.num_exits == 3 and prog.thresholds == spec["thresholds"]
    assert (prog.confidence, prog.fallback) == (spec["confidence"], spec["fallback"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, 32, 32, generator=g)
    want = flex(x)
    for got, w in zip(prog.all_exits(x), want):
        torch.testing.assert_close(got, w, atol=1e-5, rtol=0)
    for k in range(prog.num_exits):
        torch.testing.assert_close(prog.exit_logits(x, k), want[k], atol=1e-5, rtol=0)
    # the plan's policy, and overrides that make every exit answer for some samples
    exit_counts = torch.zeros(prog.num_exits, dtype=torch.long)
    for thr, fallback in [(None, None), (0.0, "final"), (0.05, "most_confident"), (1.0, "final")]:
        got = prog(x, thresholds=thr, fallback=fallback)
        ref = flex.early_exit(x, thresholds=prog.thresholds if thr is None else thr, confidence=prog.confidence,
                              fallback=prog.fallback if fallback is None else fallback)
        torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=0)
        assert torch.equal(got.exit_index, ref.exit_index) and torch.equal(got.answer_index, ref.answer_index)
        exit_counts += torch.bincount(got.exit_index, minlength=prog.num_exits)
    assert (exit_counts > 0).sum() >= 2  # the policy comparison covered early exits, not only the final one


def test_flex_exits_on_the_shared_backbone_match_training(shared):
    bundle, net, _, flex, spec = shared
    rt = nd.CapacityRuntime(bundle, level=0, plan="eager")  # the paged backend: one copy of the backbone
    prog = nd.ProgressiveRuntime(bundle, rt, exit_set="flex_exits", plan="eager")
    assert rt.level == LEVELS - 1 and prog.exit_set == "flex_exits" and prog.capacity is rt
    _check_parity(prog, flex, spec)
    # heads on the shared backbone add only their own bytes (the filter indices included)
    heads = sum(t.nbytes for t in prog._head_store.tensors.values())
    assert prog.resident_bytes == bundle.manifest["capacity"]["largest_level_bytes"] + heads


@pytest.mark.parametrize("plan", ["onnxruntime", "eager"])
def test_flex_exits_on_their_own_backbone_match_training(own, plan):
    bundle, net, _, flex, spec = own
    prog = nd.ProgressiveRuntime(bundle, exit_set="flex_exits", plan=plan)
    assert bundle.flex_exits["backbone"] == "own" and prog.capacity is None and prog.backend == plan
    _check_parity(prog, flex, spec)


def test_both_exit_sets_run_side_by_side_on_one_capacity_runtime(shared):
    bundle, net, exits, flex, _ = shared
    rt = nd.CapacityRuntime(bundle)
    spinn, flexdnn = nd.ProgressiveRuntime(bundle, rt), nd.ProgressiveRuntime(bundle, rt, exit_set="flex_exits")
    x = torch.randn(4, 3, 32, 32)
    for got, want in zip(spinn.all_exits(x), exits(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for got, want in zip(flexdnn.all_exits(x), flex(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    set_level(net, LEVELS - 1)  # both final exits are the largest level itself
    torch.testing.assert_close(flexdnn.exit_logits(x, 2), net(x), atol=1e-5, rtol=0)


def test_asking_for_an_exit_set_the_bundle_lacks_is_explained(own, tmp_path):
    bundle = own[0]
    with pytest.raises(nd.BundleError, match=r"`exit_set` must be one of exits, flex_exits \(or the kinds progressive, "
                                             r"flexdnn\), got 'flex'"):
        nd.ProgressiveRuntime(bundle, exit_set="flex")
    info, *_ = write_flex_bundle(tmp_path, onnx=False, progressive=False)
    lone = nd.load(info["bundle"])
    with pytest.raises(nd.BundleError, match=r"has no exits \(exit sets present: flex_exits\). HINT: export it with a "
                                             r"MultiExitNetwork"):
        nd.ProgressiveRuntime(lone)
    spec = nd.load(bundle.path).spec
    plain = nd.Bundle(bundle.path, replace(spec, exit_sets=(spec.exit_set("progressive"),)))
    with pytest.raises(nd.BundleError, match=r"has no flex_exits \(exit sets present: exits\). HINT: export it with "
                                             r"`flex_exits=` and `flex_spec=`"):
        nd.ProgressiveRuntime(plain, exit_set="flex_exits")
