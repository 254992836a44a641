import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import nestflex.deploy as nd
from nestflex.capacity import extract_level
from nestflex.capacity.profile import state_bytes
from nestflex.export import ExportError, export_bundle
from nestflex.export import bundle as bundle_mod
from nestflex.models import create_model
from tests.export.bundles import LEVELS, nested_vgg, own_backbone_exits, write_bundle


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("bundle"))


def test_manifest_describes_the_bundle(written):
    info, net, exits = written
    root = info["bundle"]
    m = json.loads(open(f"{root}/manifest.json").read())
    assert m["format"] == "nestflex-bundle" and m["schema_version"] == nd.SCHEMA_VERSION
    assert m["producer"]["name"] == "nestflex" and m["input"]["shape"] == [3, 32, 32]
    assert m["input"]["mean"] == [0.5] * 3 and m["classes"][0] == "c0" and m["num_classes"] == 10
    # one profile row per level with the profile_levels keys, widths growing with the level
    assert [r["level"] for r in m["levels"]] == list(range(LEVELS))
    for r in m["levels"]:
        assert {"level", "accuracy", "params", "macs", "memory_mb", "latency_ms", "widths", "weight_bytes"} <= set(r)
    assert [r["macs"] for r in m["levels"]] == sorted(r["macs"] for r in m["levels"])
    assert m["levels"][-1]["weight_bytes"] == m["capacity"]["largest_level_bytes"] == info["largest_level_bytes"]
    assert m["levels"][-1]["weight_bytes"] == state_bytes(extract_level(net, LEVELS - 1)) - 8 * 9  # no BN counters
    # exits share the backbone: only heads are stored besides it; the sets are a list, each with its kind
    assert [s["kind"] for s in m["exit_sets"]] == ["progressive"] and "exits" not in m
    ex = m["exit_sets"][0]
    assert ex["backbone"] == "shared" and ex["level"] == LEVELS - 1 and ex["thresholds"] == [0.5, 0.6]
    assert ex["names"] == exits.exit_names and len(ex["heads"]) == 2 and "program" not in ex
    assert not any(n.startswith("progressive.") for n in m["weights"]["tensors"])
    # split points with their tensors
    assert m["splits"] and all(s["float32_bytes"] == 4 * s["numel"] for s in m["splits"])
    # every file listed with its size and checksum
    from pathlib import Path

    on_disk = {p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()} - {"manifest.json"}
    assert on_disk == set(m["files"]) and all(len(f["sha256"]) == 64 for f in m["files"].values())
    assert sum(f["bytes"] for f in m["files"].values()) + Path(root, "manifest.json").stat().st_size == info["bytes"]


def test_weights_are_stored_once(written):
    info, net, exits = written
    # nested weights once (largest level + the smaller levels' own BatchNorms) plus the heads
    heads = sum(state_bytes(h) for h in exits.exits)
    assert info["exit_heads_bytes"] == heads
    assert info["weights_bytes"] <= 1.1 * (info["largest_level_bytes"] + heads)
    assert info["bytes"] - info["onnx_bytes"] <= 1.15 * (info["largest_level_bytes"] + heads)


def test_onnx_exports_agree_under_onnxruntime(written):
    info, net, exits = written
    m = json.loads(open(f"{info['bundle']}/manifest.json").read())
    x = torch.randn(3, 3, 32, 32)

    def run(rel, *inputs):
        s = ort.InferenceSession(f"{info['bundle']}/{rel}", providers=["CPUExecutionProvider"])
        return s.run(None, {i.name: t.numpy() for i, t in zip(s.get_inputs(), inputs)})

    levels = [e for e in m["onnx"] if e["kind"] == "level"]
    assert len(levels) == LEVELS
    for e in levels:
        want = extract_level(net, e["level"])(x).detach().numpy()
        np.testing.assert_allclose(run(e["file"], x)[0], want, atol=1e-4)
    state, want_all = (x,), exits(x)
    stages = [e for e in m["onnx"] if e["kind"] == "stage"]
    heads = {e["exit"]: e for e in m["onnx"] if e["kind"] == "exit"}
    assert len(stages) == 3 and len(heads) == 2
    for k, e in enumerate(stages):
        out = [torch.from_numpy(a) for a in run(e["file"], *state)]
        if k < 2:
            logits = run(heads[k]["file"], out[e["tap_output"]])[0]
        else:
            logits = out[0].numpy()
        np.testing.assert_allclose(logits, want_all[k].detach().numpy(), atol=1e-4)
        state = tuple(out)


