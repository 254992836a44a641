import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("vgg_cifar", ROOT / "recipes" / "vgg_cifar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = ["--data", "synthetic", "--synthetic-train-size", "600", "--synthetic-test-size", "200", "--val-size", "100",
        "--model", "vgg11", "--width", "0.125", "--batch-size", "64", "--accelerator", "cpu"]


def test_baseline_stage_writes_summary_and_reuses_it(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, "--epochs", "1", "--out", str(out)])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["data"]["name"] == "synthetic" and on_disk["data"]["synthetic"] is True
    assert on_disk["model"] == {"name": "vgg11", "width": 0.125, "num_classes": 10}
    base = on_disk["baseline"]
    assert 0 <= base["accuracy"] <= 1 and base["params"] > 0 and base["macs"] > 0
    assert (out / base["checkpoint"]).exists() and (out / "baseline_curves.png").exists()
    assert (out / "logs" / "baseline" / "metrics.csv").exists()

    capsys.readouterr()
    again = recipe.main([*TINY, "--epochs", "1", "--out", str(out)])
    assert "baseline: reusing" in capsys.readouterr().out
    assert again["baseline"] == base


def test_interrupted_training_resumes_from_last_checkpoint(tmp_path, capsys, monkeypatch):
    recipe = _recipe()
    from nestflex.training import ImageClassifier

    out = tmp_path / "run"

    def crash(self):
        if self.current_epoch == 1:
            raise RuntimeError("simulated kill")

    monkeypatch.setattr(ImageClassifier, "on_train_epoch_start", crash, raising=False)
    with pytest.raises(RuntimeError, match="simulated kill"):
        recipe.main([*TINY, "--epochs", "2", "--out", str(out)])
    assert (out / "baseline" / "last.ckpt").exists() and not (out / "baseline" / "model.ckpt").exists()
    monkeypatch.undo()

    capsys.readouterr()
    summary = recipe.main([*TINY, "--epochs", "2", "--out", str(out)])
    assert "baseline: resuming from" in capsys.readouterr().out
    assert summary["baseline"]["epochs"] == 2 and (out / "baseline" / "model.ckpt").exists()
    # the epoch logged before the kill survives next to the resumed run's log
    first = (out / "logs" / "baseline" / "metrics.csv").read_text().splitlines()[1:]
    resumed = (out / "logs" / "baseline-resume1" / "metrics.csv").read_text().splitlines()[1:]
    assert {row.split(",")[0] for row in first} == {"0"} and "1" in {row.split(",")[0] for row in resumed}


def test_bad_flags_are_explained(tmp_path, capsys):
    recipe = _recipe()
    with pytest.raises(SystemExit):
        recipe.main(["--stages", "baseline,nope", "--out", str(tmp_path)])
    assert "unknown stage(s) ['nope']; choose from baseline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["--data", "imagenet"])
    assert "invalid choice: 'imagenet'" in capsys.readouterr().err


def test_cifar10_without_files_names_the_path(tmp_path):
    from nestflex import DataError

    recipe = _recipe()
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        recipe.main(["--data", "cifar10", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])
