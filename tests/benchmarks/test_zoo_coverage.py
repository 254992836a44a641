"""The zoo coverage benchmark on one small torchvision model with concatenations."""

import json

from tests.scripts import load_script


def test_squeezenet_traces_prunes_and_stays_correct_through_its_fire_concatenations(tmp_path):
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    summary = bench.main(["--zoo", "torchvision", "--models", "squeezenet1_1", "--size", "48", "--out", str(tmp_path)])
    (row,) = summary["rows"]
    assert row["ok"], row
    assert row["pruned_equals_masked"] and row["macs_as_predicted"] and row["macs_left"] < 0.8
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
            "step": "done", "seconds": 1.0}
    (tmp_path / "rows.jsonl").write_text(json.dumps(done) + "\n" + '{"model": "cut sho')  # a line a kill cut short
    summary = bench.main(["--zoo", "torchvision", "--models", "resnet18", "--resume", "--out", str(tmp_path)])
    assert summary["rows"] == [done]  # not run again
    goals = summary["goals"]
    assert goals["passed"]["met"] and goals["passed"]["measured"] == 1 and goals["macs_exact"]["met"]
    assert json.loads((tmp_path / "summary.json").read_text())["goals"] == goals


def test_a_model_with_nothing_pruned_does_not_pass_and_each_tool_counts_what_it_pruned():
    bench = load_script("benchmarks/zoo/zoo_coverage.py")
    rows = [{"model": "a", "ok": True, "pruned": True, "macs_left": 0.5, "tp_ok": True, "tp_macs_left": 0.5},
            {"model": "b", "ok": True, "pruned": False, "macs_left": 1.0, "tp_ok": True, "tp_macs_left": 1.0},
            {"model": "c", "ok": True, "pruned": True, "macs_left": 0.9995, "tp_ok": False, "tp_macs_left": None}]
    summary = {"passed": 3, "pruned": 2, "torch_pruning": {"passed": 2, "both": 1, "median_macs_left_both": None}}
    goals = bench.goals(summary, rows, "timm")
    assert goals["passed"]["measured"] == 2 and not goals["passed"]["met"]  # 3 of 3 needed (50/55 of 3)
    assert "not counted: b" in goals["passed"]["note"] and "c (0.9995" in goals["passed"]["note"]
    assert goals["above_torch_pruning"]["measured"] == {"nestflex": 2, "torch_pruning": 1}
