"""benchmarks/pruning/keep_reject.py at tiny settings: the summary's layout and the rules' ordering."""

import json

import pytest

from tests.scripts import load_script


def test_keep_reject_writes_rates_and_goals(tmp_path):
    bench = load_script("benchmarks/pruning/keep_reject.py")
    s = bench.main(["--n", "2000", "--reps", "300", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text())["goals"] == s["goals"]
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "new"
    assert set(s["goals"]) == {"false_reject_at_goal", "paired_false_reject_below_threshold_rule"}
    assert all({"target", "measured", "met"} <= set(g) for g in s["goals"].values())
    # at the goal the threshold rule is a coin toss; the paired rule rejects about 1 - confidence
    assert 0.4 < s["false_reject"]["threshold"]["0.0"] < 0.6 and s["false_reject"]["paired"]["0.0"] < 0.2
    # ...and pays for it in false keeps just below the goal
    assert s["false_keep"]["paired"]["0.5"] > s["false_keep"]["threshold"]["0.5"]


def test_cells_refuse_an_impossible_joint_distribution():
    bench = load_script("benchmarks/pruning/keep_reject.py")
    assert bench.cells(0.87, 0.01, 0.067).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no joint distribution"):
        bench.cells(0.87, 0.1, 0.05)  # a 10-point drop needs at least 10% of the images discordant
