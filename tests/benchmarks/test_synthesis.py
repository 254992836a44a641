"""The synthesis benchmark at toy settings: a plan per level, speed-ups and goals written."""

from __future__ import annotations

import json

from tests.export.bundles import write_bundle
from tests.scripts import load_script


def test_synthesis_writes_a_plan_per_level_and_goals(tmp_path):
    write_bundle(tmp_path)
    bench = load_script("benchmarks/synthesis/synthesis.py")
    out = tmp_path / "out"
    assert bench.main(["--bundles", str(tmp_path / "model.nfx"), "--repeats", "2", "--threads", "1",
                       "--switches", "1", "--batches", "1", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert [r["level"] for r in res["levels"]] == [0, 1, 2]
    (b4,) = res["batches"]
    assert b4["batch"] == 4 and [r["level"] for r in b4["levels"]] == [0, 1, 2]
    assert all(r["ms_per_sample"] > 0 and r["speedup_vs_eager"] > 0 for r in b4["levels"])
    for r in res["levels"]:
        assert r["plan_ms"] > 0 and r["speedup_vs_eager"] > 0 and 0 < r["macs_fraction"] <= 1
    assert res["switch"]["max_ms"] > 0
    for side in ("plan", "eager"):  # resident memory measured in a child process, per level
        mem = res["memory"][side]
        assert [r["level"] for r in mem["levels"]] == [0, 1, 2] and mem["base_rss"] > 0
        assert all(r["resident_bytes"] > 0 and r["level_bytes"] > 0 for r in mem["levels"])
    assert [r["backend"] for r in res["memory"]["plan"]["levels"]] == [r["backend"] for r in res["levels"]]
    assert summary["goals"]["resident_memory"]["measured"][str(tmp_path / "model.nfx")]["accounted"] > 0
    # per configuration and batch size: every level's time against the largest level's on that configuration
    rows = {(r["backend"], r["threads"], r["batch"]): r for r in res["time_fractions"]}
    assert {("eager", 1, 1), ("eager", 1, 4)} <= set(rows)
    assert all(r["time_fraction"][-1] == 1 and r["worst_ratio"] >= 1 for r in rows.values())
    assert rows[("eager", 1, 1)]["fast"] is False  # eager is the baseline, not 2x itself
    assert "best_single_configuration" in summary["goals"]["time_follows_macs"]["measured"]
    assert {"backend", "fixed_ms", "ms_per_gmac"} <= set(res["fixed_cost"][0])
    assert all({"target", "measured", "met", "note"} <= set(g) for g in summary["goals"].values())
    assert (out / "latency_vs_macs.png").exists()
    assert summary["goals"]["int8"]["measured"] == {str(tmp_path / "model.nfx"): None}  # no samples: no int8
    assert all(r["best_int8"] is None for r in res["levels"])


def test_synthesis_reports_the_best_float32_and_int8_configurations_with_samples(tmp_path):
    import torch

    samples = (torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.randint(0, 10, (16,)))
    write_bundle(tmp_path, samples=samples)
    bench = load_script("benchmarks/synthesis/synthesis.py")
    out = tmp_path / "out"
    assert bench.main(["--bundles", str(tmp_path / "model.nfx"), "--repeats", "2", "--threads", "1",
                       "--switches", "1", "--budget", "100", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert res["budget_points"] == 100 and res["check_samples"] == 8 and res["test"] is None  # not a recipe run
    for r in res["levels"]:
        assert r["best_float32"]["backend"] in ("eager", "channels_last", "onnxruntime")
        assert r["best_int8"]["backend"] == "onnxruntime_int8" and 0 <= r["best_int8"]["accuracy"] <= 1
    goal = summary["goals"]["int8"]
    assert goal["met"] is False  # no test-split check outside a recipe run
    assert goal["measured"][str(tmp_path / "model.nfx")]["speedup_vs_eager"] > 0
    # early exit on the 8 check samples, with the plan and eager: latency and MACs savings side by side
    (ex,) = res["exits"]
    assert ex["exit_set"] == "exits" and ex["samples"] == 8 and ex["config"]["backend"] in ("eager", "onnxruntime")
    for side in ("plan", "eager"):
        m = ex[side]
        assert m["mean_ms"] > 0 and m["largest_level_ms"] > 0 and m["macs_saving"] < 1  # < 0: heads, no exit
        assert m["backbone_same_backend_ms"] > 0
        assert abs(sum(m["exit_share"]) - 1) < 1e-9 and 0 <= m["accuracy"] <= 1
    saving = summary["goals"]["early_exit_saving"]["measured"][f"{tmp_path / 'model.nfx'}:exits"]
    assert saving["macs_saving"] == round(ex["plan"]["macs_saving"], 4)
    # the exits the plan keeps (its time-aware choice) are the ones it ran; eager runs every exit
    kept = ex["config"]["active"]
    assert saving["active"] == ex["plan"]["active"] == ([0, 1] if kept is None else kept)
    assert ex["eager"]["active"] == [0, 1]
    assert ("plan_every_exit" in ex) == (kept is not None)
    assert ex["config"]["mean_ms"] > 0 and ex["config"]["all_mean_ms"] > 0


def test_level_profile_splits_each_level_s_time_by_operator(tmp_path):
    write_bundle(tmp_path)
    bench = load_script("benchmarks/synthesis/level_profile.py")
    out = tmp_path / "out"
    assert bench.main(["--bundle", str(tmp_path / "model.nfx"), "--backends", "onnxruntime", "--runs", "5",
                       "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["call_overhead_us"] > 0 and summary["threads"] == 1
    levels = summary["backends"]["onnxruntime"]
    assert [lv["level"] for lv in levels] == [0, 1, 2] and levels[-1]["time_fraction"] == 1
    for lv in levels:
        assert lv["wall_us"] > 0 and lv["nodes_us"] > 0 and lv["operators"]
        assert set(lv["groups_us"]) == {"conv_shrinking", "conv_constant", "other"}
        assert abs(sum(lv["groups_us"].values()) - lv["nodes_us"]) < 1e-6
        assert {o["group"] for o in lv["operators"]} <= set(lv["groups_us"])
    # the toy bundle's levels differ in width: some convolution shrinks from the largest to the smallest
    assert levels[0]["groups_us"]["conv_shrinking"] > 0


def test_a_frame_s_macs_leave_out_the_heads_of_dropped_exits():
    from types import SimpleNamespace

    bench = load_script("benchmarks/synthesis/synthesis.py")
    # backbone 1000 MACs; exits at 20% / 50%; heads of 10 and 30 MACs; spec.macs counts every head up to k
    spec = SimpleNamespace(backbone_macs=1000, positions=[0.2, 0.5], macs=[210, 540, 1040])
    assert bench.frame_macs(spec, (0, 1)) == [210, 540, 1040]
    assert bench.frame_macs(spec, (1,))[1:] == [530, 1030]  # head 0 never ran
    assert bench.frame_macs(spec, ())[2] == 1000
