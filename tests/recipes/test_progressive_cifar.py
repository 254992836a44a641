import json

import pytest

from tests.scripts import load_script


def _recipe():
    return load_script("recipes/progressive_cifar.py")


TINY = [
    "--data",
    "synthetic",
    "--synthetic-train-size",
    "400",
    "--synthetic-test-size",
    "100",
    "--val-size",
    "100",
    "--model",
    "resnet20",
    "--width",
    "0.25",
    "--batch-size",
    "64",
    "--accelerator",
    "cpu",
    "--epochs",
    "1",
    "--positions",
    "0.3,0.6,0.9",
]


def test_joint_training_then_calibration(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, "--out", str(out)])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary)) and on_disk["data"]["synthetic"] is True
    train = on_disk["training"]
    assert train["epochs"] == 1 and train["train_samples"] == 300 and len(train["head_macs"]) == 3
    assert (out / train["checkpoint"]).exists() and (out / "logs" / "train" / "metrics.csv").exists()
    ex = on_disk["exits"]
    assert ex["mode"] == "joint" and ex["head"] == "sdn" and len(ex["layers"]) == 3
    assert len(ex["accuracy"]) == 4 and ex["backbone"]["macs"] == train["backbone_macs"]
    assert ex["sweep"][0]["threshold"] == 0.0 and ex["sweep"][-1]["threshold"] == 1.0
    assert (out / ex["calibration"]).exists() and (out / "exits_tradeoff.png").exists()
    # per-exit validation accuracy is logged every epoch
    header = (out / "logs" / "train" / "metrics.csv").read_text().splitlines()[0]
    assert all(f"val_acc_{name}" in header for name in ex["layers"])

    capsys.readouterr()
    again = recipe.main([*TINY, "--out", str(out), "--stages", "exits", "--confidence", "entropy"])
    assert again["exits"]["confidence"] == "entropy" and again["exits"]["accuracy"] == ex["accuracy"]
    assert again["training"] == train


def test_exits_stage_needs_a_trained_network(tmp_path):
    recipe = _recipe()
    with pytest.raises(
        SystemExit, match="the trained network .* does not exist. HINT: run with --stages train"
    ):
        recipe.main([*TINY, "--out", str(tmp_path), "--stages", "exits"])
