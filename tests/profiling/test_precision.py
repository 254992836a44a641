import json
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nestflex import ProfileError
from nestflex.data import SyntheticShapes
from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.profiling import BFloat16Layer, build_mixed_precision_model, plan_assignment, profile_layer_precision
from nestflex.profiling import precision as precision_mod
from tests.conftest import settle_batchnorm

CALIB, SAMPLES = 32, 64


@pytest.fixture(autouse=True)
def _one_thread(_seed_and_threads):
    # one thread: on a shared 2-core machine a 2-thread region stalls whenever another process
    # holds a core (two orders of magnitude slower, measured), which would dominate this file
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = settle_batchnorm(create_model("vgg11", width=0.125))
    images = SyntheticShapes("test", size=CALIB + SAMPLES, seed=5).images.float() / 255
    with torch.no_grad():
        labels = model(images).argmax(1)  # the float model is right on all: drops are pure precision effects
    loader = DataLoader(TensorDataset(images, labels), batch_size=32)
    return model, images, labels, loader


@pytest.fixture(scope="module")
def profiled(setup):
    model, _, _, loader = setup
    return profile_layer_precision(model, loader, budget_points=2.0, max_samples=SAMPLES, calibration_samples=CALIB,
                                   batch_sizes=(16, 1), repeats=3, threads=1)


def test_profile_rows_cover_every_layer_and_precision(setup, profiled):
    model = setup[0]
    json.dumps(profiled)  # JSON-ready as it is
    assert profiled["schema_version"] == 1 and profiled["precisions"] == ["float32", "bfloat16", "int8"]
    assert profiled["samples"] == SAMPLES and profiled["calibration_samples"] == CALIB
    assert profiled["batch_sizes"] == [16, 1] and profiled["optimised_batch_size"] == 16
    assert profiled["machine"]["torch_threads"] == 1
    assert [r["name"] for r in profiled["layers"]] == [layer.name for layer in trace(model).layers]
    ref = profiled["reference"]
    assert ref["accuracy"] == 1.0  # BatchNorm folding alone changes no prediction
    for row in profiled["layers"]:
        assert [p["precision"] for p in row["per_precision"]] == ["float32", "bfloat16", "int8"]
        for p in row["per_precision"]:
            assert p["supported"] and set(p["latency_ms"]) == {"16", "1"} and min(p["latency_ms"].values()) > 0
            assert math.isclose(p["drop_points"], 100 * (ref["accuracy"] - p["accuracy"]), abs_tol=1e-3)
        assert row["per_precision"][0]["drop_points"] == 0
    assert row["input_shape"] == [model.classifier.fc2.in_features]  # recorded by the hook
    assert model.training is False and all(not isinstance(m, BFloat16Layer) for m in model.modules())


def test_assignment_is_within_budget_by_measurement_and_rebuilds(setup, profiled):
    model, images, labels, _ = setup
    a = profiled["assignment"]
    assert a["budget_points"] == 2.0 and a["drop_points"] <= 2.0
    assert sum(a["counts"].values()) == len(profiled["layers"]) == len(a["layers"])
    assert a["checks"][-1]["drop_points"] == a["drop_points"] or a["fallback"]
    assert set(a["latency_ms"]) == set(a["speedup"]) == {"16", "1"}
    for k, s in a["speedup"].items():
        assert math.isclose(s, profiled["reference"]["latency_ms"][k] / a["latency_ms"][k])
    # what a bundle does: rebuild from the JSON assignment, same calibration images, same accuracy
    mixed = build_mixed_precision_model(model, a["layers"], images[:CALIB])
    with torch.no_grad():
        acc = (mixed(images[CALIB:]).argmax(1) == labels[CALIB:]).float().mean().item()
    assert acc == pytest.approx(a["accuracy"])


