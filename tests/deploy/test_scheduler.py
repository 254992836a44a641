import itertools
import json
import math
import random
from types import SimpleNamespace

import pytest

from nestflex.deploy.scheduler import (
    AppProfile,
    CachedGreedyScheduler,
    ExactScheduler,
    GreedyScheduler,
    KneeScheduler,
    SchedulerError,
    cost,
    get_scheduler,
    knee_level,
    list_schedulers,
    register_scheduler,
)
from nestflex.errors import NestflexError


def rows(acc, lat, mem, macs=None):
    macs = macs or [int(m * 1000) for m in mem]
    return [
        {"level": k, "accuracy": a, "latency_ms": {"1": l, "64": 10 * l}, "memory_mb": m, "macs": c, "params": 1}
        for k, (a, l, m, c) in enumerate(zip(acc, lat, mem, macs))
    ]


def random_apps(rng, n, M, lat_hi=20.0):
    apps = []
    for i in range(n):
        acc = sorted(rng.uniform(0.5, 0.95) for _ in range(M))
        lat = sorted(rng.uniform(1, lat_hi) for _ in range(M))
        mem = sorted(rng.uniform(1, 50) for _ in range(M))
        apps.append(AppProfile.from_levels(f"a{i}", rows(acc, lat, mem), max_latency_ms=rng.uniform(10, 60)))
    lo = sum(a.levels[0].memory_mb for a in apps)
    hi = sum(a.levels[-1].memory_mb for a in apps)
    return apps, lo + rng.uniform(0, 1) * (hi - lo)


def brute_force(apps, memory_mb, alpha, unit, objective):
    """Reference: every level combination x every split of the units (k_v >= 1)."""
    U = round(1 / unit)
    n = len(apps)
    best = math.inf
    for levels in itertools.product(*[range(len(a.levels)) for a in apps]):
        if sum(a.levels[m].memory_mb for a, m in zip(apps, levels)) > memory_mb + 1e-9:
            continue
        for ks in itertools.product(range(1, U + 1), repeat=n):
            if sum(ks) > U:
                continue
            cs = [cost(a, m, k * unit, alpha) for a, m, k in zip(apps, levels, ks)]
            best = min(best, math.fsum(cs) if objective == "total" else max(cs))
    return best


# ---------------------------------------------------------------- profile records
def test_app_from_levels_reads_the_profile_rows():
    app = AppProfile.from_levels("cam", rows([0.8, 0.9], [2.0, 3.0], [1.0, 2.0]), batch_size=64)
    assert [lv.latency_ms for lv in app.levels] == [20.0, 30.0]
    assert app.goal_accuracy == 0.9 and app.goal_latency_ms == pytest.approx(1000 / 30)
    assert app.with_goals(min_accuracy=0.5, max_latency_ms=7.0).goal_latency_ms == 7.0


def test_app_from_json_accepts_profile_and_summary_files(tmp_path):
    grow = tmp_path / "myrun" / "grow"
    grow.mkdir(parents=True)
    switching = [{"from": 0, "to": 1, "nested_ms": 3.5, "page_in": 10}]
    (grow / "profile.json").write_text(json.dumps({"levels": rows([0.8, 0.9], [2, 3], [1, 2]), "switching": switching}))
    app = AppProfile.from_json(grow / "profile.json")
    assert app.name == "myrun" and app.switch_time_ms(0, 1) == 3.5 and app.switch_time_ms(1, 0) is None
    (tmp_path / "summary.json").write_text(json.dumps({"levels": rows([0.7], [1], [1])}))
    assert len(AppProfile.from_json(tmp_path / "summary.json", name="s").levels) == 1


def test_app_from_bundle_uses_levels_and_manifest():
    bundle = SimpleNamespace(levels=rows([0.8, 0.9], [2, 3], [1, 2]), manifest={"model": {"name": "vgg11"}})
    assert AppProfile.from_bundle(bundle).name == "vgg11"
    only_manifest = SimpleNamespace(levels=None, manifest={"levels": rows([0.8], [2], [1]), "model": "m"})
    assert AppProfile.from_bundle(only_manifest, name="x").name == "x"


