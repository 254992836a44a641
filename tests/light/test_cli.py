"""The `nestflex` verbs inspect, bench, run and tune through `python -m nestflex` on the base install,
each against what the bundle is (make_bundles.py's description) and, for tune's plan, the torch
reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import nestflex.deploy as nd
from tests.light.conftest import Case, assert_parity

ROOT = Path(__file__).resolve().parents[2]


def nestflex(*args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "nestflex", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    assert done.returncode == 0, f"nestflex {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def test_inspect_lists_what_the_bundle_holds(case):
    text = nestflex("inspect", str(case.path))
    assert f"levels ({case.meta['levels']}, nested=True)" in text
    for key, ex in case.meta["exit_sets"].items():
        assert key in text and all(n in text for n in ex["names"])
    assert f"split points ({len(case.meta['splits'])})" in text
    assert all(s["name"] in text for s in case.meta["splits"])
    manifest = json.loads(nestflex("inspect", str(case.path), "--json"))
    assert len(manifest["levels"]) == case.meta["levels"]


def test_bench_times_every_level_exit_and_switch(case, tmp_path):
    out = tmp_path / "bench.json"
    text = nestflex("bench", str(case.path), "--repeats", "2", "--json", str(out))
    result = json.loads(out.read_text())
    levels = case.meta["levels"]
    assert [r["level"] for r in result["levels"]] == list(range(levels))
    assert all(r["latency_ms"] > 0 and r["backend"] == "onnxruntime" for r in result["levels"])
    for key, ex in case.meta["exit_sets"].items():
        assert [e["name"] for e in result[key]] == ex["names"]
    assert len(result["switches"]) == levels * (levels - 1)
    assert "switch" in text and "latency ms" in text


def test_run_serves_both_bundles_live(refs, tmp_path):
    out = tmp_path / "run.json"
    paths = [str(Case(n, refs).path) for n in ("shipped", "derived")]
    text = nestflex("run", *paths, "--fps", "20", "--seconds", "1.5", "--interval", "1", "--json", str(out))
    stats = json.loads(out.read_text())
    assert sorted(stats["apps"]) == ["derived", "shipped"]
    assert all(a["answered"] > 0 for a in stats["apps"].values()), stats["apps"]
    assert "shipped" in text and "derived" in text


def test_tune_writes_a_plan_the_runtime_runs(refs, tmp_path):
    """float32 onnxruntime only, so the tuned plan's levels still equal the torch reference; the plan
    goes to --out, never beside the shared bundle (where every other test's plan='auto' would read it)."""
    case = Case("shipped", refs)
    path = tmp_path / "plan.json"
    nestflex("tune", str(case.path), "--backends", "onnxruntime", "--threads", "1", "--batches", "1", "8",
             "--repeats", "2", "--out", str(path), "--quiet")
    from nestflex.deploy.backends.plan import ExecutionPlan

    plan = ExecutionPlan.from_json(json.loads(path.read_text()), str(path))
    assert len(plan.levels) == case.meta["levels"] and sorted(plan.exits) == sorted(case.meta["exit_sets"])
    for batch in (1, 8):
        rt = nd.CapacityRuntime(case.bundle, level=0, plan=plan, batch=batch)
        for k in range(case.meta["levels"]):
            rt.set_level(k)
            assert_parity(rt(case.x), case.ref(f"level_{k}"), f"tuned plan, batch {batch}, level {k}")


@pytest.mark.parametrize("args, message", [
    (["bench", "{bundle}", "--repeats", "0"], "--repeats and --batch-size must be >= 1"),
    (["run", "{bundle}", "--fps", "0"], "--fps must be > 0"),
])
def test_bad_arguments_are_refused(refs, args, message):
    bundle = str(Case("derived", refs).path)
    done = subprocess.run([sys.executable, "-m", "nestflex", *(a.format(bundle=bundle) for a in args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and message in done.stderr
