"""The recipe with the latency cost (``--prune-cost latency``) end to end at the tiniest settings."""

import json

from nestflex.profiling import LatencyTable
from tests.scripts import TINY, load_script


def test_prune_cost_latency_plans_the_roadmap_and_the_levels_in_measured_time(tmp_path, capsys):
    recipe = load_script("recipes/vgg_cifar.py")
    out = tmp_path / "run"
    args = [*TINY, "--out", str(out), "--stages", "baseline,prune,grow", "--prune-cost", "latency",
            "--prune-criterion", "l1", "--prune-step", "0.5", "--prune-max-steps", "1", "--prune-max-drop", "99",
            "--prune-finetune-epochs", "0", "--prune-recover-epochs", "0", "--grow-levels", "2",
            "--grow-latency-repeats", "1"]
    summary = recipe.main(args)
    pr = summary["pruning"]
    road = json.loads((out / pr["roadmap"]).read_text())
    table = LatencyTable.load(out / "prune" / "latency_table.json")  # measured here, kept with the stage
    assert road["cost"]["model"] == "latency" and road["cost"]["threads"] == table.threads == 1
    assert pr["cost"]["seed"] == road["footprints"][-1]["cost"] < pr["cost"]["vanilla"] == road["footprints"][0]["cost"]
    for fp in road["footprints"]:  # every kept width is a measured fast width
        assert all(w in road["cost"]["widths"][g] for g, w in fp["widths"].items())
    plan = json.loads((out / "grow" / "capacity.json").read_text())["plan"]
    assert plan["costs"] == [road["footprints"][-1]["cost"], road["footprints"][0]["cost"]]
    # a table built elsewhere (on the device) is used as given: a copy of this one plans the same widths
    device = tmp_path / "device_table.json"
    table.save(device)
    args[args.index("--stages") + 1] = "baseline,prune"  # the baseline is reused, the prune stage runs again
    road2 = json.loads((out / recipe.main([*args, "--latency-table", str(device)])["pruning"]["roadmap"]).read_text())
    assert road2["cost"]["widths"] == road["cost"]["widths"]
    capsys.readouterr()