@pytest.mark.parametrize(
    "bad, match",
    [
        ([], r"`levels` must be a non-empty list"),
        ([{"level": 0, "accuracy": 0.5}], r"level row 0 lacks \['latency_ms', 'memory_mb'\]"),
        (rows([0.8, 0.9], [2, 3], [2, 1]), r"levels are not sorted by cost: level 0 \(memory_mb=2.0"),
        (rows([80.0], [2], [1]), r"`accuracy`=80.0, outside \[0, 1\]. HINT: accuracies are fractions"),
        (rows([0.8], [0.0], [1]), r"`latency_ms`=0.0; it must be > 0"),
        (rows([0.8], [1.0], [0.0]), r"`memory_mb`=0.0; it must be > 0"),
        ([{"level": 0, "accuracy": None, "latency_ms": 1.0, "memory_mb": 1.0}], r"has no accuracy \(None\)"),
    ],
)
def test_bad_levels_raise(bad, match):
    with pytest.raises(SchedulerError, match=match):
        AppProfile.from_levels("cam", bad)


def test_empty_levels_tuple_raises():
    with pytest.raises(SchedulerError, match=r"app 'cam': `levels` is empty"):
        AppProfile("cam", ())


def test_missing_batch_size_names_the_profiled_ones():
    with pytest.raises(SchedulerError, match=r"no latency at `batch_size`='8' \(profiled: \['1', '64'\]\)"):
        AppProfile.from_levels("cam", rows([0.8], [2], [1]), batch_size=8)


