"""The live multi-tenant benchmark at tiny settings: every system runs the same trace through the
engine, and summary.json carries the documented keys and the goals object."""

from __future__ import annotations

import json

from nestflex.capacity.profile import profile_levels
from nestflex.export import export_bundle
from tests.export.bundles import exits_on, nested_vgg
from tests.scripts import load_script


def test_multitenant_live_writes_systems_goals_and_plots(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    net = nested_vgg(run)
    rows = profile_levels(net, None, batch_sizes=(1,), repeats=1, input_shape=(3, 32, 32))
    export_bundle(run / "bundle.nfx", net, exits=exits_on(net), thresholds=[0.5, 0.6], onnx=False,
                  levels=[{**r, "accuracy": a} for r, a in zip(rows, [0.7, 0.8, 0.85])])
    (run / "summary.json").write_text(json.dumps({"data": {"name": "synthetic", "seed": 0, "train_size": 300,
                                                           "test_size": 100, "synthetic": True}}))
    bench = load_script("benchmarks/engine/multitenant_live.py")
    out = tmp_path / "out"
    assert bench.main(["--runs", str(run), "--runs-count", "1", "--seconds", "2", "--pool-size", "3",
                       "--max-apps", "3", "--frames", "50", "--burn-seconds", "2", "--goal-factor", "20", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["systems"]) == {"engine", "status_quo", "frozen"}
    for s in summary["systems"].values():
        assert s["frames"] > 0 and 0 <= s["accuracy_all_frames"] <= s["answered_fraction"] <= 1
    assert {"vs_status_quo", "engine_overhead", "replan_and_switch", "burn"} <= set(summary["goals"])
    assert all({"target", "measured", "met", "note"} <= set(g) for g in summary["goals"].values())
    assert summary["data_labels"] == ["synthetic"]
    assert (out / "systems.png").exists() and (out / "burn.png").exists()
