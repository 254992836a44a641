"""The joint scheduler (issue 41): levels x exits x splits x bitwidths across apps sharing a device,
a link and a server; the heuristic against the exact solver."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from nestflex.deploy.scheduler import AppProfile, SchedulerError
from nestflex.deploy.scheduler.joint import (ExactJointScheduler, JointApp, JointOption, JointResources, JointScheduler,
                                             joint_options, pareto_front)
from nestflex.deploy.scheduler.split import SplitCosts, SplitScheduler


def _random_app(rng: np.random.Generator, name: str, n_local: int = 4, n_split: int = 6) -> JointApp:
    """A nested model's levels (accuracy, time and memory rising together) and split options of its
    largest level that move device time to the link and the server."""
    acc = np.sort(rng.uniform(0.6, 0.95, n_local))
    ms = np.sort(rng.uniform(2.0, 30.0, n_local))
    mem = np.sort(rng.uniform(1.0, 10.0, n_local))
    options = [JointOption(level=k, accuracy=float(acc[k]), device_ms=float(ms[k]), memory_mb=float(mem[k]))
               for k in range(n_local)]
    for j in range(n_split):
        sent = float(rng.uniform(0.2, 1.0))
        options.append(JointOption(level=n_local - 1, accuracy=float(acc[-1] - rng.uniform(0.0, 0.05)),
                                   device_ms=float(ms[-1] * rng.uniform(0.05, 0.7)), memory_mb=float(mem[-1]),
                                   split=f"s{j % 3}", bits=int(rng.choice([2, 4, 8])), sent=sent,
                                   bytes=float(sent * rng.uniform(500, 20000)),
                                   server_ms=float(sent * rng.uniform(1.0, 10.0))))
    return JointApp(name, tuple(options), fps=float(rng.uniform(10, 60)))


def _random_problem(seed: int, n_apps: int):
    rng = np.random.default_rng(seed)
    apps = [_random_app(rng, f"a{i}") for i in range(n_apps)]
    lo = math.fsum(min(o.memory_mb for o in a.options) for a in apps)
    hi = math.fsum(max(o.memory_mb for o in a.options) for a in apps)
    res = JointResources(memory_mb=lo + rng.uniform(0.2, 1.0) * (hi - lo), link_mbps=float(rng.uniform(0.5, 50)),
                         server_capacity=float(rng.uniform(0.1, 2.0)), device_slowdown=float(rng.uniform(1.0, 2.5)))
    return apps, res, float(rng.uniform(0.1, 1.0))


@pytest.mark.parametrize("objective", ["total", "max"])
def test_the_heuristic_is_within_two_percent_of_the_exact_solver_in_median(objective):
    gaps, worse = [], 0
    for seed in range(60):
        apps, res, alpha = _random_problem(seed, n_apps=3 + seed % 2)
        h = JointScheduler(objective).schedule(apps, res, alpha=alpha)
        e = ExactJointScheduler(objective).schedule(apps, res, alpha=alpha)
        assert e.value <= h.value + 1e-9  # the exact one is a lower bound, or the test is wrong
        assert h.memory_mb <= res.memory_mb + 1e-9 and e.memory_mb <= res.memory_mb + 1e-9
        # relative to the exact cost, with a floor of 0.01 (one accuracy point) so that a zero-cost
        # optimum does not turn a tiny absolute difference into an infinite gap
        gaps.append((h.value - e.value) / max(e.value, 0.01))
        worse += h.value > e.value + 1e-9
    assert statistics.median(gaps) <= 0.02, gaps
    assert worse <= len(gaps) // 4, (worse, sorted(gaps)[-5:])  # most instances: exactly optimal


def test_an_app_offloads_when_the_device_is_full_and_stays_local_without_a_link_or_server():
    local = JointOption(level=1, accuracy=0.90, device_ms=20.0, memory_mb=4.0)
    split = JointOption(level=1, accuracy=0.89, device_ms=4.0, memory_mb=4.0, split="s1", bits=4, sent=1.0,
                        bytes=2000.0, server_ms=5.0)
    small = JointOption(level=0, accuracy=0.70, device_ms=8.0, memory_mb=2.0)
    apps = [JointApp(n, (local, small, split), fps=30.0) for n in ("a", "b", "c")]
    sched = JointScheduler()
    with_server = sched.schedule(apps, JointResources(memory_mb=12.0, link_mbps=50.0, server_capacity=1.0), alpha=1.0)
    assert sum(a.option.split is not None for a in with_server.allocations) >= 2  # 3 x 0.6 of the device
    assert with_server.loads["device"] <= 1.0 + 1e-9
    none = sched.schedule(apps, JointResources(memory_mb=12.0), alpha=1.0)  # no link, no server
    assert all(a.option.split is None for a in none.allocations)
    # a link too slow for the frames: offloading would slow the apps more than running locally
    slow_link = JointScheduler().schedule(apps, JointResources(memory_mb=12.0, link_mbps=0.05, server_capacity=1.0),
                                          alpha=1.0)
    assert all(a.option.split is None for a in slow_link.allocations)


def test_the_memory_budget_holds_and_below_the_smallest_configuration_is_refused_with_the_figure():
    apps, res, alpha = _random_problem(3, n_apps=4)
    tight = JointResources(memory_mb=math.fsum(min(o.memory_mb for o in a.options) for a in apps),
                           link_mbps=res.link_mbps, server_capacity=res.server_capacity)
    d = JointScheduler().schedule(apps, tight, alpha=alpha)
    assert d.memory_mb <= tight.memory_mb + 1e-9
    with pytest.raises(SchedulerError, match=r"`memory_mb`=.* below the smallest configuration"):
        JointScheduler().schedule(apps, JointResources(memory_mb=tight.memory_mb * 0.5), alpha=alpha)


def test_an_accuracy_floor_no_option_meets_is_relaxed_and_reported():
    a = JointOption(level=0, accuracy=0.8, device_ms=5.0, memory_mb=1.0)
    b = JointOption(level=1, accuracy=0.9, device_ms=9.0, memory_mb=2.0)
    apps = [JointApp("strict", (a, b), min_accuracy_floor=0.95), JointApp("loose", (a, b), min_accuracy_floor=0.85)]
    d = JointScheduler().schedule(apps, JointResources(memory_mb=10.0), alpha=0.5)
    assert d.relaxed == ("strict",)
    assert d.allocation("strict").option == b and d.allocation("loose").option == b


def test_the_pareto_front_drops_dominated_options_and_keeps_trade_offs():
    fast = JointOption(level=0, accuracy=0.8, device_ms=5.0, memory_mb=1.0)
    good = JointOption(level=1, accuracy=0.9, device_ms=9.0, memory_mb=2.0)
    worse = JointOption(level=1, accuracy=0.85, device_ms=9.0, memory_mb=2.0)
    offload = JointOption(level=1, accuracy=0.88, device_ms=1.0, memory_mb=2.0, split="s", bits=4, sent=1.0,
                          bytes=100.0, server_ms=3.0)
    assert pareto_front([fast, good, worse, offload, good]) == [0, 1, 3]


def test_bad_arguments_are_refused_naming_them():
    ok = JointOption(level=0, accuracy=0.8, device_ms=5.0, memory_mb=1.0)
    with pytest.raises(SchedulerError, match="`device_ms`"):
        JointOption(level=0, accuracy=0.8, device_ms=-1.0, memory_mb=1.0)
    with pytest.raises(SchedulerError, match="sends nothing"):
        JointOption(level=0, accuracy=0.8, device_ms=1.0, memory_mb=1.0, bytes=10.0)
    with pytest.raises(SchedulerError, match="no local continuation"):
        JointOption(level=0, accuracy=0.8, device_ms=1.0, memory_mb=1.0, continue_locally=False)
    with pytest.raises(SchedulerError, match="`fps`"):
        JointApp("a", (ok,), fps=0)
    with pytest.raises(SchedulerError, match="duplicates"):
        JointScheduler().schedule([JointApp("a", (ok,)), JointApp("a", (ok,))], JointResources(memory_mb=5.0))
    with pytest.raises(SchedulerError, match="`alpha`"):
        JointScheduler().schedule([JointApp("a", (ok,))], JointResources(memory_mb=5.0), alpha=2.0)
    with pytest.raises(SchedulerError, match="`link_mbps`"):
        JointResources(memory_mb=5.0, link_mbps=float("nan"))
    only_split = JointOption(level=0, accuracy=0.8, device_ms=1.0, memory_mb=1.0, split="s", sent=1.0, bytes=10.0)
    with pytest.raises(SchedulerError, match="local option"):
        JointScheduler().schedule([JointApp("a", (only_split,))], JointResources(memory_mb=5.0))


def test_a_replan_under_the_same_conditions_keeps_the_decision():
    apps, res, alpha = _random_problem(11, n_apps=6)
    sched = JointScheduler()
    first = sched.schedule(apps, res, alpha=alpha)
    again = sched.schedule(apps, res, alpha=alpha)
    assert [a.option for a in again.allocations] == [a.option for a in first.allocations]
    assert again.value <= first.value + 1e-12


@pytest.mark.parametrize("objective", ["total", "max"])
def test_single_moves_with_running_totals_equal_the_full_evaluation(objective):
    """The search's inner loop keeps sums over the apps and updates them per move (joint._moved):
    its keys must be the ones the full cost model (_keys over every candidate row) gives."""
    from nestflex.deploy.scheduler import joint as J

    apps, res, alpha = _random_problem(5, n_apps=5)
    p = J._Problem(apps, res, alpha, objective)
    rng = np.random.default_rng(0)
    choice = [int(rng.integers(len(f))) for f in p.fronts]
    totals = J._totals(p, choice)
    for step in range(20):
        v = step % len(choice)
        rows = np.tile(np.asarray(choice), (len(p.fronts[v]), 1))
        rows[:, v] = np.arange(len(p.fronts[v]))
        np.testing.assert_allclose(J._single_moves(p, choice, v, totals), J._keys(p, rows), rtol=0, atol=1e-9)
        new = int(rng.integers(len(p.fronts[v])))
        totals = J._moved(p, totals, v, choice[v], new)
        choice[v] = new
        fresh = J._totals(p, choice)
        for a, b in zip(totals, fresh):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


def test_a_warm_start_is_never_worse_than_a_cold_decision():
    """The live engine re-plans with the last decision as one more start (looked up by option);
    starts that reach an assignment an earlier start passed through stop there."""
    for seed in range(20):
        apps, res, alpha = _random_problem(100 + seed, n_apps=6)
        warm = JointScheduler()
        warm.schedule(apps, _random_problem(200 + seed, n_apps=6)[1], alpha=alpha)  # other conditions first
        w = warm.schedule(apps, res, alpha=alpha)
        c = JointScheduler().schedule(apps, res, alpha=alpha)
        assert w.value <= c.value + 1e-9, (seed, w.value, c.value)


def test_options_from_a_bundle_profile_and_a_split_scheduler():
    rows = [{"level": 0, "accuracy": 0.80, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
            {"level": 1, "accuracy": 0.85, "memory_mb": 2.0, "latency_ms": {"1": 10.0}}]
    app = AppProfile.from_levels("cam", rows, max_latency_ms=33.3)
    costs = SplitCosts(cuts=("a", "b"), segment_ms=(4.0, 4.0, 2.0), head_ms={}, exit_at={},
                       split_at={"input": None, "s1": "a"}, num_exits=1)
    sched = SplitScheduler(costs, {("input", None): 4000, ("s1", None): 40000, ("s1", 4): 5000}, [None],
                           base_accuracy=0.85, bits=(None, 4), accuracy_drop={("s1", 4): 0.01}, server_speedup=2.0)
    opts = joint_options(app.levels, split_rows=sched.static_rows())
    by = {o.label: o for o in opts}
    assert set(by) == {"L0", "L1", "L1@input:f32", "L1@s1:f32", "L1@s1:4"}  # the device-only row is L1 again
    s = by["L1@s1:4"]
    assert (s.device_ms, s.bytes, s.server_ms, s.sent) == (4.0, 5000.0, 3.0, 1.0)  # (4 + 2) / 2 on the server
    assert s.accuracy == pytest.approx(0.84) and s.memory_mb == 2.0
    assert by["L1@input:f32"].device_ms == 0.0 and by["L1"].device_ms == 10.0
