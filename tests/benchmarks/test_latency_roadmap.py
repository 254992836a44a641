"""benchmarks/recipe/latency_roadmap.py's timing: both runs' levels in their plans, in alternation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.export.bundles import write_bundle

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("latency_roadmap", ROOT / "benchmarks/recipe/latency_roadmap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_time_bundles_times_every_level_of_both_runs_in_their_plans(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_bundle(a)
    write_bundle(b)
    got = _bench().time_bundles({"macs": a / "model.nfx", "latency": b / "model.nfx"}, repeats=3)
    assert set(got) == {"macs", "latency"}
    for run in got.values():
        assert len(run["level_ms"]) == len(run["plan_ms"]) >= 2
        assert all(ms > 0 for ms in run["level_ms"] + run["plan_ms"])


def test_goals_judge_the_median_seed_speedup_and_accuracy():
    rows = [{"seed": s, "seed_speedup": v, "accuracy_difference_points": d,
             "latency": {"level_ms": [1.0, 2.0], "ordered": True, "table_seconds": 1.5}}
            for s, v, d in ((0, 1.1, 0.2), (1, 1.3, -0.4), (2, 1.25, -0.6))]
    g = _bench().goals(rows)
    assert g["seed_speedup"]["measured"] == 1.25 and g["seed_speedup"]["met"]
    assert g["seed_accuracy"]["measured"] == -0.4 and g["seed_accuracy"]["met"]
    assert g["levels_ordered"]["met"] and g["latency_table_seconds"]["met"]
    rows[1]["latency"]["ordered"] = False
    assert not _bench().goals(rows)["levels_ordered"]["met"]
