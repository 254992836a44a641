"""docs/results/<benchmark>/<run>/: every run.json valid, one current run per benchmark, and
docs/results/index.md and benchmarks/README.md's table as benchmarks/results_index.py writes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import _common, results_index
from tests.scripts import ROOT


def test_every_run_json_is_valid_and_every_benchmark_has_one_current_run():
    assert results_index.problems() == []


def test_the_index_is_what_the_generator_writes():
    assert results_index.INDEX.read_text() == results_index.index_text(), (
        "docs/results/index.md is stale: run python benchmarks/results_index.py")


def test_the_benchmarks_readme_table_is_what_the_generator_writes():
    text = results_index.README.read_text()
    assert text == results_index.readme_text(text), (
        "benchmarks/README.md's table is stale: run python benchmarks/results_index.py")


def test_every_benchmark_script_is_in_the_index():
    scripts = {p.relative_to(ROOT).as_posix() for p in (ROOT / "benchmarks").glob("*/[!_]*.py")}
    listed = {b.script for b in results_index.BENCHMARKS.values()}
    assert scripts <= listed, f"not in results_index.BENCHMARKS: {sorted(scripts - listed)}"


def _tree(tmp_path: Path, runs: dict[str, dict]) -> Path:
    root = tmp_path / "results"
    for name, record in runs.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(record))
        (d / "summary.json").write_text("{}")
    return root


def _record(name: str, status) -> dict:
    b, r = name.split("/")
    return {"benchmark": b, "run": r, "command": "python benchmarks/split/codec.py", "commit": "abc1234",
            "date": "2026-11-28", "machine": "not recorded", "status": status}


def test_the_check_names_each_problem(tmp_path):
    root = _tree(tmp_path, {
        "codec/a": _record("codec/a", "current"),
        "codec/b": _record("codec/b", "current"),
        "codec/c": _record("codec/c", "new"),
        "codec/d": _record("codec/d", {"superseded_by": "codec/nowhere"}),
        "codec/e": {**_record("codec/e", "current"), "run": "x", "date": "yesterday"},
    })
    (root / "codec" / "f").mkdir()
    found = "\n".join(results_index.problems(root))
    assert "codec: 3 current runs (a, b, e), exactly one wanted" in found
    assert 'codec/c/run.json: status "new": decide' in found
    assert "codec/d/run.json: status points to 'codec/nowhere', which is no run" in found
    assert "codec/e/run.json: names codec/x, not its folder" in found
    assert "codec/e/run.json: date 'yesterday' is not YYYY-MM-DD" in found
    assert "codec/f: a run folder without run.json" in found


def test_a_benchmark_writes_run_json_beside_its_results_and_a_rerun_keeps_its_status(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")
    out = tmp_path / "results" / "codec" / "mine"
    args = type("Args", (), {"out": None, "run_name": "mine"})()
    assert _common.resolve_out(args, ROOT / "benchmarks" / "split" / "codec.py") == out
    record = _common.write_run(out, ROOT / "benchmarks" / "split" / "codec.py", ["--run-name", "mine"])
    assert record["benchmark"] == "codec" and record["run"] == "mine" and record["status"] == "new"
    assert record["command"] == "python benchmarks/split/codec.py --run-name mine"
    assert json.loads((out / "run.json").read_text()) == record
    record["status"] = "current"
    (out / "run.json").write_text(json.dumps(record))
    assert _common.write_run(out, ROOT / "benchmarks" / "split" / "codec.py", [])["status"] == "current"
    # what a benchmark trains is not a result: it goes under runs/, not docs/results/
    assert _common.scratch_dir(out) == ROOT / "runs" / "codec" / "mine"
    assert _common.scratch_dir(tmp_path / "elsewhere") == (tmp_path / "elsewhere").resolve()


@pytest.mark.parametrize("record, line", [
    ({"cpu": "AMD EPYC", "cpus": 2, "torch_threads": 1}, "AMD EPYC, 2 cores, 1 torch thread"),
    ({"cpu_cores": 2, "torch_threads": 2}, "CPU model not recorded, 2 cores, 2 torch threads"),
    (None, "not recorded"),
])
def test_the_machine_line(record, line):
    assert _common.machine_line(record) == line


def test_the_index_lists_a_new_current_run_once_its_old_one_is_superseded(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(results_index.RESULTS / "trr_cost", root / "trr_cost")
    old = json.loads((root / "trr_cost" / "default" / "run.json").read_text())
    shutil.copytree(root / "trr_cost" / "default", root / "trr_cost" / "again")
    (root / "trr_cost" / "again" / "run.json").write_text(json.dumps({**old, "run": "again"}))
    (root / "trr_cost" / "default" / "run.json").write_text(json.dumps({**old, "status": {"superseded_by": "trr_cost/again"}}))
    text = results_index.index_text(root)
    assert "| [again](trr_cost/again/) |" in text and "[default](trr_cost/default/) (superseded by again)" in text


def test_a_pending_benchmark_is_listed_with_its_reason_until_it_has_a_run(tmp_path, monkeypatch):
    import dataclasses

    entry = dataclasses.replace(results_index.BENCHMARKS["codec"], pending="needs two quiet hours")
    monkeypatch.setattr(results_index, "BENCHMARKS", {"codec": entry})
    root = tmp_path / "results"
    root.mkdir()
    assert not any(p.startswith("codec:") for p in results_index.problems(root))
    assert "| needs two quiet hours |" in results_index.index_text(root)
    _tree(tmp_path, {"codec/a": _record("codec/a", "current")})
    assert "codec: has a run but is marked pending in BENCHMARKS: drop its `pending`" in results_index.problems(root)
    monkeypatch.setattr(results_index, "BENCHMARKS", {"codec": dataclasses.replace(entry, pending=None)})
    root2 = tmp_path / "empty" / "results"
    root2.mkdir(parents=True)
    assert "codec: in BENCHMARKS but no run under results/" in results_index.problems(root2)