def test_a_failed_write_leaves_no_half_bundle(tmp_path, monkeypatch):
    info, net, exits = write_bundle(tmp_path, onnx=False)
    before = open(f"{info['bundle']}/manifest.json").read()

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(bundle_mod, "_write_onnx", crash)  # after the weights, before the manifest
    with pytest.raises(OSError, match="disk full"):
        export_bundle(tmp_path / "model.nfx", net, exits=exits)
    with pytest.raises(OSError, match="disk full"):
        export_bundle(tmp_path / "fresh.nfx", net)
    assert open(f"{info['bundle']}/manifest.json").read() == before  # the old bundle is intact
    nd.load(info["bundle"])
    assert not (tmp_path / "fresh.nfx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp directories left


def test_exits_on_another_backbone_are_stored_as_their_own_component(tmp_path):
    net = nested_vgg(tmp_path)
    joint = own_backbone_exits(net)
    info = export_bundle(tmp_path / "joint.nfx", net, exits=joint, onnx=False)
    assert info["exits_backbone"] == "own"
    b = nd.load(info["bundle"])
    assert b.exits["backbone"] == "own" and "own component" in b.exits["note"]
    assert any(n.startswith("progressive.backbone.") for n in b.manifest["weights"]["tensors"])
    x = torch.randn(4, 3, 32, 32)
    got = nd.ProgressiveRuntime(b).all_exits(x)
    for a, w in zip(got, joint(x)):
        torch.testing.assert_close(a, w, atol=1e-5, rtol=0)


def test_a_plain_model_is_a_one_level_bundle(tmp_path):
    net = create_model("resnet20", width=0.25).eval()
    info = export_bundle(tmp_path / "plain.nfx", net, onnx=False)
    b = nd.load(info["bundle"])
    assert b.num_levels == 1 and b.exits is None and b.levels[0]["params"] == sum(p.numel() for p in net.parameters())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(nd.CapacityRuntime(b)(x), net(x), atol=1e-5, rtol=0)


def test_bad_exports_are_explained(tmp_path):
    net = create_model("vgg11", width=0.125).eval()
    (tmp_path / "taken").mkdir()
    with pytest.raises(ExportError, match=r"`path` .*taken' exists and is not a bundle; refusing to replace it"):
        export_bundle(tmp_path / "taken", net, onnx=False)
    export_bundle(tmp_path / "m.nfx", net, onnx=False)
    with pytest.raises(ExportError, match=r"`path` .*m.nfx' already exists. HINT: pass overwrite=True"):
        export_bundle(tmp_path / "m.nfx", net, onnx=False, overwrite=False)
    with pytest.raises(ExportError, match=r"`mean` and `std` must both be given with one value per input channel \(3\)"):
        export_bundle(tmp_path / "x.nfx", net, mean=(0.5,), std=(0.2,))
    with pytest.raises(ExportError, match=r"`confidence` must be a registered name \(entropy, max_prob\), got 'nope'"):
        export_bundle(tmp_path / "x.nfx", net, confidence="nope")
    with pytest.raises(ExportError, match=r"`fallback` must be one of most_confident, final, got 'first'"):
        export_bundle(tmp_path / "x.nfx", net, fallback="first")
    gelu = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Hardswish(), nn.Flatten(), nn.Linear(4 * 30 * 30, 10)).eval()
    with pytest.raises(ExportError, match=r"layer `1` \(Hardswish\) has no bundle op. HINT: the bundle runtime supports"):
        export_bundle(tmp_path / "g.nfx", gelu, onnx=False)
    with pytest.raises(ExportError, match=r"`levels` must hold one profile row per level 0..0"):
        export_bundle(tmp_path / "l.nfx", net, levels=[{"level": 0}, {"level": 1}], onnx=False)
    assert not (tmp_path / "x.nfx").exists() and not (tmp_path / "g.nfx").exists()


