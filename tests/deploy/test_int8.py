"""int8 execution (issue 23): the bundle's labelled samples, the onnxruntime QDQ backend calibrated
on one half of them and judged on the other, the accuracy budget in the synthesis, the cache of
quantised graphs beside the bundle, and the errors a user meets."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

import nestflex.deploy as nd
from nestflex.deploy.backends.base import BackendError, calibration_split, get_backend, list_backends, tuned_dir
from nestflex.deploy.backends.plan import ExecutionPlan, LevelPlan
from nestflex.deploy.backends.quantize import quantize_level
from nestflex.deploy.tune import synthesize
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.manifest import manifest_digest
from nestflex.cli import main
from nestflex.export import ExportError
from tests.export.bundles import nested_vgg, write_bundle


def _samples(net, n=64, seed=0):
    """Inputs and the labels the float model gives them (so its own accuracy is 1.0)."""
    x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    from nestflex.capacity import extract_level, num_levels

    with torch.no_grad():
        y = extract_level(net, num_levels(net) - 1)(x).argmax(1)
    return x, y


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("int8")
    samples = _samples(nested_vgg(tmp_path_factory.mktemp("net")))
    write_bundle(tmp, samples=samples)
    return nd.load(tmp / "model.nfx")


def test_the_bundle_ships_its_samples_and_reads_them_back_checked(bundle):
    x, y = bundle.samples()
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)  # numpy: the runtime's own type
    assert x.dtype == np.float32 and x.shape == (64, 3, 32, 32) and y.dtype == np.int64
    assert bundle.spec.samples.count == 64 and bundle.spec.samples.split == "validation"
    (cx, cy), (vx, vy) = calibration_split(bundle)
    assert cx.shape[0] == vx.shape[0] == 32 and np.array_equal(np.concatenate([cx, vx]), x)
    assert np.array_equal(np.concatenate([cy, vy]), y)


def test_samples_the_manifest_misdescribes_are_refused_at_use(bundle, tmp_path):
    root = shutil.copytree(bundle.path, tmp_path / "copy.nfx")
    m = json.loads((root / "manifest.json").read_text())
    m["samples"]["count"] = 65
    m["integrity"]["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"samples.safetensors: `inputs` must be float32 \[65, 3, 32, 32\]"):
        nd.load(root).samples()
    m["samples"]["file"] = "other.safetensors"
    m["integrity"]["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"samples.file.*'other.safetensors'.*`files` does not list"):
        nd.load(root)


@pytest.mark.parametrize(("samples", "match"), [
    ((torch.randn(4, 3, 16, 16), torch.zeros(4, dtype=torch.long)), r"shape \(N >= 1, 3, 32, 32\)"),
    ((torch.randn(4, 3, 32, 32), torch.zeros(4)), "integer tensor of shape"),
    ((torch.randn(4, 3, 32, 32), torch.full((4,), 10)), r"class indices in \[0, 10\)"),
    ((torch.full((4, 3, 32, 32), float("nan")), torch.zeros(4, dtype=torch.long)), "NaN or inf"),
    (torch.randn(4, 3, 32, 32), "pair of tensors"),
])
def test_bad_samples_are_refused_at_export(tmp_path, samples, match):
    with pytest.raises(ExportError, match=match):
        write_bundle(tmp_path, onnx=False, samples=samples)
    assert not (tmp_path / "model.nfx").exists()


def test_the_int8_backend_is_registered_and_runs_every_level_close_to_float(bundle):
    assert "onnxruntime_int8" in list_backends(available_only=True)
    assert get_backend("onnxruntime_int8").precision == "int8" and get_backend("onnxruntime").precision == "float32"
    x = bundle.samples()[0][32:40]
    for level in range(bundle.num_levels):
        plan = ExecutionPlan(tuple(LevelPlan("onnxruntime_int8") for _ in range(bundle.num_levels)))
        rt = nd.CapacityRuntime(bundle, level, plan=plan)
        assert rt.backend == "onnxruntime_int8"
        ref, out = nd.CapacityRuntime(bundle, level, plan=None)(x), rt(x)  # float32 onnxruntime, int8
        assert out.shape == ref.shape and not np.array_equal(out, ref)  # quantised: close, not equal
        # measured (onnxruntime 1.x, MinMax QDQ calibrated on the other 32 samples, 2026-11): the
        # largest error is 0.38%, 0.55% and 1.3% of the largest logit at levels 0, 1 and 2, and all
        # 8 predictions agree with float32 at every level. Bounds: 5% (about 4x the worst level),
        # and at most one of the 8 predictions may change
        rel = float(np.abs(out - ref).max()) / float(np.abs(ref).max())
        assert rel < 0.05, f"level {level}: int8 logits {rel:.2%} of the largest logit away from float32"
        agree = int((out.argmax(1) == ref.argmax(1)).sum())
        assert agree >= 7, f"level {level}: int8 agrees with float32 on {agree} of 8 predictions"


def test_quantised_graphs_are_built_once_and_cached_beside_the_bundle(bundle):
    first = quantize_level(bundle, 0)
    assert first.parent == tuned_dir(bundle) and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert quantize_level(bundle, 0) == first and first.stat().st_mtime_ns == stamp
    nd.load(bundle.path)  # the bundle's own files and checksums are untouched


def test_without_onnx_a_graph_to_build_names_the_package_and_one_built_before_still_runs(bundle, tmp_path,
                                                                                         monkeypatch):
    from nestflex.deploy.backends._onnx import MissingOnnxError

    copy = nd.load(shutil.copytree(bundle.path, tmp_path / "model.nfx"))  # its own, empty tuned folder
    built = quantize_level(copy, 1)  # where nestflex[tune] is installed (`nestflex tune` builds it)
    monkeypatch.setitem(sys.modules, "onnx", None)  # now it is not
    with pytest.raises(MissingOnnxError, match=r"building the int8 graph of level 0 needs the `onnx` package, which "
                                               r"is not installed. HINT: pip install \"nestflex\[tune\]\""):
        quantize_level(copy, 0)
    assert issubclass(MissingOnnxError, (BackendError, ModuleNotFoundError))
    assert not (tuned_dir(copy) / "level_0.int8.onnx").exists()
    plan = ExecutionPlan(tuple(LevelPlan("onnxruntime_int8") for _ in range(copy.num_levels)))
    rt = nd.CapacityRuntime(copy, 1, plan=plan, keep="active")  # the graph built before needs no onnx
    assert quantize_level(copy, 1) == built and rt(copy.samples()[0][:2]).shape == (2, 10)


def test_a_bundle_folder_that_cannot_be_written_caches_in_the_temp_folder(bundle, tmp_path, monkeypatch):
    copy = nd.load(shutil.copytree(bundle.path, tmp_path / "model.nfx"))
    (tmp_path / "model.nfx.tuned").write_text("in the way")  # the cache folder cannot be made (as read-only would)
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    path = quantize_level(copy, 1)
    assert path.is_relative_to(tmp_path / "tmp") and path.is_file()
    assert quantize_level(copy, 1) == path  # and found there again


#: measured on the check half (32 samples, 2026-11): int8 accuracy equals the eager one at levels 0
#: and 1 and is 6.25 points (2 of 32 samples) below it at level 2. A budget of 10 points accepts that
#: with one more changed sample to spare (3.125 points each), and refuses anything worse
INT8_BUDGET_POINTS = 10


def test_synthesis_judges_int8_by_accuracy_on_the_check_half(bundle):
    plan = synthesize(bundle, backends=["eager", "onnxruntime_int8"], threads=[1], repeats=2,
                      budget_points=INT8_BUDGET_POINTS)
    rows = [c for c in plan.candidates if c["backend"] == "onnxruntime_int8"]
    assert len(rows) == bundle.num_levels and plan.budget_points == INT8_BUDGET_POINTS and plan.check_samples == 32
    for c in rows:  # within the measured drop plus the margin: every level's int8 is a candidate
        drop = c["eager_accuracy"] - c["accuracy"]
        assert drop <= INT8_BUDGET_POINTS / 100 + 1e-9, f"level {c['level']}: int8 {100 * drop:.2f} points below eager"
        assert c["agrees"] and 0 <= c["accuracy"] <= 1 and 0 <= c["eager_accuracy"] <= 1
    assert rows[-1]["eager_accuracy"] == 1.0  # the labels are the largest level's own predictions
    strict = synthesize(bundle, backends=["eager", "onnxruntime_int8"], threads=[1], repeats=2, budget_points=0)
    for c in strict.candidates:
        if c["backend"] == "onnxruntime_int8":
            assert c["agrees"] == (c["accuracy"] >= c["eager_accuracy"])
    for c, lp in zip([c for c in strict.candidates if c["backend"] == "onnxruntime_int8"], strict.levels):
        assert lp.accuracy is not None and (lp.backend == "eager" or lp.accuracy >= c["eager_accuracy"])
    again = ExecutionPlan.from_json(json.loads(json.dumps(strict.to_json())))
    assert again.levels == strict.levels and again.budget_points == 0 and again.check_samples == 32


def test_without_samples_int8_is_no_candidate_and_a_plan_naming_it_says_why(tmp_path):
    write_bundle(tmp_path)
    b = nd.load(tmp_path / "model.nfx")
    assert b.samples() is None
    plan = synthesize(b, backends=["eager", "onnxruntime_int8"], threads=[1], repeats=2)
    assert plan.budget_points is None and all(lp.backend == "eager" for lp in plan.levels)
    assert all("error" in c and "ships no samples" in c["error"] for c in plan.candidates
               if c["backend"] == "onnxruntime_int8")
    with pytest.raises(BackendError, match="ships no samples to calibrate int8 on.*BundleExporter\\(samples=512\\)"):
        nd.CapacityRuntime(b, 0, plan=ExecutionPlan(tuple(LevelPlan("onnxruntime_int8") for _ in range(b.num_levels))))


def test_tune_refuses_a_budget_outside_points(bundle, capsys):
    assert main(["tune", str(bundle.path), "--budget", "150", "--quiet"]) == 2
    assert "--budget is in accuracy points" in capsys.readouterr().err


def _profile(layers):
    return {"assignment": {"layers": layers, "counts": {"float32": 1, "int8": len(layers) - 1}, "budget_points": 1.0}}


def test_the_mixed_backend_keeps_the_plans_float_layers_in_float(tmp_path_factory, monkeypatch):
    import onnx

    import nestflex.deploy.backends.quantize as backends

    monkeypatch.setattr(backends, "slow_int8_layers", lambda bundle: ())  # the plan's layers alone (timed: below)
    tmp = tmp_path_factory.mktemp("mixed")
    net = nested_vgg(tmp_path_factory.mktemp("net"))
    convs = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Conv2d)]
    write_bundle(tmp, samples=_samples(net), precision_profile=_profile(
        {n: ("float32" if n == convs[0] else "int8") for n in convs}))
    b = nd.load(tmp / "model.nfx")
    from nestflex.deploy.backends.quantize import float_layers

    assert float_layers(b) == (convs[0],)
    path = get_backend("onnxruntime_mixed").model_path(b, 2)
    assert path != quantize_level(b, 2) and path.parent == tuned_dir(b)
    graph = onnx.load(str(path)).graph
    made_by = {o: n.op_type for n in graph.node for o in n.output}
    weight_src = {n.name: made_by.get(n.input[1], "initializer") for n in graph.node if n.op_type == "Conv"}
    prefix = "/" + convs[0].replace(".", "/") + "/"
    assert [src for name, src in weight_src.items() if name.startswith(prefix)] == ["initializer"]  # float weights
    assert sum(src == "DequantizeLinear" for src in weight_src.values()) == len(convs) - 1  # the rest int8
    plan = ExecutionPlan(tuple(LevelPlan("onnxruntime_mixed") for _ in range(b.num_levels)))
    x = b.samples()[0][:4]
    assert nd.CapacityRuntime(b, 2, plan=plan)(x).shape == (4, 10)


def test_the_mixed_backend_without_a_precision_plan_says_so(bundle):
    plan = ExecutionPlan(tuple(LevelPlan("onnxruntime_mixed") for _ in range(bundle.num_levels)))
    with pytest.raises(BackendError, match="no per-layer precision plan.*HINT"):
        nd.CapacityRuntime(bundle, 0, plan=plan)


def _mixed_bundle(tmp_path_factory, name):
    net = nested_vgg(tmp_path_factory.mktemp("net"))
    convs = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Conv2d)]
    tmp = tmp_path_factory.mktemp(name)
    write_bundle(tmp, samples=_samples(net), precision_profile=_profile({n: "int8" for n in convs}))
    return nd.load(tmp / "model.nfx"), convs


def test_layers_slower_in_int8_on_this_device_stay_float_in_the_mixed_graph(tmp_path_factory, monkeypatch):
    import onnx

    import nestflex.deploy.backends.op_profile as op_profile
    from nestflex.deploy.backends.quantize import mixed_float_layers, slow_int8_layers

    b, convs = _mixed_bundle(tmp_path_factory, "slow")
    measured = []
    real = op_profile.operator_times

    def fake(path, x, runs=200, threads=1):  # the int8 graph's second layer 3x its float32 time, the rest faster
        ops = real(path, x, runs=2, threads=threads)
        measured.append(path)
        int8 = any(o["op"].startswith("Q") for o in ops)
        k = 0
        for o in ops:
            if o["op"] in op_profile.CONV_OPS:
                o["us"] = (30.0 if k == 1 else 5.0) if int8 else 10.0
                k += 1
        return ops

    monkeypatch.setattr(op_profile, "operator_times", fake)
    scope = "/" + convs[1].replace(".", "/") + "/"  # the layer's ONNX node scope
    assert slow_int8_layers(b) == (scope,)
    assert len(measured) == 2 and (tuned_dir(b) / "int8_slow_layers.json").is_file()
    assert slow_int8_layers(b) == (scope,) and len(measured) == 2  # measured once per device: read back
    assert mixed_float_layers(b) == (scope,)  # the precision plan keeps none of them float
    graph = onnx.load(str(get_backend("onnxruntime_mixed").model_path(b, 2))).graph
    made_by = {o: n.op_type for n in graph.node for o in n.output}
    float_weights = [n.name for n in graph.node if n.op_type == "Conv" and made_by.get(n.input[1]) != "DequantizeLinear"]
    assert [n for n in float_weights if n.startswith(scope)] == float_weights != []


def test_a_damaged_slow_layer_file_is_measured_again(tmp_path_factory, monkeypatch):
    import nestflex.deploy.backends.op_profile as op_profile
    from nestflex.deploy.backends.quantize import slow_int8_layers

    b, _ = _mixed_bundle(tmp_path_factory, "damaged")
    (tuned_dir(b)).mkdir(parents=True, exist_ok=True)
    (tuned_dir(b) / "int8_slow_layers.json").write_text('{"layers": [1, 2]')
    assert slow_int8_layers(b) == ()  # unreadable: none now, and the file goes
    assert not (tuned_dir(b) / "int8_slow_layers.json").exists()
    calls = []
    monkeypatch.setattr(op_profile, "operator_times", lambda *a, **k: calls.append(a) or [])
    with pytest.warns(UserWarning, match="cannot be paired"):
        assert slow_int8_layers(b) == ()  # measured again; graphs whose layers do not pair: none slow
    assert len(calls) == 2 and not (tuned_dir(b) / "int8_slow_layers.json").exists()  # and again next time

