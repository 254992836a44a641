"""The fuzz benchmark at toy sizes: every mutation and corruption kind runs, only the project's own
errors come out, and summary.json carries the documented keys and the goals object."""

from __future__ import annotations

import json

from tests.scripts import load_script


def test_fuzz_writes_outcomes_worst_cases_and_goals(tmp_path):
    bench = load_script("benchmarks/deploy/fuzz.py")
    out = tmp_path / "out"
    from nestflex.testing import corruption

    kinds = len(corruption.KINDS)
    assert bench.main(["--out", str(out), "--frames", "360", "--bundles", str(2 * kinds), "--bomb-mb", "16",
                       "--max-elements", "65536", "--work", str(tmp_path)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["frames"]["inputs"] == 360 and s["bundles"]["inputs"] == 2 * kinds
    assert len(s["frames"]["by_mutation"]) == 12 and all(r["inputs"] == 30 for r in s["frames"]["by_mutation"].values())
    assert {k: r["inputs"] for k, r in s["bundles"]["by_kind"].items()} == dict.fromkeys(s["config"]["kinds"], 2)
    assert set(s["frames"]["outcomes"]) <= {"ok", "CodecError"} and s["frames"]["outcomes"]["CodecError"] > 0
    assert set(s["bundles"]["outcomes"]) <= {"refused", "identical", "runs"} and s["bundles"]["outcomes"]["refused"] > 0
    assert s["frames"]["bugs"] == {} and s["bundles"]["bugs"] == {}
    assert s["frames"]["worst_ms"] >= s["frames"]["median_ms"] > 0 and s["bundles"]["worst_beyond_own_mb"] is not None
    assert {"bundle_exception_types", "bundle_time", "bundle_memory", "frame_exception_types", "frame_memory"} == set(
        s["goals"])
    assert all({"target", "measured", "met", "note"} <= set(g) for g in s["goals"].values())
    assert s["goals"]["frame_exception_types"]["measured"] == {} and not s["goals"]["frame_exception_types"]["met"]
    assert s["goals"]["frame_memory"]["met"]  # 16 MB bombs, a 0.5 MB limit: capped at the limit, not expanded
    assert s["memory_method"] and s["machine"]["cpus"] >= 1 and len(s["loadavg"]["start"]) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the cases' work directory is removed
