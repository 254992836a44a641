"""The live split-inference benchmark at toy settings: a real server process, the link proxy, every
system through the same harness, and summary.json with the goals object."""

from __future__ import annotations

import json

from tests.deploy.split_bundle import write_split_bundle
from tests.scripts import load_script


def test_split_live_runs_every_system_and_writes_goals(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_split_bundle(run).rename(run / "bundle.nfx")
    (run / "summary.json").write_text(json.dumps({"data": {"name": "synthetic", "seed": 0, "train_size": 300,
                                                           "test_size": 100, "synthetic": True}}))
    bench = load_script("benchmarks/split/split_live.py")
    out = tmp_path / "out"
    assert bench.main(["--run", str(run), "--bandwidths", "5", "50", "--seconds", "1", "--repeats", "1",
                       "--frames", "80", "--bits", "4", "8", "--soak-seconds", "2", "--soak-clients", "4",
                       "--drop-rates", "0.3", "--fail-seconds", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["fixed"]) == {"5.0", "50.0"}
    for row in summary["fixed"].values():
        assert set(row) == set(bench.SYSTEMS)
        assert all(s["frames"] > 0 and 0 <= s["accuracy"] <= 1 for s in row.values())
        assert row["device_only"]["bytes_per_frame"] == 0 and row["server_only"]["bytes_per_frame"] > 0
    assert summary["parity"]["float32_max_abs_diff"] <= 1e-5
    assert set(summary["failures"]) == {"kill", "drop_0.3"}
    assert summary["goals"]["every_frame_answered"]["met"]
    soak = summary["soak"]
    assert soak["server_alive"] and soak["requests"] > 0 and soak["abuse"] > 0
    assert soak["answered"] + soak["refused"] == soak["requests"] and soak["abuse_rejected"] == soak["abuse"]
    assert all({"target", "measured", "met", "note"} <= set(g) for g in summary["goals"].values())
    assert (out / "split_live.png").exists()
