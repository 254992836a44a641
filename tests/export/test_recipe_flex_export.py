"""The recipe's export stage bundles the flex stage's planned exits (from its saved outputs)."""

import json

import pytest
import torch
from safetensors.torch import load_file

import nestflex.deploy as nd
from nestflex.cli import inspect_table
from nestflex.exits import build_flex_network
from nestflex.training import ImageClassifier
from tests.scripts import FLEX, TINY, load_script


def _recipe():
    return load_script("recipes/vgg_cifar.py")


def test_export_stage_includes_the_flex_plan(tmp_path, capsys):
    out = tmp_path / "run"
    summary = _recipe().main([*TINY, *FLEX, "--out", str(out), "--stages", "baseline,flex,export"])
    spec = json.loads((out / "flex" / "spec.json").read_text())
    x = summary["export"]
    assert x["flex_exits"] == len(spec["exits"]) and x["exits_backbone"] is None
    assert f"{x['flex_exits']} FlexDNN exit(s)" in capsys.readouterr().out
    if not spec["exits"]:
        # the plan kept no exit (possible on near-chance synthetic data): the export's part holds,
        # but the parity below has nothing to compare, and that must show in the report, not pass
        assert x["flex_exits_backbone"] is None
        pytest.skip("the flex plan kept no exit on this run's "
                    "synthetic data: the bundle's exit parity was not checked")
    # no grow stage: the bundle's one level is the baseline FlexDNN ran on, so only heads are stored
    assert x["flex_exits_backbone"] == "shared" and x["flex_exit_heads_bytes"] > 0
    bundle = nd.load(out / x["bundle"])
    assert bundle.flex_exits["thresholds"] == spec["thresholds"]
    assert "flex_exits (" in inspect_table(bundle)
    base = ImageClassifier.load_from_checkpoint(out / "baseline" / "model.ckpt", map_location="cpu", weights_only=True)
    net = build_flex_network(base.model.eval(), spec)
    net.load_state_dict(load_file(out / "flex" / "model.safetensors"))
    prog = nd.ProgressiveRuntime(bundle, exit_set="flex_exits")
    xb = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    # onnxruntime sums a trained VGG's convolutions in another order than torch: logits of ~10
    # agree to ~1e-5 relative (the parity bound is 1e-4); the torch reference to 1e-5
    for plan, atol in (("onnxruntime", 1e-4), ("eager", 1e-5)):
        ref = nd.ProgressiveRuntime(bundle, exit_set="flex_exits", plan=plan)
        for got, want in zip(ref.all_exits(xb), net(xb)):
            torch.testing.assert_close(got, want, atol=atol, rtol=0)
    got, want = prog(xb), net.early_exit(xb, spec["thresholds"], confidence=spec["confidence"], fallback=spec["fallback"])
    assert torch.equal(got.exit_index, want.exit_index)
