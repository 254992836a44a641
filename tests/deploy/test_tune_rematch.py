"""The synthesis times its close configurations again side by side (deploy_footprint: a plan picked
on one noisy timing ran 8.6% slower than another run's pick)."""

from __future__ import annotations

import numpy as np

from nestflex.deploy import tune


def test_close_configurations_are_timed_again_and_the_second_round_decides(monkeypatch):
    calls = []

    def fake(fns, repeats, warmup=1, min_ms=0.0):
        calls.append(sorted(fns))
        for fn in fns.values():
            fn()  # each runtime really runs
        return {("b", 2): 10.0, ("a", 1): 10.8}  # side by side, blocks of 10 calls: "b" is the faster one

    monkeypatch.setattr("nestflex.deploy.timing.alternating_median_ms", fake)
    ran = []
    agreeing = {("a", 1): (lambda x: ran.append("a"), 0.9), ("b", 2): (lambda x: ran.append("b"), 0.8),
                ("c", 1): (lambda x: ran.append("c"), 0.9)}
    rows = [{"backend": n, "threads": t} for n, t in agreeing]
    times = {("a", 1): 1.00, ("b", 2): 1.05, ("c", 1): 1.30}  # alone, "a" looked fastest; "c" is not close
    best = tune._rematch(("a", 1, 1.00, 0.9), np.zeros(1), agreeing, times, 5, rows, "latency_ms")
    assert best == ("b", 2, 1.00, 0.8)
    # 10% of the best: "c" is not timed; each turn is a block of calls
    assert calls == [[("a", 1), ("b", 2)]] and sorted(set(ran)) == ["a", "b"] and ran.count("a") == tune.REMATCH_BLOCK
    assert {r["backend"]: r.get("latency_ms_rematch") for r in rows} == {"a": 1.08, "b": 1.0, "c": None}  # per call


def test_a_best_with_no_close_rival_is_kept_untimed(monkeypatch):
    monkeypatch.setattr("nestflex.deploy.timing.alternating_median_ms",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed")))
    agreeing = {("a", 1): (lambda x: None, 0.9), ("b", 1): (lambda x: None, 0.9)}
    best = tune._rematch(("a", 1, 1.0, 0.9), np.zeros(1), agreeing, {("a", 1): 1.0, ("b", 1): 1.5}, 5, [], "k")
    assert best == ("a", 1, 1.0, 0.9)