def test_provenance_and_switching_reach_the_scheduler(tmp_path):
    """``model_info`` and ``switching`` are stored as given; the scheduler and the simulation read them."""
    from nestflex.deploy.scheduler import AppProfile
    from tests.scripts import load_script

    synthetic_flag = load_script("benchmarks/engine/_simulation.py").synthetic_flag

    info = {"name": "vgg11", "width": 0.125, "data": "synthetic", "synthetic": True}
    switching = [{"from": 0, "to": 2, "kind": "upgrade", "page_in": 10, "page_out": 2, "nested_ms": 4.25}]
    write_bundle(tmp_path, onnx=False)  # first without profiles, for the computed level rows
    rows = [{**r, "accuracy": 0.5 + 0.1 * r["level"], "latency_ms": {"1": 1.0 + r["level"]}}
            for r in nd.load(tmp_path / "model.nfx").levels]
    rows = [{k: r[k] for k in ("level", "accuracy", "params", "macs", "memory_mb", "latency_ms")} for r in rows]
    write_bundle(tmp_path, onnx=False, levels=rows, model_info=info, switching=switching)
    bundle = nd.load(tmp_path / "model.nfx")
    assert bundle.manifest["model"] == info and bundle.manifest["switching"] == switching
    app = AppProfile.from_bundle(tmp_path / "model.nfx")
    assert app.name == "vgg11-w0.125" and app.switch_time_ms(0, 2) == 4.25 and app.switch_time_ms(2, 0) is None
    assert synthetic_flag(tmp_path / "model.nfx") is True


def test_the_writer_and_the_reader_share_one_schema(written):
    """The manifest on disk is ``Manifest.to_json()`` of what the reader parses back, field for field."""
    from nestflex.deploy.bundle.manifest import Manifest
    from nestflex.deploy.bundle.safetensors_header import read_safetensors_header

    info = written[0]
    raw = json.loads(open(f"{info['bundle']}/manifest.json").read())
    spec = Manifest.from_json(raw, weights_header=read_safetensors_header(f"{info['bundle']}/weights.safetensors"))
    assert spec.to_json() == raw and Manifest.from_json(spec.to_json()) == spec
    assert nd.load(info["bundle"]).spec == spec


def test_level_rows_the_runtime_would_refuse_are_refused_at_export(tmp_path):
    net = create_model("vgg11", width=0.125).eval()
    row = {"level": 0, "accuracy": 91.0, "params": 1, "macs": 1, "memory_mb": float("nan"), "latency_ms": None}
    with pytest.raises(ExportError, match=r"`levels\[0\]` is invalid \(2 problems\): `levels\[0\].accuracy` must be "
                                          r"a finite number in \[0, 1\] or null, got 91.0 \(number\). HINT: accuracies "
                                          r"are fractions .*; `levels\[0\].memory_mb` must be a finite number >= 0, got "
                                          r"nan \(number\). HINT: fix the argument; the bundle would not load with it"):
        export_bundle(tmp_path / "m.nfx", net, levels=[row], onnx=False)
    assert not (tmp_path / "m.nfx").exists()


def test_provenance_must_be_json(tmp_path):
    with pytest.raises(ExportError, match="`model_info` must hold JSON values"):
        write_bundle(tmp_path, onnx=False, model_info={"width": torch.tensor(0.5)})
    assert not (tmp_path / "model.nfx").exists()  # refused before anything was written