def test_int8_and_bf16_really_change_the_layers_and_stay_close(setup):
    model, images, _, _ = setup
    assignment = {"features.conv2": "int8", "features.conv3": "bfloat16", "classifier.fc2": "int8_dynamic"}
    mixed = build_mixed_precision_model(model, assignment, images[:CALIB])
    q = mixed.get_submodule("features.conv2")
    assert type(q).__module__.startswith("torch.ao.nn.intrinsic.quantized") and q.weight().dtype == torch.qint8
    bf = mixed.get_submodule("features.conv3")
    assert isinstance(bf, BFloat16Layer) and all(p.dtype == torch.bfloat16 for p in bf.parameters())
    assert type(mixed.get_submodule("classifier.fc2")).__module__.startswith("torch.ao.nn.quantized.dynamic")
    assert type(model.features.conv2) is torch.nn.Conv2d and model.features.conv3.weight.dtype == torch.float32
    reference = build_mixed_precision_model(model, {})
    with torch.no_grad():
        x = images[CALIB:]
        want = model(x)
        assert torch.allclose(reference(x), want, atol=1e-4)  # fusion folds BatchNorm, nothing else
        got = mixed(x)
    assert got.dtype == torch.float32
    assert ((got - want).abs().max() / want.abs().max()).item() < 0.1
    assert (got.argmax(1) == want.argmax(1)).float().mean().item() >= 0.9


def test_residual_model_layers_switch_too():
    model = settle_batchnorm(create_model("resnet20", width=0.25))
    x = torch.randn(16, 3, 32, 32)
    assignment = {"layer1.0.conv1": "bfloat16", "layer1.0.conv2": "int8", "layer2.0.shortcut.0": "int8"}
    mixed = build_mixed_precision_model(model, assignment, x)
    assert isinstance(mixed.get_submodule("layer1.0.conv1"), BFloat16Layer)
    for name in ("layer1.0.conv2", "layer2.0.shortcut.0"):  # a conv before a residual add, a projection
        assert type(mixed.get_submodule(name)).__module__.startswith("torch.ao.nn.quantized")
    with torch.no_grad():
        want, got = model(x), mixed(x)
    assert ((got - want).abs().max() / want.abs().max()).item() < 0.1


def test_zero_budget_never_loses_accuracy(setup):
    model, _, _, loader = setup
    prof = profile_layer_precision(model, loader, budget_points=0, layers=["features.conv1", "features.conv5"],
                                   max_samples=SAMPLES, calibration_samples=CALIB, batch_sizes=(16,), repeats=3,
                                   threads=1)
    assert prof["assignment"]["drop_points"] <= 0 and prof["assignment"]["budget_points"] == 0
    assert list(prof["assignment"]["layers"]) == ["features.conv1", "features.conv5"]


def _row(name, f32, **others):
    per = [{"precision": "float32", "supported": True, "drop_points": 0.0, "latency_ms": {"1": f32}}]
    for p, (ms, drop) in others.items():
        per.append({"precision": p, "supported": ms is not None, "drop_points": drop, "latency_ms": {"1": ms}})
    return {"name": name, "per_precision": per}


def test_plan_keeps_float32_when_nothing_is_lossless_and_budget_is_zero():
    rows = [_row("a", 2.0, int8=(1.0, 0.5), bfloat16=(1.5, 0.1)), _row("b", 3.0, int8=(1.0, 2.0))]
    assert plan_assignment(rows, 0.0, 1) == []


def test_plan_takes_the_most_time_per_point_and_may_move_a_layer_twice():
    rows = [
        _row("a", 2.0, bfloat16=(1.5, 0.0), int8=(1.0, 0.4)),  # bf16 free; int8 0.5 ms more for 0.4 points
        _row("b", 3.0, int8=(1.0, 1.0)),                       # 2 ms for 1 point
        _row("c", 1.0, bfloat16=(2.0, 0.0)),                   # slower than float32: never chosen
        _row("d", 2.0, int8=(None, 0.0)),                      # unsupported: never chosen
        _row("e", 2.0, int8=(1.0, -0.3)),                      # better than float32: counts as free
    ]
    moves = lambda budget: [(m["layer"], m["precision"]) for m in plan_assignment(rows, budget, 1)]
    assert moves(0.0) == [("e", "int8"), ("a", "bfloat16")]
    # a's upgrade (1.25 ms/point) comes after b (2 ms/point), and no longer fits
    assert moves(1.0) == [("e", "int8"), ("a", "bfloat16"), ("b", "int8")]
    assert moves(1.5) == [("e", "int8"), ("a", "bfloat16"), ("b", "int8"), ("a", "int8")]
    assert moves(0.5) == [("e", "int8"), ("a", "bfloat16"), ("a", "int8")]


