"""benchmarks/synthesis/time_vs_macs.py at its smallest: one model at a small input, levels, an exit, goals,
in fp32 and int8."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tests.pruning.test_cost import stepped_table
from tests.scripts import load_script


def _noiseless_tables(monkeypatch, bench):
    """The benchmark's latency tables with stepped times instead of measured ones: at 32x32 and 3
    repeats on a busy CPU a measured table can come out flat (no width faster than another: nothing
    to prune); these tests check the benchmark's plumbing, not this CPU's timings."""
    build = bench.build_latency_table
    monkeypatch.setattr(bench, "build_latency_table", lambda *a, **k: stepped_table(build(*a, **k)))


def test_time_vs_macs_quick_writes_levels_exits_reference_and_goals_in_fp32_and_int8(tmp_path, monkeypatch):
    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    _noiseless_tables(monkeypatch, bench)
    out = tmp_path / "out"
    # smaller than --quick: a 32x32 input keeps the ResNet-18 table and exports to seconds
    assert bench.main(["--quick", "--size", "32", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert res["model"] == "resnet18" and res["input"] == [3, 32, 32] and res["table_layers"] > 0
    for kind in ("macs", "latency"):
        rows = res["levels"][kind]
        assert [r["target"] for r in rows] == [0.5, 1.0]
        # shares within a precision: the full model is 1.0 in fp32 and in int8
        assert rows[-1]["time_share"] == {"b1t1": 1.0, "int8_b1t1": 1.0} and rows[-1]["macs_share"] == 1.0
        assert 0 < rows[0]["macs_share"] < 1 and rows[0]["ms"]["b1t1"] > 0 and rows[0]["ms"]["int8_b1t1"] > 0
        assert set(rows[0]["time_over_macs"]) == {"b1t1", "int8_b1t1"}
    # a latency level's miss from its target splits into the roadmap's reach in the table's cost and
    # the table's prediction of time: their product is the miss (to rounding)
    for row in res["levels"]["latency"]:
        assert row["cost_over_target"] == pytest.approx(row["cost_share"] / row["target"], abs=2e-3)
        for k, v in row["time_over_target"].items():
            assert row["cost_over_target"] * row["time_over_cost"][k] == pytest.approx(v, rel=0.01, abs=1e-3)
    lat = summary["goals"]["latency_levels_on_target"]
    assert lat["time_over_cost"]["resnet18"] == [r["time_over_cost"]["b1t1"] for r in res["levels"]["latency"]]
    assert set(lat["met_by"]) == {"resnet18"}
    # the MACs-driven level lands near its target MACs share (steps of 10%)
    assert abs(res["levels"]["macs"][0]["macs_share"] - 0.5) < 0.15
    (ex,) = res["exits"]
    assert 0 < ex["macs_saving"] < 1 and ex["ms"]["b1t1"] > 0 and ex["ms"]["int8_b1t1"] > 0 and ex["cut_point"]
    assert set(ex["saving_ratio"]) == {"b1t1", "int8_b1t1"}
    assert set(res["full_ms"]) == {"b1t1", "int8_b1t1"} and min(res["full_ms"].values()) > 0
    # int8 over fp32 per config: the int8 full model's time over the fp32 one's
    assert res["int8_over_fp32"] == {"b1t1": round(res["full_ms"]["int8_b1t1"] / res["full_ms"]["b1t1"], 4)}
    ref = summary["reference"]
    # times only as positive figures: which is faster is for the benchmark on a quiet machine to say
    assert ref["floor_ms"]["b1t1"] > 0 and ref["full_ms"]["b1t1"] > 0 and ref["table_seconds"] > 0
    assert ref["floor_ms"]["int8_b1t1"] > 0 and ref["full_ms"]["int8_b1t1"] > 0 and ref["int8_over_fp32"]["b1t1"] > 0
    int8 = summary["int8"]  # the goals' figures at int8, reported beside them
    assert int8["full_over_fp32"] == {"resnet18": res["int8_over_fp32"]["b1t1"],
                                      "reference": ref["int8_over_fp32"]["b1t1"]}
    assert int8["full_ms"]["resnet18"] == res["full_ms"]["int8_b1t1"]
    assert int8["exit_saving_ratio"]["resnet18"] == [ex["saving_ratio"]["int8_b1t1"]]
    assert len(int8["latency_levels_time_over_target"]["resnet18"]) == 2
    assert int8["macs_levels_worst_time_over_macs"]["resnet18"] > 0
    assert set(summary["goals"]) == {"macs_levels_time_share", "latency_levels_on_target", "exit_time_saving",
                                     "latency_table_seconds"}
    assert all({"target", "measured", "met"} <= set(g) for g in summary["goals"].values())
    assert summary["complete"] is True  # written after every model, complete after the last
    assert json.loads((out / "run.json").read_text())["status"] == "new"


def test_time_vs_macs_keys_fp32_as_before_and_int8_beside_and_judges_goals_in_fp32(tmp_path):
    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    torch.manual_seed(0)
    assert set(bench.time_models({"full": net}, (3, 8, 8), [(1, 1)], 2)["full"]) == {"b1t1"}  # fp32 only: today's keys
    both = bench.time_models({"full": net}, (3, 8, 8), [(1, 1)], 2, ("fp32", "int8"))["full"]
    assert set(both) == {"b1t1", "int8_b1t1"} and min(both.values()) > 0
    assert bench.config_key(8, 2) == "b8t2" and bench.config_key(8, 2, "int8") == "int8_b8t2"
    with pytest.raises(SystemExit):  # the goals are judged in fp32
        bench.main(["--quick", "--precisions", "int8", "--out", str(tmp_path / "x")])


def test_time_vs_macs_picks_latency_levels_by_measured_time(tmp_path, monkeypatch):
    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    _noiseless_tables(monkeypatch, bench)
    out = tmp_path / "out"
    assert bench.main(["--quick", "--size", "32", "--precisions", "fp32", "--pick", "measured", "--snap", "up",
                       "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (res,) = summary["results"]
    assert summary["settings"]["pick"] == "measured" and summary["settings"]["snap"] == "up"
    level, full = res["levels"]["latency"]
    # the search's own timing is recorded beside the rows' second timing; the full model is the start
    assert 0 < level["pick_time_share"] < 1.5 and level["pick_timed"] >= 1
    assert full["pick_time_share"] == 1.0 and full["cost_share"] == 1.0
    assert all("pick_time_share" not in r for r in res["levels"]["macs"])  # MACs levels stay spaced in MACs


def _fake_roadmap(monkeypatch, bench, shares):
    """A roadmap of ``len(shares)`` footprints whose table cost falls 10% a step and whose
    measured time share is ``shares`` (the timings counted)."""
    steps = [{"cost": 10.0 - i, "widths": {"i": i}, "macs": 100 - 10 * i} for i in range(len(shares))]
    timed = []

    def time_models(models, *a, **k):
        i = models["c"]["i"]
        timed.append(i)
        return {"full": {"b1t1": 10.0}, "c": {"b1t1": 10.0 * shares[i]}}

    monkeypatch.setattr(bench, "at_widths", lambda model, shape, widths: widths)
    monkeypatch.setattr(bench, "time_models", time_models)
    return steps, timed


def test_pick_measured_searches_along_the_roadmap_in_the_direction_of_the_miss(monkeypatch):
    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    # the table overprices small footprints: the one it puts at 0.5 (step 5) runs at 0.32, the one
    # at 0.2 (step 8) at 0.1; the search walks back up the roadmap to the footprint measured nearest
    shares = [1.0, 0.93, 0.85, 0.74, 0.62, 0.32, 0.27, 0.2, 0.1, 0.06]
    steps, timed = _fake_roadmap(monkeypatch, bench, shares)
    picks = bench.pick_measured(None, (3, 8, 8), steps, (0.25, 0.5, 0.75, 1.0), repeats=1)
    assert [p["cost"] for p in picks] == [4.0, 6.0, 7.0, 10.0]  # steps 6, 4, 3 and the start
    assert [p["pick_time_share"] for p in picks] == [0.27, 0.62, 0.74, 1.0]
    assert [p["pick_full_ms"] for p in picks] == [10.0, 10.0, 10.0, None]
    assert len(timed) == len(set(timed)) and len(timed) < len(shares)  # each timed once, not all of them
    # a share beyond the roadmap's end takes its last footprint; one above its first pruned
    # footprint takes that one, never the unpruned start (noise can time a footprint above 1.0)
    assert bench.pick_measured(None, (3, 8, 8), steps, (0.01, 1.0), repeats=1)[0]["cost"] == 1.0
    assert bench.pick_measured(None, (3, 8, 8), steps, (0.99, 1.0), repeats=1)[0]["cost"] == 9.0


def test_the_latency_roadmap_caps_each_step_at_the_base_steps_share():
    """With fast widths in blocks of 16 a 5% step moves no group and the roadmap doubles the step
    until one does; the cap stays at twice the base step's share of the cost (it grew with the
    doubled step: EfficientNet-B0's first step-cap run jumped to 0.62 of the cost in one step)."""
    from nestflex.graph import trace
    from nestflex.models import create_model
    from nestflex.pruning import LatencyCost, build_latency_table

    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    model = create_model("vgg11", width=0.125).eval()
    cost = LatencyCost(stepped_table(build_latency_table(model, (3, 32, 32), repeats=1)))
    steps = bench.roadmap(model, (3, 32, 32), cost, 0.3, 0.05, latency=True, step_cap=2.0)
    assert len(steps) > 3 and steps[-1]["cost"] <= 0.3 * steps[0]["cost"]
    for before, after in zip(steps, steps[1:]):
        changed = [g for g, w in after["widths"].items() if w != before["widths"][g]]
        assert before["cost"] - after["cost"] <= 0.1 * before["cost"] + 1e-9 or len(changed) == 1
    assert trace(model, (3, 32, 32)).macs() == steps[0]["macs"]


def test_every_roadmap_footprint_applies_to_the_full_model_down_to_small_widths():
    """A depthwise conv cut to one channel traces as a plain conv, its groups (and their ids) then
    differ from the full model's, and the footprint's widths cannot be applied to it (the capped
    MobileNet-V2 roadmap stopped there: a locked group asked to shrink). Groups stop at MIN_CHANNELS."""
    import torchvision

    from nestflex.graph import trace
    from nestflex.pruning import MacsCost

    bench = load_script("benchmarks/synthesis/time_vs_macs.py")
    model = torchvision.models.mobilenet_v2(weights=None, width_mult=0.25, num_classes=10).eval()
    shape = (3, 32, 32)
    steps = bench.roadmap(model, shape, MacsCost(), 0.01, 0.5, latency=False)
    assert min(min(s["widths"].values()) for s in steps) == bench.MIN_CHANNELS
    full = trace(model, shape)
    for s in steps[1:]:
        assert s["widths"].keys() == full.widths().keys()
        assert trace(bench.at_widths(model, shape, s["widths"]), shape).macs() == s["macs"]