def test_calibrated_exits_ship_the_policy_their_thresholds_were_fitted_for(tmp_path):
    """Issue 39: a user's 1x16x16 CNN, exits trained in a Trainer, calibrated, exported with the
    calibration and nothing else: the bundle carries the lossless thresholds *with* the fallback
    they are lossless under, and the runtime reproduces the calibrated accuracy. Another policy
    beside those thresholds is refused; the user's own thresholds may take their own policy."""
    from nestflex.callbacks import OverthinkingSchedule
    from nestflex.exits import MultiExitClassifier, calibrate
    from tests.exits.user_cnn import SHAPE, DigitsCNN, loaders, trainer

    torch.manual_seed(0)
    train, val = loaders()
    module = MultiExitClassifier(backbone=DigitsCNN(), input_shape=SHAPE, positions=(0.3, 0.6), max_epochs=3)
    trainer(tmp_path, [OverthinkingSchedule()], max_epochs=3).fit(module, train, val)
    net = module.model.eval()
    report = calibrate(net, val, folds=2)
    lossless = report["lossless"]
    assert report["fallback"] == "most_confident" and lossless["fallback"] == "final"

    info = export_bundle(tmp_path / "digits.nfx", net.backbone, exits=net, calibration=report, input_shape=SHAPE,
                         onnx=False)
    bundle = nd.load(info["bundle"])
    assert (bundle.exits["thresholds"], bundle.exits["fallback"], bundle.exits["confidence"]) == (
        lossless["thresholds"], "final", "max_prob")
    runtime = nd.ProgressiveRuntime(bundle, plan="eager")
    right = [(runtime(x).logits.argmax(1) == y) for x, y in val]
    assert float(torch.cat(right).double().mean()) == pytest.approx(lossless["accuracy"])

    for arg, value, fitted in (("fallback", "most_confident", "final"), ("confidence", "entropy", "max_prob")):
        with pytest.raises(ExportError, match=rf"`{arg}`='{value}', but the thresholds come from `calibration`, whose "
                                              rf"lossless thresholds were fitted for {arg}='{fitted}': .* HINT: leave "
                                              rf"`{arg}` out \(the bundle then ships '{fitted}'\), pass `thresholds=` "
                                              rf"too to ship a policy of your own, or recalibrate for '{value}'"):
            export_bundle(tmp_path / "bad.nfx", net.backbone, exits=net, calibration=report, input_shape=SHAPE,
                          onnx=False, **{arg: value})
    assert not (tmp_path / "bad.nfx").exists()
    # the user's own thresholds (read off the sweep, say) take the sweep's policy, or the one passed
    own = export_bundle(tmp_path / "own.nfx", net.backbone, exits=net, calibration=report, input_shape=SHAPE,
                        thresholds=[0.9, 0.9], onnx=False)
    assert nd.load(own["bundle"]).exits["fallback"] == "most_confident"
    both = export_bundle(tmp_path / "both.nfx", net.backbone, exits=net, calibration=report, input_shape=SHAPE,
                         thresholds=[0.9, 0.9], fallback="final", confidence="entropy", onnx=False)
    assert (nd.load(both["bundle"]).exits["fallback"], nd.load(both["bundle"]).exits["confidence"]) == (
        "final", "entropy")


def test_a_piece_torch_onnx_cannot_export_is_written_on_the_device(tmp_path):
    """An SDN head's adaptive pool from a 7x7 map to 4x4 has no torch.onnx form (the output does
    not divide the input): the exit set then ships no ONNX file, with a warning, and the device
    writes its graphs from the bundle's program, answering as the torch network does."""
    from nestflex.exits import MultiExitNetwork
    from tests.exits.user_cnn import DigitsCNN

    torch.manual_seed(0)
    shape = (1, 28, 28)  # the user's CNN at MNIST size: maps of 28, 14 and 7
    with pytest.warns(UserWarning, match="fewer than the 6 default positions"):
        net = MultiExitNetwork(DigitsCNN(), input_shape=shape).eval()
    with pytest.warns(UserWarning, match=r"torch.onnx cannot export the progressive exit set .*the device writes its "
                                         r"graph from the bundle's program"):
        info = export_bundle(tmp_path / "m.nfx", net.backbone, exits=net, input_shape=shape)
    bundle = nd.load(info["bundle"])
    kinds = [o.kind for o in bundle.spec.onnx]
    assert kinds == ["level"], kinds  # the level shipped; the exit set's files none
    assert not list((Path(info["bundle"]) / "onnx").glob("*stage_*")) and not list(
        (Path(info["bundle"]) / "onnx").glob("*exit_*"))
    x = torch.randn(5, *shape)
    with torch.no_grad():
        expected = net(x)
    runtime = nd.ProgressiveRuntime(bundle)
    got = runtime.all_exits(x.numpy())  # every exit's logits, from the written graphs
    assert len(got) == len(expected) == bundle.spec.exit_set("progressive").names.__len__()
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-4, atol=1e-5)
