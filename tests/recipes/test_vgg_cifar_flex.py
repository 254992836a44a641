"""The recipe's flex stage (FlexDNN) on a tiny run: summary keys, files, reuse, bad flags."""

import json

import pytest

from tests.scripts import FLEX, TINY, load_script


def _recipe():
    return load_script("recipes/vgg_cifar.py")


def test_flex_stage_writes_plan_and_reuses_it(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, *FLEX, "--out", str(out), "--stages", "baseline,flex"])
    f = summary["flexdnn"]
    assert set(f["candidates"]) <= {"features.relu3", "features.relu4", "features.relu5"} and len(f["candidates"]) == 2
    assert f["validation"]["mean_macs"] <= f["backbone_macs"]
    assert f["calibration"]["split"] == "calibration" and f["calibration"]["samples"] == 40
    assert len(f["thresholds"]) == len(f["kept_locations"])
    for name in ("spec.json", "report.json", "config.json"):
        assert (out / "flex" / name).is_file()
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["flexdnn"]["kept_locations"] == f["kept_locations"]
    if f["kept_locations"]:
        assert 0 < f["mean_macs_fraction"] <= 1.0 and 0.0 <= f["accuracy"] <= 1.0
    again = recipe.main([*TINY, *FLEX, "--out", str(out), "--stages", "flex"])
    assert "flex: reusing" in capsys.readouterr().out
    assert again["flexdnn"] == f
    # the default trains on every training image (500 = 600 - 100 validation) through the DataModule's own
    # training loader, which drops the last partial batch: 7 batches of 64, not a subset
    i = FLEX.index("--flex-train-samples")
    recipe.main([*TINY, *FLEX[:i], *FLEX[i + 2:], "--out", str(out), "--stages", "flex"])
    assert "flex: reusing" not in capsys.readouterr().out
    assert json.loads((out / "flex" / "config.json").read_text())["train_samples"] is None
    assert json.loads((out / "flex" / "report.json").read_text())["training"]["steps"] == 7


def test_bad_flex_flags_are_explained(tmp_path, capsys):
    recipe = _recipe()
    with pytest.raises(SystemExit):
        recipe.main(["--flex-exits-per-location", "0", "--out", str(tmp_path)])
    assert "--flex-exits-per-location must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["--flex-train-samples", "0", "--out", str(tmp_path)])
    assert ("--flex-train-samples must be >= 1, got 0. HINT: leave it out for all training images"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        recipe.main(["--flex-val-samples", "0", "--out", str(tmp_path)])
    assert "--flex-val-samples must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["--flex-rate-tolerance", "1.5", "--out", str(tmp_path)])
    assert "--flex-rate-tolerance is a share of samples in [0, 1), got 1.5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["--flex-calibration-samples", "3", "--out", str(tmp_path)])
    assert ("--flex-calibration-samples must be 0 (thresholds on the planning images) or >= 5 (the cross-validation "
            "folds), got 3") in capsys.readouterr().err


def test_a_small_validation_split_is_shared_between_planning_and_calibration(tmp_path, capsys):
    recipe = _recipe()
    args = [*TINY, *FLEX, "--flex-val-samples", "120", "--out", str(tmp_path / "run"), "--stages", "baseline,flex"]
    f = recipe.main(args)["flexdnn"]
    # FlexDNNExits draws all 100 and holds out the asked share (40 / 160) to calibrate
    assert f["calibration"]["split"] == "calibration" and f["calibration"]["samples"] == 25
    # too few left to cross-validate on: everything plans, and the thresholds are cross-validated there
    args = [*TINY, *FLEX, "--flex-val-samples", "1000", "--flex-calibration-samples", "5",
            "--out", str(tmp_path / "run"), "--stages", "flex"]
    f = recipe.main(args)["flexdnn"]
    assert f["calibration"]["split"] == "validation" and f["calibration"]["samples"] == 100


def test_a_plan_that_keeps_no_exit_reports_the_backbone_alone(tmp_path, monkeypatch):
    """When no exit pays for itself the summary still says what the flex stage ships: the backbone."""
    import dataclasses
    import importlib

    flex_module = importlib.import_module("nestflex.exits.flexdnn.pipeline")  # where flexdnn() calls it

    real = flex_module.insertion_plan
    monkeypatch.setattr(flex_module, "insertion_plan",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), kept=[], thresholds=[]))
    recipe = _recipe()
    summary = recipe.main([*TINY, *FLEX, "--out", str(tmp_path / "run"), "--stages", "baseline,flex"])
    f = summary["flexdnn"]
    assert f["kept_locations"] == [] and f["thresholds"] == [] and f["operating_points"] == 0
    assert f["mean_macs"] == f["backbone_macs"] and f["mean_macs_fraction"] == 1.0 and f["exit_rate"] == []
    assert f["accuracy"] == f["backbone_accuracy"] == pytest.approx(summary["baseline"]["accuracy"])
    assert not (tmp_path / "run" / "flex" / "model.safetensors").exists()
