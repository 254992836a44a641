"""The zoo coverage benchmark on one small torchvision model with concatenations."""

import json

from tests.scripts import load_script


def test_squeezenet_traces_prunes_and_stays_correct_through_its_fire_concatenations(tmp_path):
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    summary = bench.main(["--zoo", "torchvision", "--models", "squeezenet1_1", "--size", "48", "--out", str(tmp_path)])
    (row,) = summary["rows"]
    assert row["ok"] and row["passes"], row
    assert row["pruned_equals_masked"] and row["macs_as_predicted"] and row["macs_left"] < 0.8
    # issue 40: head then tail = model at three split points, exits placed, the approximate prune beside
    assert row["split_checked"] == 3 and row["split_exact"] and row["exits"] == 6
    assert row["approx"] == {"prunable": row["prunable"], "approximate_groups": 0, "macs_left": row["macs_left"],
                             "output_change": 0.0, "macs_as_predicted": True}
    assert row["prunable"] > 0 and 0.9 < row["macs_vs_flop_counter"] <= 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["passed"] == 1


def test_a_model_that_fails_is_one_row_with_its_error(tmp_path):
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    row = bench.main(["--zoo", "torchvision", "--one", "no_such_model"])
    assert row["ok"] is False and "no_such_model" in row["error"]


def test_torch_pruning_column_on_a_grouped_conv_model(tmp_path):
    import torch_pruning  # noqa: F401  (the dev extra installs it: missing is a broken install, not a skip)
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    summary = bench.main(["--zoo", "torchvision", "--models", "regnet_x_400mf", "--size", "32", "--torch-pruning",
                          "--out", str(tmp_path)])
    (row,) = summary["rows"]
    # RegNet's grouped convs prune (they were locked: 5 of 28 groups free, 0.76 of the MACs left)
    assert row["ok"] and row["prunable"] > 20 and row["macs_left"] < 0.7, row
    assert row["tp_ok"] and 0 < row["tp_macs_left"] < 1, row
    assert summary["torch_pruning"]["both"] == 1 and summary["torch_pruning"]["version"]


def test_a_model_past_its_time_is_a_row_with_its_seconds():
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    row = bench.run_child("torchvision", "resnet18", 32, 0.3, timeout=0.01)
    assert row["ok"] is False and "timed out" in row["error"] and row["seconds"] == 0.0


def test_resume_keeps_the_rows_already_written_and_reports_goals(tmp_path):
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    done = {"model": "resnet18", "ok": True, "pruned": True, "macs_left": 0.5, "macs_vs_flop_counter": 1.0,
            "step": "done", "seconds": 1.0, "split_exact": True, "passes": True}
    (tmp_path / "rows.jsonl").write_text(json.dumps(done) + "\n" + '{"model": "cut sho')  # a line a kill cut short
    summary = bench.main(["--zoo", "torchvision", "--models", "resnet18", "--resume", "--out", str(tmp_path)])
    assert summary["rows"] == [done]  # not run again
    goals = summary["goals"]
    assert goals["passed"]["met"] and goals["passed"]["measured"] == 1 and goals["macs_exact"]["met"]
    assert json.loads((tmp_path / "summary.json").read_text())["goals"] == goals


def test_a_model_with_nothing_pruned_does_not_pass_and_each_tool_counts_what_it_pruned():
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    split = {"split_exact": True}
    rows = [{"model": "a", "ok": True, "pruned": True, "passes": True, "macs_left": 0.5, "tp_ok": True,
             "tp_macs_left": 0.5, **split},
            {"model": "b", "ok": True, "pruned": False, "macs_left": 1.0, "tp_ok": True, "tp_macs_left": 1.0, **split},
            {"model": "c", "ok": True, "pruned": True, "passes": True, "macs_left": 0.9995, "tp_ok": False,
             "tp_macs_left": None, **split},
            # no exact group, an approximate prune with its MACs as predicted: passes, and the note says so
            {"model": "d", "ok": True, "pruned": False, "passes": True, "macs_left": 1.0, **split,
             "approx": {"macs_left": 0.5, "macs_as_predicted": True}},
            {"model": "e", "ok": True, "pruned": True, "passes": False, "macs_left": 0.5, "split_exact": False}]
    summary = {"passed": 5, "pruned": 3, "torch_pruning": {"passed": 2, "both": 1, "median_macs_left_both": None}}
    goals = bench.goals(summary, rows, "timm")
    assert goals["passed"]["measured"] == 3 and not goals["passed"]["met"]  # 5 of 5 needed (52/55 of 5)
    note = goals["passed"]["note"]
    assert "nothing prunable even with approximate=True, not counted: b" in note and "c (0.9995" in note
    assert "prune only with approximate=True: d" in note and "no split point with head + tail = model, not " \
        "counted: e" in note and "2 pass with an exact prune" in note
    assert goals["above_torch_pruning"]["measured"] == {"nestflex": 3, "torch_pruning": 1}
    assert goals["exact_by_default"]["measured"] == "0/3"  # rows without pruned_equals_masked: not shown exact


def test_the_approximate_goal_compares_medians_with_torch_pruning():
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    rows = [{"model": m, "approx": {"macs_left": ours, "output_change": 0.1}, "tp_ok": True, "tp_macs_left": theirs}
            for m, ours, theirs in zip(bench.APPROX_GOAL_MODELS, (0.50, 0.52, 0.49), (0.50, 0.47, 0.49))]
    goal = bench.approximate_goal(rows)
    assert goal["met"] and goal["measured"]["gap"] == 0.01  # medians 0.50 vs 0.49
    assert goal["measured"]["per_model"]["convnext_tiny"] == {"nestflex_approximate": 0.49, "torch_pruning": 0.49,
                                                              "output_change": 0.1}
    missing = bench.approximate_goal(rows[:2])
    assert not missing["met"] and "convnext_tiny" in missing["note"]
