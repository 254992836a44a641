import json

import pytest

from tests.scripts import FLEX, load_script
from tests.scripts import TINY as TINY_BASE


def _recipe():
    return load_script("recipes/vgg_cifar.py")


TINY = [*TINY_BASE, "--precision-calibration", "32", "--prune-max-steps", "2", "--prune-triplets", "60"]


def test_baseline_stage_writes_summary_and_reuses_it(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, "--epochs", "1", "--out", str(out)])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["data"]["name"] == "synthetic" and on_disk["data"]["synthetic"] is True
    assert on_disk["model"] == {"name": "vgg11", "width": 0.125, "num_classes": 10, "input_shape": [3, 32, 32]}
    base = on_disk["baseline"]
    assert 0 <= base["accuracy"] <= 1 and base["params"] > 0 and base["macs"] > 0
    assert (out / base["checkpoint"]).exists() and (out / "baseline_curves.png").exists()
    assert (out / "logs" / "baseline" / "metrics.csv").exists()
    timing = on_disk["timing"]
    assert list(timing["stages"]) == recipe.parse_args([]).stage_list  # every default stage, in order
    assert timing["seconds"] >= sum(timing["stages"].values()) - 1 and timing["stages"]["baseline"] > 0
    prec = on_disk["quantization"]["precision"]
    assert prec["drop_points"] <= prec["budget_points"] == 1.0 and prec["batch_size"] == 64
    assert sum(prec["counts"].values()) == 10 and prec["samples"] == 100 - 32  # vgg11: 8 convs + 2 linears
    assert prec["speedup"] > 0 and (out / prec["profile"]).exists() and (out / "layer_precision.png").exists()

    capsys.readouterr()
    again = recipe.main([*TINY, "--epochs", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "baseline: reusing" in printed and "reusing " + str(out / "profile" / "layer_precision.json") in printed
    assert again["baseline"] == base and again["quantization"]["precision"] == prec
    # a reused stage reports the time it took when it ran, not its reuse time (export always re-runs)
    reused = again["timing"]["reused"]
    assert reused == [s for s in timing["stages"] if s != "export"]
    assert all(again["timing"]["stages"][s] == timing["stages"][s] for s in reused)


def test_interrupted_training_resumes_from_last_checkpoint(tmp_path, capsys, monkeypatch):
    recipe = _recipe()
    from nestflex.training import ImageClassifier

    out = tmp_path / "run"

    def crash(self):
        if self.current_epoch == 1:
            raise RuntimeError("simulated kill")

    monkeypatch.setattr(ImageClassifier, "on_train_epoch_start", crash, raising=False)
    with pytest.raises(RuntimeError, match="simulated kill"):
        recipe.main([*TINY, "--epochs", "2", "--out", str(out), "--stages", "baseline"])
    assert (out / "baseline" / "last.ckpt").exists() and not (out / "baseline" / "model.ckpt").exists()
    monkeypatch.undo()

    capsys.readouterr()
    summary = recipe.main([*TINY, "--epochs", "2", "--out", str(out), "--stages", "baseline"])
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
    with pytest.raises(SystemExit):
        recipe.main(["--precision-budget", "-0.5", "--out", str(tmp_path)])
    assert "--precision-budget must be >= 0 accuracy points, got -0.5" in capsys.readouterr().err


def test_cifar10_without_files_names_the_path(tmp_path):
    from nestflex import DataError

    recipe = _recipe()
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        recipe.main(["--data", "cifar10", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")])


def test_prune_stage_writes_roadmap_and_seed_and_reuses_them(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    args = [*TINY, "--epochs", "2", "--out", str(out), "--stages", "baseline,prune", "--prune-max-drop", "50"]
    summary = recipe.main(args)
    pr = summary["pruning"]
    assert pr["criterion"] == "trr" and pr["roadmap"] == "prune/roadmap.json" and (out / pr["roadmap"]).exists()
    road = json.loads((out / pr["roadmap"]).read_text())
    assert road["schema_version"] == 2 and road["seed"] == pr["steps"] == 2 and pr["status"] == "max_steps"
    assert pr["macs"] == road["footprints"][-1]["macs"] < summary["baseline"]["macs"]
    assert pr["params"] < summary["baseline"]["params"] and 0 <= pr["accuracy"] <= 1
    assert (out / "prune" / "seed.ckpt").exists() and (out / "prune_roadmap.png").exists()
    # what the stop means: its reason, the split it was judged on, the noise of that split
    assert pr["val_size"] == road["eval_samples"] == 100 and pr["noise"]["eval_samples"] == 100
    assert pr["noise"]["warning"] is None and pr["noise"]["margin_se"] >= 2  # a 50-point goal is no noise
    assert pr["start_val_accuracy"] == road["start_accuracy"] and pr["rejected_steps"] == len(road["rejected"])
    ft = pr["finetune"]  # the default 2 epochs of fine-tuning for the seed, judged on validation
    assert ft == road["finetune"] and ft["epochs"] == 2 and ft["before"] <= road["footprints"][-1]["accuracy"]
    assert ft["kept"] == (road["footprints"][-1]["accuracy"] == ft["after"])
    capsys.readouterr()
    again = recipe.main(args)
    assert "prune: reusing" in capsys.readouterr().out and again["pruning"] == pr


def test_grow_stage_builds_nested_levels_and_reuses_them(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    args = [*TINY, "--epochs", "1", "--out", str(out), "--stages", "baseline,prune,grow", "--prune-max-drop", "50",
            "--grow-levels", "3", "--grow-latency-repeats", "1"]
    summary = recipe.main(args)
    g = summary["grow"]
    assert [lv["level"] for lv in summary["levels"]] == [0, 1, 2] and summary["levels"] == g["levels"]
    road = json.loads((out / "prune" / "roadmap.json").read_text())
    assert g["steps"] == [2, 1, 0] and [lv["macs"] for lv in g["levels"]] == [f["macs"] for f in road["footprints"][::-1]]
    assert all(0 <= lv["accuracy"] <= 1 and set(lv["latency_ms"]) == {"1", "64"} for lv in g["levels"])
    m = summary["memory"]
    assert g["levels"][-1]["memory_mb"] < m["multi_capacity_mb"] <= 1.05 * g["levels"][-1]["memory_mb"] < m["independent_mb"]
    assert (out / "grow" / "model.ckpt").exists() and (out / "grow" / "capacity.json").exists()
    capsys.readouterr()
    again = recipe.main([*args[:args.index("--stages")], "--stages", "grow", *args[args.index("--stages") + 2:]])
    assert "grow: reusing" in capsys.readouterr().out and again["grow"] == g


def test_exits_stage_trains_calibrates_and_reuses(tmp_path, capsys):
    recipe = _recipe()
    out = tmp_path / "run"
    flags = [*TINY, "--epochs", "1", "--exit-epochs", "1", "--exit-positions", "0.3,0.6", "--out", str(out)]
    summary = recipe.main([*flags, "--stages", "baseline,exits"])
    ex = json.loads((out / "summary.json").read_text())["exits"]
    assert ex["mode"] == "exits_only" and ex["head"] == "sdn" and ex["epochs"] == 1
    assert ex["layers"] == ["features.relu3", "features.relu5"] and len(ex["positions"]) == 2
    assert len(ex["accuracy"]) == 3 and all(0 <= a <= 1 for a in ex["accuracy"])
    # exits_only: the final exit is the frozen baseline
    assert ex["accuracy"][-1] == ex["backbone"]["accuracy"] == summary["baseline"]["accuracy"]
    assert [r["threshold"] for r in ex["sweep"]][0] == 0.0 and ex["sweep"][-1]["macs_fraction"] > 1.0
    assert ex["sweep"][0]["macs_fraction"] == ex["macs_fraction"][0] < 0.5
    calibration = json.loads((out / ex["calibration"]).read_text())
    assert calibration["split"] == "validation" and calibration["samples"] == 100
    assert json.loads((out / ex["test_profile"]).read_text())["samples"] == 200
    assert ex["lossless"]["thresholds"] == calibration["lossless"]["thresholds"]
    assert (out / ex["checkpoint"]).exists() and (out / "exits_tradeoff.png").exists()
    assert (out / "logs" / "exits" / "metrics.csv").exists()

    capsys.readouterr()
    again = recipe.main([*flags, "--stages", "exits", "--exit-confidence", "entropy"])
    assert "exits: reusing" in capsys.readouterr().out  # a new confidence re-calibrates, no retraining
    assert again["exits"]["confidence"] == "entropy" and again["exits"]["accuracy"] == ex["accuracy"]
    with pytest.raises(SystemExit):
        recipe.main([*flags, "--exit-epochs", "0"])
    assert "--exit-epochs must be >= 1, got 0" in capsys.readouterr().err


def test_exits_stage_resumes_after_a_kill(tmp_path, capsys, monkeypatch):
    recipe = _recipe()
    from nestflex.exits import MultiExitClassifier

    out = tmp_path / "run"
    flags = [*TINY, "--epochs", "1", "--exit-epochs", "2", "--exit-positions", "0.3,0.6", "--out", str(out)]
    recipe.main([*flags, "--stages", "baseline"])

    def crash(self):
        if self.current_epoch == 1:
            raise RuntimeError("simulated kill")

    monkeypatch.setattr(MultiExitClassifier, "on_train_epoch_start", crash, raising=False)
    with pytest.raises(RuntimeError, match="simulated kill"):
        recipe.main([*flags, "--stages", "exits"])
    assert (out / "exits" / "last.ckpt").exists() and not (out / "exits" / "model.ckpt").exists()
    monkeypatch.undo()

    capsys.readouterr()
    summary = recipe.main([*flags, "--stages", "exits"])
    assert "exits: resuming from" in capsys.readouterr().out
    assert summary["exits"]["epochs"] == 2 and (out / "exits" / "model.ckpt").exists()
    assert (out / "logs" / "exits-resume1" / "metrics.csv").exists()


def test_export_stage_without_grow_or_exits_bundles_the_baseline(tmp_path, capsys):
    import nestflex.deploy as nd

    recipe = _recipe()
    out = tmp_path / "run"
    summary = recipe.main([*TINY, "--epochs", "1", "--out", str(out), "--stages", "baseline,export"])
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == f"bundle: {out / 'bundle.nfx'}"
    x = summary["export"]
    assert x["levels"] == 1 and x["exits_backbone"] is None and x["exit_heads_bytes"] == 0
    bundle = nd.load(out / x["bundle"])
    assert bundle.levels[0]["macs"] == summary["baseline"]["macs"] and bundle.exits is None
    assert x["weights_bytes"] <= 1.1 * x["largest_level_bytes"]


def test_export_stage_writes_a_bundle_with_exits_on_the_grown_model(tmp_path, capsys):
    import nestflex.deploy as nd

    recipe = _recipe()
    out = tmp_path / "run"
    flags = [*TINY, *FLEX, "--epochs", "1", "--out", str(out), "--prune-max-drop", "50", "--grow-levels", "3",
             "--grow-latency-repeats", "1", "--exit-epochs", "1", "--exit-positions", "0.3,0.6"]
    summary = recipe.main([*flags, "--stages", "baseline,prune,grow,exits,flex,export"])
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1] == f"bundle: {out / 'bundle.nfx'}"
    assert summary["exits"]["backbone_source"] == "grow (largest level)"
    # FlexDNN plans on the same backbone as the exits, so the bundle stores no second backbone
    assert json.loads((out / "flex" / "config.json").read_text())["backbone"]["level"] == "largest"
    x = json.loads((out / "summary.json").read_text())["export"]
    assert x["bundle"] == "bundle.nfx" and x["levels"] == 3 and x["exits_backbone"] == "shared"
    assert x["flex_exits_backbone"] == ("shared" if x["flex_exits"] else None)
    assert x["bytes"] == x["weights_bytes"] + x["onnx_bytes"] + x["metadata_bytes"] + x["samples_bytes"]
    assert x["onnx_bytes"] > 0 and x["samples_bytes"] > 0  # validation samples for `nestflex tune` (int8)
    heads = x["exit_heads_bytes"] + x.get("flex_exit_heads_bytes", 0)
    assert x["weights_bytes"] <= 1.1 * (x["largest_level_bytes"] + heads)
    bundle = nd.load(out / x["bundle"])
    assert [r["macs"] for r in bundle.levels] == [lv["macs"] for lv in summary["levels"]]
    assert bundle.exits["thresholds"] == json.loads((out / "exits" / "calibration.json").read_text())["lossless"]["thresholds"]
    flex_profile = {"flexdnn_plan"} if x["flex_exits"] else set()
    assert set(bundle.manifest["profiles"]) == {"exit_calibration", *flex_profile}  # the profile stage did not run
    # a later run rebuilds the grown model from --out for the export stage alone
    again = recipe.main([*flags, "--stages", "export"])
    assert again["export"]["weights_bytes"] == x["weights_bytes"] and again["export"]["exits_backbone"] == "shared"
