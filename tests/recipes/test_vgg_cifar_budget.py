"""The recipe's budget modes (``--prune-target``, ``--prune-target-cost``) end to end at the tiniest settings."""

import json

from tests.pruning.test_budget import proportional_table
from tests.scripts import TINY, load_script


def test_prune_target_prunes_the_baseline_to_the_budget_and_reports_the_accuracy(tmp_path, capsys):
    recipe = load_script("recipes/vgg_cifar.py")
    out = tmp_path / "run"
    # step 0.5 and 10 steps at most: room to reach 0.3 of the MACs; no fine-tuning keeps it short
    args = [*TINY, "--out", str(out), "--stages", "baseline,prune", "--prune-target", "0.3", "--prune-criterion", "l1",
            "--prune-step", "0.5", "--prune-max-steps", "10", "--prune-finetune-epochs", "0"]
    summary = recipe.main(args)
    pr = summary["pruning"]
    road = json.loads((out / pr["roadmap"]).read_text())
    assert (pr["mode"], pr["target_macs"], pr["status"]) == ("macs", 0.3, "target_reached")
    assert (road["mode"], road["target_macs"]) == ("macs", 0.3) and not road["rejected"]
    assert pr["macs_fraction"] <= 0.3 and pr["macs"] <= 0.3 * summary["baseline"]["macs"]
    assert 0 <= pr["accuracy"] <= 1 and pr["val_accuracy"] == road["footprints"][-1]["accuracy"]
    assert all(0 <= f["accuracy"] <= 1 for f in road["footprints"])
    capsys.readouterr()
    assert recipe.main(args)["pruning"] == pr  # cached: the target is part of the stage's config
    assert "prune: reusing" in capsys.readouterr().out


def test_prune_target_cost_prunes_the_baseline_to_the_latency_tables_budget(tmp_path):
    """On a hand-made table (time in proportion to each layer's channels): with one measured here, the
    tiny model's fast widths ran out at 0.77 of its time in one run (status nothing_left)."""
    recipe = load_script("recipes/vgg_cifar.py")
    out = tmp_path / "run"
    table = proportional_table().save(tmp_path / "table.json")
    args = [*TINY, "--out", str(out), "--stages", "baseline,prune", "--prune-cost", "latency",
            "--latency-table", str(table), "--prune-target-cost", "0.5", "--prune-criterion", "l1", "--prune-step", "0.5", "--prune-max-steps", "10",
            "--prune-finetune-epochs", "0"]
    pr = recipe.main(args)["pruning"]
    road = json.loads((out / pr["roadmap"]).read_text())
    assert (pr["mode"], pr["target_cost"], pr["target_macs"], pr["status"]) == ("cost", 0.5, None, "target_reached")
    assert (road["mode"], road["target_cost"]) == ("cost", 0.5) and not road["rejected"]
    assert pr["cost"]["seed"] <= 0.5 * pr["cost"]["vanilla"] < road["footprints"][-2]["cost"]
    assert json.loads((out / "prune" / "config.json").read_text())["target_cost"] == 0.5  # part of the stage's config


def test_prune_decision_paired_judges_every_step_with_the_bound(tmp_path):
    """--prune-decision paired reaches FilterPruning: every judged footprint carries its verdict, and the
    stage's config records the rule (a threshold run's config stays as before)."""
    recipe = load_script("recipes/vgg_cifar.py")
    out = tmp_path / "run"
    args = [*TINY, "--out", str(out), "--stages", "baseline,prune", "--prune-criterion", "l1", "--prune-step", "0.5",
            "--prune-max-steps", "2", "--prune-finetune-epochs", "0", "--prune-decision", "paired",
            "--prune-confidence", "0.8"]
    pr = recipe.main(args)["pruning"]
    road = json.loads((out / pr["roadmap"]).read_text())
    judged = road["footprints"][1:] + road["rejected"]
    assert judged and all(f["decision"]["confidence"] == 0.8 and f["decision"]["n"] > 0 for f in judged)
    config = json.loads((out / "prune" / "config.json").read_text())
    assert (config["decision"], config["confidence"]) == ("paired", 0.8)
    threshold = tmp_path / "threshold"
    recipe.main([*TINY, "--out", str(threshold), "--stages", "baseline,prune", "--prune-criterion", "l1",
                 "--prune-step", "0.5", "--prune-max-steps", "1", "--prune-finetune-epochs", "0"])
    assert not {"decision", "confidence", "confirm"} & set(json.loads((threshold / "prune" / "config.json").read_text()))


def test_prune_confirm_judges_the_seed_and_the_summary_carries_the_verdicts(tmp_path):
    """--prune-confirm reaches FilterPruning: a 50-point goal confirms the seed at once, and the stage's
    summary and config carry it."""
    recipe = load_script("recipes/vgg_cifar.py")
    out = tmp_path / "run"
    args = [*TINY, "--out", str(out), "--stages", "baseline,prune", "--prune-criterion", "l1", "--prune-step", "0.5",
            "--prune-max-steps", "1", "--prune-finetune-epochs", "0", "--prune-max-drop", "50", "--prune-confirm", "0.9"]
    pr = recipe.main(args)["pruning"]
    road = json.loads((out / pr["roadmap"]).read_text())
    assert pr["steps"] == 1 and pr["confirm"] == road["confirm"]
    assert [(c["step"], c["confirmed"], c["confidence"]) for c in pr["confirm"]] == [(1, True, 0.9)]
    assert pr["confirm"][0]["n"] > 0 and pr["confirm"][0]["lower"] >= -0.5
    assert json.loads((out / "prune" / "config.json").read_text())["confirm"] == 0.9
