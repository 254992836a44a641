"""FlexDNN's fine-grained exits in the bundle: the `flex_exits` set, its weights and its ONNX."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

import nestflex.deploy as nd
from nestflex.export import ExportError, export_bundle
from nestflex.models import create_model
from tests.export.bundles import flex_on, nested_vgg, write_flex_bundle


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return write_flex_bundle(tmp_path_factory.mktemp("flex_shared"), onnx=True)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    return write_flex_bundle(tmp_path_factory.mktemp("flex_own"), onnx=False, own=True, progressive=False)


def _manifest(info):
    return json.loads(open(f"{info['bundle']}/manifest.json").read())


def test_flex_exits_on_the_largest_level_store_only_their_heads(shared):
    info, net, exits, flex, spec = shared
    m = _manifest(info)
    ex, fx = m["exit_sets"]
    assert (ex["kind"], fx["kind"]) == ("progressive", "flexdnn")
    # same layout as the progressive set: the runtime and the loader treat both alike
    assert set(ex) - {"calibration"} <= set(fx)
    assert fx["backbone"] == "shared" and fx["level"] == 2 and "program" not in fx
    assert fx["thresholds"] == spec["thresholds"] and (fx["confidence"], fx["fallback"]) == ("entropy", "final")
    assert fx["names"] == flex.exit_names and fx["taps"] == [p.node for p in flex.points]
    assert fx["macs"] == flex.exit_macs and fx["backbone_macs"] == flex.backbone_macs
    for head, e in zip(fx["heads"], spec["exits"]):
        assert head["filters"] == e["filters"] and head["widths"] == e["widths"]
        assert head["stem_pool"] == e["stem_pool"]
        assert [n["op"] for n in head["program"][:3]] == ["input", "param", "index_select"]
    names = m["weights"]["tensors"]
    assert not any(n.startswith("flex.backbone.") for n in names)
    flex_names = {n for n in names if n.startswith("flex_exits.")}
    assert flex_names == {f"flex_exits.{k}" for k in flex.exits.state_dict() if not k.endswith("num_batches_tracked")}
    assert names["flex_exits.0.index"] == {"shape": [len(spec["exits"][0]["filters"])], "dtype": "int64"}
    heads = sum(t.numel() * t.element_size() for k, t in flex.exits.state_dict().items()
                if not k.endswith("num_batches_tracked"))
    assert info["flex_exit_heads_bytes"] == heads and info["flex_exits_backbone"] == "shared" and info["flex_exits"] == 2
    assert info["flex_backbone_bytes"] == 0
    # the plan and operating points travel with the set; the spec ships in profiles/
    assert fx["plan"]["kept_locations"] == [e["location"] for e in spec["exits"]] and "ranking_orders" not in fx["plan"]
    assert fx["operating_points"][0]["threshold"] == 0.3
    # where the shipped thresholds were fitted travels too, without the per-fold detail
    assert fx["calibration"] == {"split": "calibration", "samples": 40, "folds": 5, "accuracy": 0.45,
                                 "mean_macs_fraction": 0.6}
    shipped = json.loads(open(f"{info['bundle']}/{fx['profile']}").read())
    assert shipped["spec"] == spec and m["profiles"]["flexdnn_plan"] == fx["profile"]


def test_flex_exits_on_another_backbone_store_it_as_their_own_component(own):
    info, net, exits, flex, spec = own
    m = _manifest(info)
    (fx,) = m["exit_sets"]
    assert fx["kind"] == "flexdnn" and fx["backbone"] == "own" and fx["level"] is None and "program" in fx
    assert "flex.backbone.*" in fx["note"] and info["flex_exits_backbone"] == "own"
    own_names = {n for n in m["weights"]["tensors"] if n.startswith("flex.backbone.")}
    want = {f"flex.backbone.{k}" for k in flex.backbone.state_dict() if not k.endswith("num_batches_tracked")}
    assert own_names == want
    assert info["flex_backbone_bytes"] == sum(t.numel() * t.element_size() for k, t in flex.backbone.state_dict().items()
                                              if not k.endswith("num_batches_tracked"))


def _ort(path, *inputs):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), inputs)})


def test_flex_heads_and_stages_agree_under_onnxruntime(shared):
    info, net, exits, flex, spec = shared
    m = _manifest(info)
    rows = [o for o in m["onnx"] if o.get("exit_set") == "flexdnn"]
    assert [(o["kind"], o.get("stage", o.get("exit"))) for o in rows] == [
        ("stage", 0), ("exit", 0), ("stage", 1), ("exit", 1), ("stage", 2)]
    assert all(o["file"].startswith("onnx/flex_") for o in rows)
    x = torch.randn(5, 3, 32, 32)
    want = flex(x)
    state = (x,)
    with torch.no_grad():
        for k, stage in enumerate(flex.stages):
            got = _ort(f"{info['bundle']}/onnx/flex_stage_{k}.onnx", *state)
            state = stage(*state)
            state = state if isinstance(state, tuple) else (state,)
            for g, s in zip(got, state):
                np.testing.assert_allclose(g, s.numpy(), atol=1e-4, rtol=0)
            if k < len(flex.exits):
                tap = state[flex._taps[k]]
                (logits,) = _ort(f"{info['bundle']}/onnx/flex_exit_{k}.onnx", tap)
                np.testing.assert_allclose(logits, want[k].numpy(), atol=1e-4, rtol=0)
        np.testing.assert_allclose(state[0].numpy(), want[-1].numpy(), atol=1e-4, rtol=0)


def test_flex_export_arguments_are_checked(tmp_path):
    net = nested_vgg(tmp_path)
    flex, spec = flex_on(create_model("vgg11", width=0.125).eval(), dropout=False)
    with pytest.raises(ExportError, match=r"`flex_exits` needs `flex_spec` \(the FlexDNN spec: thresholds, confidence, "
                                          r"fallback\). HINT: pass FlexDNNResult.spec"):
        export_bundle(tmp_path / "a.nfx", net, flex_exits=flex, onnx=False)
    with pytest.raises(ExportError, match=r"`flex_spec`/`flex_report` were given without `flex_exits`. HINT: pass the "
                                          r"FlexDNN network too"):
        export_bundle(tmp_path / "a.nfx", net, flex_spec=spec, onnx=False)
    short = {**spec, "exits": spec["exits"][:1]}
    with pytest.raises(ExportError, match=r"`flex_spec` plans 1 exits but `flex_exits` has 2. HINT: pass the spec the "
                                          r"network was built from"):
        export_bundle(tmp_path / "a.nfx", net, flex_exits=flex, flex_spec=short, onnx=False)
    with pytest.raises(ExportError, match=r"`flex_spec\['confidence'\]` must be one of .*entropy.*, got 'vibes'"):
        export_bundle(tmp_path / "a.nfx", net, flex_exits=flex, flex_spec={**spec, "confidence": "vibes"}, onnx=False)
    with pytest.raises(ExportError, match=r"`flex_exits`: .*threshold"):
        export_bundle(tmp_path / "a.nfx", net, flex_exits=flex, flex_spec={**spec, "thresholds": [0.1]}, onnx=False)
    assert not (tmp_path / "a.nfx").exists()


def test_a_bundle_with_only_flex_exits_loads_and_reports_them(own):
    b = nd.load(own[0]["bundle"])
    assert b.exits is None and list(b.exit_sets) == ["flex_exits"] and "exits=0, flex_exits=3" in repr(b)
