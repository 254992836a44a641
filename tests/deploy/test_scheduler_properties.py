"""Hypothesis properties of the schedulers on random small instances."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from nestflex.deploy.scheduler import AppProfile, CachedGreedyScheduler, ExactScheduler, GreedyScheduler


@st.composite
def problems(draw):
    n = draw(st.integers(1, 4))
    apps = []
    for i in range(n):
        M = draw(st.integers(1, 4))
        acc = sorted(draw(st.lists(st.floats(0.3, 0.99), min_size=M, max_size=M)))
        lat = sorted(draw(st.lists(st.floats(0.5, 30.0), min_size=M, max_size=M)))
        mem = sorted(draw(st.lists(st.floats(0.5, 40.0), min_size=M, max_size=M)))
        rows = [{"level": k, "accuracy": acc[k], "latency_ms": {"1": lat[k]}, "memory_mb": mem[k]} for k in range(M)]
        apps.append(AppProfile.from_levels(f"a{i}", rows, max_latency_ms=draw(st.floats(2.0, 60.0))))
    lo = math.fsum(a.levels[0].memory_mb for a in apps)
    hi = math.fsum(a.levels[-1].memory_mb for a in apps)
    budget = lo + draw(st.floats(0.0, 1.0)) * (hi - lo)
    alpha = draw(st.floats(0.0, 1.0))
    unit = draw(st.sampled_from([0.05, 0.1, 0.02]))
    objective = draw(st.sampled_from(["total", "max"]))
    return apps, budget, alpha, unit, objective


SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(problems())
def test_greedy_never_exceeds_the_budgets(p):
    apps, budget, alpha, unit, objective = p
    for s in (GreedyScheduler(objective), CachedGreedyScheduler(objective)):
        d = s.schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
        assert d.memory_mb <= budget + 1e-9
        assert math.fsum(a.share for a in d.allocations) <= 1 + 1e-9
        assert all(a.share >= unit - 1e-12 for a in d.allocations)


@SETTINGS
@given(problems())
def test_exact_is_never_worse_than_greedy(p):
    apps, budget, alpha, unit, objective = p
    exact = ExactScheduler(objective).schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
    greedy = GreedyScheduler(objective).schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
    assert exact.memory_mb <= budget + 1e-9
    assert exact.value <= greedy.value + 1e-12
    if objective == "total":
        jump = GreedyScheduler("total", jump=True).schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
        assert exact.value <= jump.value + 1e-12 and jump.memory_mb <= budget + 1e-9


@SETTINGS
@given(problems())
def test_cached_returns_the_full_greedy_decision(p):
    apps, budget, alpha, unit, objective = p
    full = GreedyScheduler(objective).schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
    cached = CachedGreedyScheduler(objective)
    first = cached.schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
    second = cached.schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
    assert cached.last_used_cache
    assert first.allocations == full.allocations == second.allocations
    assert first.value == second.value == full.value


@SETTINGS
@given(problems())
def test_decisions_are_deterministic(p):
    apps, budget, alpha, unit, objective = p
    for make in (lambda: GreedyScheduler(objective), lambda: ExactScheduler(objective)):
        a = make().schedule(apps, memory_mb=budget, alpha=alpha, unit=unit)
        b = make().schedule(list(apps), memory_mb=budget, alpha=alpha, unit=unit)
        assert a == b
