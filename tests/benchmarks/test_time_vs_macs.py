"""benchmarks/synthesis/time_vs_macs.py at its smallest: one model at a small input, levels, an exit, goals."""

from __future__ import annotations

import json

from tests.scripts import load_script


def test_time_vs_macs_quick_writes_levels_exits_reference_and_goals(tmp_path):
    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    out = tmp_path / "out"
    # smaller than --quick: a 32x32 input keeps the ResNet-18 table and exports to seconds
    assert bench.main(["--quick", "--size", "32", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert res["model"] == "resnet18" and res["input"] == [3, 32, 32] and res["table_layers"] > 0
    for kind in ("macs", "latency"):
        rows = res["levels"][kind]
        assert [r["target"] for r in rows] == [0.5, 1.0]
        assert rows[-1]["time_share"] == {"b1t1": 1.0} and rows[-1]["macs_share"] == 1.0
        assert 0 < rows[0]["macs_share"] < 1 and rows[0]["ms"]["b1t1"] > 0
    # the MACs-driven level lands near its target MACs share (steps of 10%)
    assert abs(res["levels"]["macs"][0]["macs_share"] - 0.5) < 0.15
    (ex,) = res["exits"]
    assert 0 < ex["macs_saving"] < 1 and ex["ms"]["b1t1"] > 0 and ex["cut_point"]
    ref = summary["reference"]
    assert 0 < ref["floor_ms"]["b1t1"] < ref["full_ms"]["b1t1"] and ref["table_seconds"] > 0
    assert set(summary["goals"]) == {"macs_levels_time_share", "latency_levels_on_target", "exit_time_saving",
                                     "latency_table_seconds"}
    assert all({"target", "measured", "met"} <= set(g) for g in summary["goals"].values())
    assert json.loads((out / "run.json").read_text())["status"] == "new"
