"""The joint live benchmark at tiny settings: every system runs the same seeded workload through the
engine, the link emulator and a `nestflex serve` process, and summary.json carries the documented
keys, the goals object and the timeline plot."""

from __future__ import annotations

import json

import torch

from nestflex.capacity import extract_level
from nestflex.capacity.profile import profile_levels
from nestflex.export import export_bundle
from nestflex.profiling import profile_split_quantization
from tests.deploy.test_engine import CALIBRATION
from tests.export.bundles import LEVELS, exits_on, nested_vgg
from tests.scripts import load_script


def test_joint_live_quick_writes_systems_goals_and_the_timeline(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    net = nested_vgg(run)
    rows = profile_levels(net, None, batch_sizes=(1,), repeats=1, input_shape=(3, 32, 32))
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))]
    profile = profile_split_quantization(extract_level(net, LEVELS - 1), batches, bitwidths=(2, 4, 8), size_samples=4)
    export_bundle(run / "bundle.nfx", net, exits=exits_on(net), onnx=False, calibration=CALIBRATION,
                  split_profile=profile, levels=[{**r, "accuracy": a} for r, a in zip(rows, [0.7, 0.8, 0.85])])
    (run / "summary.json").write_text(json.dumps({"data": {"name": "synthetic", "seed": 0, "train_size": 300,
                                                           "test_size": 100, "synthetic": True}}))
    bench = load_script("benchmarks/engine/joint_live.py")
    out = tmp_path / "out"
    assert bench.main(["--runs", str(run), "--quick", "--seconds", "2", "--frames", "40", "--failure-seconds", "3",
                       "--device-cpu", "0.5", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["systems"]) == {"joint", "levels", "exits", "split", "status_quo"}
    for s in summary["systems"].values():
        m = s["median"]
        assert m["fps"] > 0 and 0 <= m["accuracy_all_frames"] <= 1 and 0 <= m["slo_violation_rate"] <= 1
        assert len(s["runs"]) == 1 and s["runs"][0]["frames"] > 0
    assert {"joint_vs_best_single_knob", "every_frame_answered_under_failures"} <= set(summary["goals"])
    assert all({"target", "measured", "met"} <= set(g) for g in summary["goals"].values())
    failures = summary["failures"]
    assert failures["failed"] == 0 and failures["frames"] == failures["answered"] + failures["dropped"]
    assert summary["data_labels"] == ["synthetic"] and summary["timeline"]
    assert (out / "timeline.png").exists() and (out / "run.json").exists()


def test_the_timeline_rates_restart_with_a_rejoined_app_and_break_across_its_absence():
    rates = load_script("benchmarks/engine/joint_live.py")._rates
    rows = [(0.0, {"answered": 0}), (1.0, {"answered": 10}), (2.0, {"answered": 25}),  # 10/s, 15/s
            (3.0, {"answered": 4}),  # left and joined again: 4 since it joined, not -21
            (9.0, {"answered": 5})]  # away for 6 s: no rate across the gap
    got = rates(rows, gap=1.5)
    assert got[:4] == [0.0, 10.0, 15.0, 4.0] and got[4] != got[4]
