"""benchmarks/engine/cpu_wait.py at tiny settings: the summary's layout, through the profiler's own calls."""

import json

from tests.scripts import load_script


def test_cpu_wait_writes_rows_and_goals(tmp_path):
    bench = load_script("benchmarks/engine/cpu_wait.py")
    s = bench.main(["--threads", "1", "--rates", "0", "500", "--burners", "1", "--seconds", "0.1", "--rounds", "1",
                    "--out", str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text())["goals"] == s["goals"]
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "new"
    assert set(s["rows"]) == {"t1@max", "t1@500"}
    for row in s["rows"].values():
        for phase in ("quiet", "burn"):
            assert row[phase]["call_ms"] > 0 and row[phase]["contention"] >= 1.0 and row[phase]["wait_ms"] >= 0
            # the slowdown with the wait is the call-only one times the contention: never below it
            assert row["slowdown_with_wait"][phase] >= row["slowdown_call_only"][phase] - 0.002
    goal = s["goals"]["slowdown_sees_contention"]
    assert {"target", "measured", "met", "call_only"} <= set(goal) and set(goal["measured"]) == set(s["rows"])
