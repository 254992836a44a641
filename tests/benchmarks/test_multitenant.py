"""The multi-tenant simulation (benchmarks/engine/_simulation.py) and its command line (benchmarks/engine/multitenant.py).

Both are scripts beside the benchmarks, not package modules: the light runtime holds no paper
replay, so they are loaded from their files (tests/scripts.py).
"""

import doctest
import importlib.util
import json

import pytest

from nestflex.deploy.scheduler import AppProfile, SchedulerError
from tests.scripts import load_script

simulation = load_script("benchmarks/engine/_simulation.py")
SimulationConfig, SimulationError = simulation.SimulationConfig, simulation.SimulationError
build_pool, make_trace, simulate = simulation.build_pool, simulation.make_trace, simulation.simulate


@pytest.fixture(scope="module")
def multitenant():
    return load_script("benchmarks/engine/multitenant.py")


def profile_rows(acc, lat, mem, macs):
    return [
        {"level": k, "accuracy": a, "latency_ms": {"1": l}, "memory_mb": m, "macs": c, "params": 1}
        for k, (a, l, m, c) in enumerate(zip(acc, lat, mem, macs))
    ]


# a knee below the best level: NestDNN can trade compute for accuracy when few apps run
ROWS_A = profile_rows([0.60, 0.80, 0.84, 0.86], [1.0, 2.0, 4.0, 8.0], [1, 2, 4, 8], [1, 2, 4, 8])
ROWS_B = profile_rows([0.50, 0.70, 0.75], [2.0, 3.0, 6.0], [1, 3, 6], [1, 3, 6])
PROFILES = [AppProfile.from_levels("A", ROWS_A), AppProfile.from_levels("B", ROWS_B)]
SMALL = SimulationConfig(runs=3, seconds=20, alphas=(0.0, 0.01, 1.0))


def test_trace_respects_bounds_and_is_seeded():
    cfg = SimulationConfig(seconds=60)
    for run in range(5):
        tr = make_trace(cfg, run)
        assert len(tr) == 60 and all(2 <= len(s) <= 6 and len(set(s)) == len(s) for s in tr)
        assert all(len(set(a) ^ set(b)) <= 1 for a, b in zip(tr, tr[1:]))  # one event per second at most
        assert tr == make_trace(cfg, run)
    assert make_trace(cfg, 0) != make_trace(cfg, 1)


def test_pool_sets_goals_from_the_knee():
    pool = build_pool(PROFILES, SimulationConfig(goal_factor=2.0))
    assert [a.name for a in pool] == ["A#0", "B#1", "A#2", "B#3", "A#4", "B#5"]
    assert pool[0].goal_latency_ms == 2.0 * 2.0  # knee of A is level 1 (2 ms)
    assert pool[0].goal_accuracy == 0.86


def test_simulation_is_deterministic_and_scheduler_beats_baseline_somewhere():
    a = simulate(PROFILES, SMALL)
    b = simulate(PROFILES, SMALL)
    assert a.pop("decision_ms")["calls"] == b.pop("decision_ms")["calls"]  # wall times differ, decisions not
    assert a == b
    assert a["baseline"]["seconds_over_memory_budget"] >= 0
    for objective in ("total", "max"):
        points = a["sweep"][objective]
        assert [p["alpha"] for p in points] == [0.0, 0.01, 1.0]
        assert all(p["seconds_over_memory_budget"] == 0 and p["peak_memory_mb"] <= a["memory_budget_mb"] + 1e-9
                   for p in points)
        # alpha = 0 only cares about accuracy: at least the knee's, whatever the frame rate
        assert points[0]["accuracy_gain_pct"] > 0
        # a large alpha buys frame rate with accuracy
        assert points[-1]["frame_rate_speedup"] > points[0]["frame_rate_speedup"]
        assert points[-1]["energy_reduction"] > points[0]["energy_reduction"]
    shares = a["trace"]["concurrency_share"]
    assert set(shares) == {"2", "3", "4", "5", "6"} and sum(shares.values()) == pytest.approx(1.0)


def test_baseline_against_itself_is_neutral():
    # one level per app: nothing to choose, so NestDNN must equal the baseline up to the unit rounding
    flat = [AppProfile.from_levels("F", profile_rows([0.8], [1.0], [1], [1]))]
    out = simulate(flat, SimulationConfig(runs=2, seconds=10, alphas=(0.5,), unit=0.01, min_apps=2, max_apps=2))
    p = out["sweep"]["total"][0]
    assert p["accuracy_gain_pct"] == 0.0
    assert p["frame_rate_speedup"] == pytest.approx(1.0, abs=1e-9)
    assert p["energy_reduction"] == pytest.approx(1.0, abs=1e-9)


