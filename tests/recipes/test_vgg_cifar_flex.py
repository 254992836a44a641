"""The recipe's flex stage (FlexDNN) on a tiny run: summary keys, files, reuse, bad flags."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--data", "synthetic", "--synthetic-train-size", "600", "--synthetic-test-size", "200", "--val-size", "100",
        "--model", "vgg11", "--width", "0.125", "--batch-size", "64", "--accelerator", "cpu", "--epochs", "1"]
FLEX = ["--flex-positions", "0.3,0.6", "--flex-exits-per-location", "2", "--flex-epochs", "1",
        "--flex-train-samples", "128", "--flex-val-samples", "100"]


def _recipe():
    spec = importlib.util.spec_from_file_location("vgg_cifar", ROOT / "recipes" / "vgg_cifar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_flex_stage_writes_plan_and_reuses_it(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, *FLEX, "--out", str(out), "--stages", "baseline,flex"])
    f = summary["flexdnn"]
    assert set(f["candidates"]) <= {"features.relu3", "features.relu4", "features.relu5"} and len(f["candidates"]) == 2
    assert f["validation"]["mean_macs"] <= f["backbone_macs"]
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


def test_bad_flex_flags_are_explained(tmp_path, capsys):
    recipe = _recipe()
    with pytest.raises(SystemExit):
        recipe.main(["--flex-exits-per-location", "0", "--out", str(tmp_path)])
    assert "--flex-epochs, --flex-exits-per-location and --flex-base-width must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["--flex-rate-tolerance", "1.5", "--out", str(tmp_path)])
    assert "--flex-rate-tolerance is a share of samples in [0, 1), got 1.5" in capsys.readouterr().err
