"""The synthesis benchmark at toy settings: a plan per level, speed-ups and goals written."""

from __future__ import annotations

import json

from tests.export.bundles import write_bundle
from tests.scripts import load_script


def test_synthesis_writes_a_plan_per_level_and_goals(tmp_path):
    write_bundle(tmp_path)
    bench = load_script("benchmarks/synthesis.py")
    out = tmp_path / "out"
    assert bench.main(["--bundles", str(tmp_path / "model.nfx"), "--repeats", "2", "--threads", "1",
                       "--switches", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert [r["level"] for r in res["levels"]] == [0, 1, 2]
    for r in res["levels"]:
        assert r["plan_ms"] > 0 and r["speedup_vs_eager"] > 0 and 0 < r["macs_fraction"] <= 1
    assert res["switch"]["max_ms"] > 0
    assert all({"target", "measured", "met", "note"} <= set(g) for g in summary["goals"].values())
    assert (out / "latency_vs_macs.png").exists()