def test_combined_drop_is_measured_and_backed_off(setup, profiled):
    model, images, labels, _ = setup
    # single-layer rows that claim every int8 switch is free, and a calibration set a thousand
    # times too wide: the combined model is far worse than the rows say, so only measuring it
    # and backing off keeps the budget
    rows = json.loads(json.dumps(profiled["layers"]))
    for row in rows:
        f32 = row["per_precision"][0]["latency_ms"]["16"]
        row["per_precision"][1]["supported"] = False
        row["per_precision"][2].update(drop_points=0.0, latency_ms={"16": f32 / 2, "1": 1.0})
    x, y = images[CALIB:], labels[CALIB:]
    reference = build_mixed_precision_model(model, {})
    result, _ = precision_mod._choose(model, reference, rows, ["float32", "bfloat16", "int8"], 0.0, [16], 3,
                                      1000 * images[:CALIB], x, y, 1.0, (3, 32, 32))
    assert result["checks"][0]["switched"] == len(rows) and result["checks"][0]["drop_points"] > 0
    assert len(result["checks"]) > 1 and result["drop_points"] <= 0
    # one move undone per measurement, each one a layer back to float32
    assert [c["switched"] for c in result["checks"]] == list(range(len(rows), len(rows) - len(result["checks"]), -1))
    assert sum(v == "int8" for v in result["layers"].values()) == result["checks"][-1]["switched"]


def test_assignment_slower_than_float32_falls_back(setup, profiled, monkeypatch):
    model, images, labels, _ = setup
    monkeypatch.setattr(precision_mod, "alternating_median_ms", lambda fns, repeats, **kw: {"float32": 1.0, "mixed": 2.0})
    reference = build_mixed_precision_model(model, {})
    result, ref_ms = precision_mod._choose(model, reference, profiled["layers"], ["float32", "bfloat16", "int8"], 100.0,
                                           [16], 3, images[:CALIB], images[CALIB:], labels[CALIB:], 1.0, (3, 32, 32))
    assert "float32 kept" in result["fallback"] and set(result["layers"].values()) == {"float32"}
    assert result["speedup"] == {"16": 1.0} and result["drop_points"] == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"precisions": ("float32", "float8")}, r"`precisions` has an unknown precision 'float8'; choose from float32, bfloat16, int8, int8_dynamic"),
        ({"precisions": ()}, r"`precisions` must be a non-empty sequence"),
        ({"budget_points": -1}, r"`budget_points` must be a finite number >= 0 \(accuracy points\), got -1. HINT"),
        ({"budget_points": float("nan")}, r"`budget_points` must be a finite number >= 0 \(accuracy points\), got nan"),
        ({"layers": ["features.conv99"], "calibration_samples": CALIB}, r"`layers` names an unknown layer 'features.conv99'; compute layers: features.conv1, "),
        ({"max_samples": 0}, r"`max_samples` must be an int >= 1, got 0"),
        ({"batch_sizes": (16, 0)}, r"`batch_sizes` must be an int >= 1, got 0"),
        ({"calibration_samples": 500}, r"`batches` held 96 samples, all taken by `calibration_samples`=500"),
    ],
)
def test_bad_profile_arguments_are_named(setup, kwargs, match):
    model, _, _, loader = setup
    with pytest.raises(ProfileError, match=match):
        profile_layer_precision(model, loader, **kwargs)


def test_empty_data_is_explained_and_threads_are_restored(setup):
    with pytest.raises(ProfileError, match="`batches` yielded no data"):
        profile_layer_precision(setup[0], [], threads=2)
    assert torch.get_num_threads() == 1


def test_bad_assignments_are_named(setup):
    model, images, _, _ = setup
    with pytest.raises(ProfileError, match=r"`assignment` names an unknown layer 'conv1'; compute layers: features.conv1"):
        build_mixed_precision_model(model, {"conv1": "int8"}, images[:4])
    with pytest.raises(ProfileError, match=r"`assignment\['features.conv1'\]` has an unknown precision 'int4'"):
        build_mixed_precision_model(model, {"features.conv1": "int4"}, images[:4])
    with pytest.raises(ProfileError, match=r"'int8_dynamic' is not supported: torch's dynamic quantisation covers linear"):
        build_mixed_precision_model(model, {"features.conv1": "int8_dynamic"})
    with pytest.raises(ProfileError, match=r"`calibration` is required for int8 layers"):
        build_mixed_precision_model(model, {"features.conv1": "int8"})