def test_bad_json_files_raise(tmp_path):
    with pytest.raises(SchedulerError, match=r"does not exist. HINT: run the recipe's grow stage"):
        AppProfile.from_json(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(SchedulerError, match=r"is not readable JSON"):
        AppProfile.from_json(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{}")
    with pytest.raises(SchedulerError, match=r"has no \"levels\" list"):
        AppProfile.from_json(tmp_path / "y.json")


def test_bundle_without_levels_raises():
    with pytest.raises(SchedulerError, match=r"carries no capacity levels"):
        AppProfile.from_bundle(SimpleNamespace(levels=None, manifest={}))


def test_knee_is_farthest_above_the_diagonal():
    app = AppProfile.from_levels("a", rows([0.70, 0.82, 0.84, 0.85], [1, 2, 3, 4], [1, 2, 4, 8], [1, 2, 4, 8]))
    assert knee_level(app) == 1
    flat = AppProfile.from_levels("b", rows([0.8, 0.8], [1, 2], [1, 2]))
    assert knee_level(flat) == 0
    with pytest.raises(SchedulerError, match=r"`resource` must be one of"):
        knee_level(app, "flops")


# ---------------------------------------------------------------- cost
def test_cost_terms():
    app = AppProfile.from_levels("a", rows([0.8, 0.9], [2.0, 3.0], [1, 2]), max_latency_ms=10.0)
    assert cost(app, 1, 0.5, alpha=1.0) == 0.0  # best accuracy, 6 ms < 10 ms
    assert cost(app, 0, 1.0, alpha=1.0) == pytest.approx(0.1)  # 0.1 short, fast enough
    assert cost(app, 1, 0.1, alpha=0.5) == pytest.approx(0.5 * (30 - 10) / 10)
    assert cost(app, 1, 0.1, alpha=0.0) == 0.0
    with pytest.raises(SchedulerError, match=r"`share` must be in \(0, 1\], got 0"):
        cost(app, 0, 0, 0.5)
    with pytest.raises(SchedulerError, match=r"`level_index`=2 is not a level of app 'a' \(0..1\)"):
        cost(app, 2, 0.5, 0.5)


# ---------------------------------------------------------------- problem validation
@pytest.mark.parametrize("name", ["greedy_total", "greedy_max", "cached_total", "exact_max", "greedy_total_jump"])
def test_bad_problems_raise(name):
    s = get_scheduler(name)
    app = AppProfile.from_levels("a", rows([0.8, 0.9], [2, 3], [1, 2]))
    with pytest.raises(SchedulerError, match=r"`apps` is empty"):
        s.schedule([], memory_mb=10)
    with pytest.raises(SchedulerError, match=r"`memory_mb`=0.5 is smaller than the smallest configuration \(1.0000 MB"):
        s.schedule([app], memory_mb=0.5)
    with pytest.raises(SchedulerError, match=r"`unit` must divide 1 into whole units .* got 0.03"):
        s.schedule([app], memory_mb=10, unit=0.03)
    with pytest.raises(SchedulerError, match=r"`alpha` must be in \[0, 1\], got 1.5"):
        s.schedule([app], memory_mb=10, alpha=1.5)
    with pytest.raises(SchedulerError, match=r"app names must be unique, got duplicates \['a'\]"):
        s.schedule([app, app], memory_mb=10)
    three = [app.renamed(n) for n in "xyz"]
    with pytest.raises(SchedulerError, match=r"`unit`=0.5 gives 2 units, fewer than the 3 apps"):
        s.schedule(three, memory_mb=10, unit=0.5)
    with pytest.raises(SchedulerError, match=r"`apps` must hold AppProfile objects, got dict"):
        s.schedule([{"name": "a"}], memory_mb=10)


def test_constructor_arguments_are_validated():
    with pytest.raises(SchedulerError, match=r"`objective` must be one of \['total', 'max'\], got 'sum'"):
        GreedyScheduler("sum")
    with pytest.raises(SchedulerError, match=r"`cache_fraction` must be in \(0, 1\), got 1.0"):
        CachedGreedyScheduler(cache_fraction=1.0)
    with pytest.raises(SchedulerError, match=r"`refresh_every` must be an integer >= 1, got 0"):
        CachedGreedyScheduler(refresh_every=0)
    with pytest.raises(SchedulerError, match=r"`jump`=True is only for objective 'total'"):
        GreedyScheduler("max", jump=True)


# ---------------------------------------------------------------- registry
def test_registry_lists_builtins_and_raises_with_known_names():
    names = list_schedulers()
    for n in ("greedy_total", "greedy_max", "cached_total", "cached_max", "exact_total", "exact_max", "knee"):
        assert n in names
    with pytest.raises(SchedulerError, match=r"unknown scheduler 'fifo'; known: \[.*'greedy_total'.*\]"):
        get_scheduler("fifo")
    with pytest.raises(SchedulerError, match=r"scheduler 'knee' is already registered"):
        register_scheduler("knee", KneeScheduler)
    s = GreedyScheduler()
    assert get_scheduler(s) is s
    assert get_scheduler("cached_total") is not get_scheduler("cached_total")  # fresh state each time
    assert issubclass(SchedulerError, NestflexError)


@pytest.mark.parametrize("name", [n for n in list_schedulers()])
def test_every_registered_scheduler_returns_a_valid_decision(name):
    apps, budget = random_apps(random.Random(3), 3, 3)
    d = get_scheduler(name).schedule(apps, memory_mb=budget, alpha=0.3, unit=0.05)
    assert [a.app for a in d.allocations] == [a.name for a in apps]
    assert sum(a.share for a in d.allocations) <= 1 + 1e-9
    assert all(a.share > 0 for a in d.allocations)
    if name != "knee":  # the baseline is resource-agnostic by design
        assert d.memory_mb <= budget + 1e-9
    assert d.to_dict()["allocations"][0]["app"] == apps[0].name


# ---------------------------------------------------------------- solvers
@pytest.mark.parametrize("objective", ["total", "max"])
def test_exact_matches_brute_force(objective):
    rng = random.Random(7)
    for _ in range(6):
        apps, budget = random_apps(rng, rng.randint(1, 3), rng.randint(1, 3))
        alpha = rng.choice([0.0, 0.2, 1.0])
        d = ExactScheduler(objective).schedule(apps, memory_mb=budget, alpha=alpha, unit=0.1)
        assert d.value == pytest.approx(brute_force(apps, budget, alpha, 0.1, objective), abs=1e-12)


def test_greedy_prefers_the_app_whose_cost_falls_most():
    # app b loses much more accuracy at level 0 than app a: MinTotalCost gives b the memory
    a = AppProfile.from_levels("a", rows([0.80, 0.81], [1, 1], [1, 2]), max_latency_ms=100)
    b = AppProfile.from_levels("b", rows([0.60, 0.90], [1, 1], [1, 2]), max_latency_ms=100)
    d = GreedyScheduler("total").schedule([a, b], memory_mb=3.0, alpha=0.5)
    assert (d.allocation("a").level, d.allocation("b").level) == (0, 1)
    assert d.value == pytest.approx(0.01)
    with pytest.raises(SchedulerError, match=r"no app 'c' in this decision"):
        d.allocation("c")


def test_minmax_balances_latency_between_equal_apps():
    apps = [AppProfile.from_levels(n, rows([0.9], [10.0], [1]), max_latency_ms=10.0) for n in "ab"]
    d = GreedyScheduler("max").schedule(apps, memory_mb=5, alpha=1.0, unit=0.01)
    assert [a.share for a in d.allocations] == pytest.approx([0.5, 0.5])


def test_cached_follows_app_set_changes_and_refreshes():
    apps, budget = random_apps(random.Random(11), 5, 4)
    s = CachedGreedyScheduler("total", refresh_every=3)
    full = GreedyScheduler("total")
    s.schedule(apps[:4], memory_mb=budget, alpha=0.2)
    assert not s.last_used_cache
    d = s.schedule(apps[1:], memory_mb=budget, alpha=0.2)  # one app left, one arrived
    assert s.last_used_cache and d.memory_mb <= budget + 1e-9
    assert sum(a.share for a in d.allocations) == pytest.approx(1.0)
    s.schedule(apps[1:], memory_mb=budget, alpha=0.2)
    d4 = s.schedule(apps[1:], memory_mb=budget, alpha=0.2)  # 4th call: a full run refreshes the cache
    assert not s.last_used_cache and d4.allocations == full.schedule(apps[1:], memory_mb=budget, alpha=0.2).allocations
    s.schedule(apps[1:], memory_mb=budget, alpha=0.7)  # other settings: the cache does not apply
    assert not s.last_used_cache


def test_knee_scheduler_runs_fixed_levels_with_equal_shares():
    app = AppProfile.from_levels("a", rows([0.70, 0.82, 0.84, 0.85], [1, 2, 3, 4], [1, 2, 4, 8], [1, 2, 4, 8]))
    apps = [app.renamed(n) for n in "abc"]
    d = KneeScheduler().schedule(apps, memory_mb=1.0, alpha=0.0)
    assert [a.level for a in d.allocations] == [1, 1, 1]
    assert [a.share for a in d.allocations] == pytest.approx([1 / 3] * 3)
    assert d.memory_mb == 6.0  # over the 1 MB budget: the baseline does not look at it


def test_largest_scheduler_keeps_every_app_as_large_as_memory_allows():
    app = AppProfile.from_levels("a", rows([0.70, 0.82, 0.84, 0.85], [1, 2, 3, 4], [1, 2, 4, 8], [1, 2, 4, 8]))
    apps = [app.renamed(n) for n in "abc"]
    d = get_scheduler("flexdnn").schedule(apps, memory_mb=24.0)
    assert [a.level for a in d.allocations] == [3, 3, 3] and [a.share for a in d.allocations] == pytest.approx([1 / 3] * 3)
    d = get_scheduler("flexdnn").schedule(apps, memory_mb=14.0)  # one steps down at a time, the later app first
    assert [a.level for a in d.allocations] == [2, 2, 2] and d.memory_mb <= 14.0
    d = get_scheduler("flexdnn").schedule(apps, memory_mb=18.0)
    assert [a.level for a in d.allocations] == [3, 2, 2]
    with pytest.raises(SchedulerError, match="smaller than the smallest configuration"):
        get_scheduler("flexdnn").schedule(apps, memory_mb=2.0)


def test_fixed_scheduler_freezes_levels_by_app_name():
    from nestflex.deploy.scheduler import FixedScheduler

    app = AppProfile.from_levels("a", rows([0.70, 0.82, 0.84, 0.85], [1, 2, 3, 4], [1, 2, 4, 8], [1, 2, 4, 8]))
    apps = [app.renamed(n) for n in "abc"]
    d = FixedScheduler({"a": 3, "c": 0}).schedule(apps, memory_mb=1.0)
    assert [a.level for a in d.allocations] == [3, 1, 0]  # b: not named, its knee
    with pytest.raises(SchedulerError, match=r"app 'a': frozen level 7 is not one of its levels \[0, 1, 2, 3\]"):
        FixedScheduler({"a": 7}).schedule(apps, memory_mb=1.0)
    with pytest.raises(SchedulerError, match="`levels` must map app names to level numbers >= 0"):
        FixedScheduler({"a": -1})
