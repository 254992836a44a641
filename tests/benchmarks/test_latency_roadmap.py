"""benchmarks/recipe/latency_roadmap.py's timing: both runs' levels in their plans, in alternation."""

from __future__ import annotations

import importlib.util
import os
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


def _fake_run_seed(calls):
    def run_seed(seed, out, stages, flags, threads=None):
        calls.append((seed, out.name, list(flags), threads))
        return {"seconds": 1.0, "summary": {"pruning": {"accuracy": 0.8, "macs": 10}, "baseline": {"accuracy": 0.81},
                                            "grow": {"levels": [{"accuracy": 0.8, "macs": 10}], "steps": [0]}}}
    return run_seed


def test_jobs_run_every_macs_run_before_any_latency_run_and_share_one_table(tmp_path, monkeypatch):
    bench, calls, tables = _bench(), [], []
    monkeypatch.setattr(bench, "run_seed", _fake_run_seed(calls))
    measured = tmp_path / "measured.json"
    monkeypatch.setattr(bench, "shared_table", lambda root, seed, extra: tables.append(seed) or measured)
    rows = bench.run_recipes([0, 1, 2], tmp_path, ["--prune-snap", "up"], jobs=2)
    assert [c[1] for c in calls] == ["macs"] * 3 + ["latency"] * 3 and tables == [0]  # measured once, between
    assert {c[0] for c in calls[:3]} == {c[0] for c in calls[3:]} == {0, 1, 2}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert all(c[3] == max(1, cores // 2) for c in calls)
    for _, cost, flags, _ in calls:  # the measured table goes to the latency-driven runs only
        assert flags[:2] == ["--prune-cost", cost]
        assert (flags[2:4] == ["--latency-table", str(measured)]) == (cost == "latency")
    assert set(rows) == {0, 1, 2} and set(rows[0]) == {"macs", "latency"}
    calls.clear()  # a table the user gives goes once, to both runs, as with --jobs 1
    bench.run_recipes([0], tmp_path, ["--latency-table=device.json"], jobs=2)
    assert [sum(f.startswith("--latency-table") for f in c[2]) for c in calls] == [1, 1]


def test_the_shared_table_is_measured_once_on_the_first_seeds_baseline(tmp_path):
    import pytorch_lightning as pl

    from nestflex.profiling import LatencyTable
    from nestflex.training import ImageClassifier

    module = ImageClassifier("vgg11", width=0.125, max_epochs=1)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu", devices=1)
    trainer.strategy.connect(module)
    ckpt = tmp_path / "seed3" / "macs" / "baseline" / "model.ckpt"
    ckpt.parent.mkdir(parents=True)
    trainer.save_checkpoint(ckpt)
    bench = _bench()
    path = bench.shared_table(tmp_path, 3, ["--prune-snap", "up"])
    assert path == tmp_path / "latency_table.json"
    table = LatencyTable.load(path)
    assert table.entries and table.threads == 1
    stamp = path.stat().st_mtime_ns
    assert bench.shared_table(tmp_path, 3, []) == path and path.stat().st_mtime_ns == stamp  # resumed: not again
    given = tmp_path / "device.json"
    assert bench.shared_table(tmp_path, 3, ["--latency-table", str(given)]) == given
    # a table of another model in the same --runs is measured again
    LatencyTable({"conv:other": table.entries[next(iter(table.entries))]}, threads=1).save(path)
    assert set(LatencyTable.load(bench.shared_table(tmp_path, 3, [])).entries) == set(table.entries)


def test_flags_the_sweep_sets_itself_are_refused_by_name(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        _bench().main(["--out", str(tmp_path), "--", "--prune-cost", "latency"])
    assert "the recipe flags after -- set --prune-cost, which the sweep sets itself" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _bench().main(["--out", str(tmp_path), "--", "--stages=baseline"])
    assert "set --stages, which the sweep sets itself" in capsys.readouterr().err