def test_macs_latency_model_and_cached_scheduler():
    out = simulate(PROFILES, SimulationConfig(runs=2, seconds=15, alphas=(0.1,), scheduler="cached",
                                              latency_model="macs"))
    assert out["sweep"]["max"][0]["frame_rate_speedup"] > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"runs": 0}, r"`runs` must be an integer >= 1, got 0"),
        ({"min_apps": 4, "max_apps": 3}, r"`min_apps` must be <= `max_apps`=3, got 4"),
        ({"max_apps": 7}, r"`max_apps` must be <= `pool_size`=6, got 7. HINT"),
        ({"p_start": 0.8, "p_kill": 0.5}, r"`p_start` plus `p_kill`=0.5 must be <= 1, got 0.8"),
        ({"alphas": (2.0,)}, r"`alphas` must be a non-empty list of values in \[0, 1\]"),
        ({"objectives": ("sum",)}, r"`objectives` must be a non-empty subset"),
        ({"scheduler": "fifo"}, r"`scheduler` must be one of"),
        ({"scheduler": "greedy_jump"}, r"`scheduler` has no MinMaxCost variant, got 'greedy_jump'. HINT"),
        ({"latency_model": "flops"}, r"`latency_model` must be 'measured' or 'macs'"),
        ({"goal_factor": 0}, r"`goal_factor` must be > 0"),
    ],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(SimulationError, match=match):
        SimulationConfig(**kwargs)


def test_budget_too_small_and_no_profiles_raise():
    with pytest.raises(SimulationError, match=r"`memory_mb`=2.0000 cannot hold 6 apps at their smallest levels"):
        simulate(PROFILES, SimulationConfig(memory_mb=2.0))
    with pytest.raises(SimulationError, match=r"no profiles to simulate"):
        simulate([], SMALL)
    assert issubclass(SimulationError, SchedulerError)


def test_the_runtime_holds_no_simulation():
    # the paper replay left the light runtime: benchmarks/engine/multitenant.py is its command line
    assert importlib.util.find_spec("nestflex.deploy.simulation") is None


def test_docstring_examples_run():
    # benchmarks/ is outside pytest's --doctest-modules paths, so its examples are run here; on a
    # fresh load: another test may have loaded the script again under the same module name, and
    # doctest skips objects whose module is not the one registered in sys.modules
    fresh = load_script("benchmarks/engine/_simulation.py")
    result = doctest.testmod(fresh, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_main_writes_summary_and_plots(multitenant, tmp_path, capsys):
    run = tmp_path / "run" / "grow"
    run.mkdir(parents=True)
    (run / "profile.json").write_text(json.dumps({"levels": ROWS_A}))
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"data": {"name": "synthetic", "synthetic": True}}))
    (tmp_path / "b.json").write_text(json.dumps({"levels": ROWS_B}))
    out = tmp_path / "out"
    rc = multitenant.main(["--profiles", str(run / "profile.json"), str(tmp_path / "b.json"), "--runs", "2",
                           "--seconds", "10", "--alpha", "0", "0.1", "--out", str(out)])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmark"] == "multitenant" and summary["plots"] == {"measured": "measured.png", "macs": "macs.png"}
    assert summary["synthetic"] is True and summary["sources"][1]["synthetic"] is None
    assert [s["name"] for s in summary["sources"]] == ["run", tmp_path.name]
    measured = summary["results"]["measured"]
    assert [a["name"] for a in measured["apps"]][:2] == ["run#0", f"{tmp_path.name}#1"]
    assert [p["alpha"] for p in measured["sweep"]["total"]] == [0.0, 0.1] and measured["config"]["runs"] == 2
    assert summary["results"]["macs"]["config"]["latency_model"] == "macs"
    assert (out / "measured.png").stat().st_size > 1000 and (out / "macs.png").stat().st_size > 1000
    assert "knee alpha=" in capsys.readouterr().out


def test_main_options_reach_the_simulation(multitenant, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"levels": ROWS_A}))
    rc = multitenant.main(["--profiles", str(f), str(f), "--names", "cam", "mic", "--runs", "1", "--seconds", "5",
                           "--latency-model", "macs", "--scheduler", "cached", "--objectives", "max",
                           "--goal-factor", "2", "--out", str(tmp_path / "o")])
    assert rc == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert list(summary["results"]) == ["macs"] and [s["name"] for s in summary["sources"]] == ["cam", "mic"]
    config = summary["results"]["macs"]["config"]
    assert (config["scheduler"], config["objectives"], config["goal_factor"]) == ("cached", ["max"], 2.0)


def test_main_reports_bad_input(multitenant, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing named and no runs/*/grow/profile.json to discover
    assert multitenant.main(["--out", str(tmp_path)]) == 2
    assert "no profiles to simulate" in capsys.readouterr().err
    assert multitenant.main(["--profiles", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"levels": ROWS_A}))
    assert multitenant.main(["--profiles", str(f), "--names", "a", "b", "--out", str(tmp_path)]) == 2
    assert "`--names` has 2 names for 1 bundles/profiles" in capsys.readouterr().err
    assert multitenant.main(["--profiles", str(f), "--runs", "0", "--out", str(tmp_path)]) == 2
    assert "`runs` must be an integer >= 1, got 0" in capsys.readouterr().err


def test_bundle_paths_go_through_the_loader(multitenant, tmp_path, capsys):
    rc = multitenant.main(["--bundles", str(tmp_path / "model.nfx"), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert capsys.readouterr().err.startswith("error:")  # the loader rejects a missing bundle with a nestflex error
