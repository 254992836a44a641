"""Early exits chosen by their time (issue 23): a runtime evaluates only its `active` early exits,
stage by stage and in the fused graph, with the policy's answers on the kept exits; the synthesis
drops the exits that cost more time than they save, measured, within the accuracy budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nestflex.deploy as nd
import nestflex.deploy.backends as backends
import nestflex.deploy.tune as tune
from nestflex.deploy.backends.base import BackendError, tuned_dir
from nestflex.deploy.backends.plan import ExecutionPlan, ExitsPlan
from nestflex.deploy.tune import choose_active_exits
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.exits import apply_policy
from tests.deploy.test_int8 import _samples
from tests.export.bundles import nested_vgg, write_bundle

SUBSETS = [(), (0,), (1,), (0, 1)]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("active")
    write_bundle(tmp, samples=_samples(nested_vgg(tmp_path_factory.mktemp("net"))))
    return nd.load(tmp / "model.nfx")


def _frames(n=10):
    return np.random.default_rng(11).standard_normal((n, 3, 32, 32), dtype=np.float32) * 3


def _want(logits, active, thr, confidence, fallback):
    """The policy on the kept exits' logits alone, its indices numbered in the whole set."""
    ends = [*active, len(logits) - 1]
    got = apply_policy([logits[k] for k in ends], [thr[k] for k in active], confidence, fallback)
    number = np.asarray(ends)
    return got.logits, number[got.exit_index], number[got.answer_index]


@pytest.mark.parametrize("active", SUBSETS)
@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_a_subset_of_exits_answers_as_the_policy_on_those_exits_batched_one_by_one_and_fused(bundle, active,
                                                                                              fallback):
    eager = nd.ProgressiveRuntime(bundle, plan="eager", active=active)
    fused = nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 1)}), active=active)
    assert eager.active == fused.active == active and fused._fused is not None
    everything = nd.ProgressiveRuntime(bundle, plan="eager")
    x = _frames()
    seen = set()
    for thr in ([0.0, 0.0], [0.4, 0.6], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]):
        logits = everything.all_exits(x)
        want_logits, want_exit, want_answer = _want(logits, active, thr, eager.confidence, fallback)
        batch = eager(x, thresholds=thr, fallback=fallback)
        assert batch.exit_index.tolist() == want_exit.tolist() and batch.answer_index.tolist() == want_answer.tolist()
        np.testing.assert_allclose(batch.logits, want_logits, atol=1e-5, rtol=1.3e-6)
        for i in range(x.shape[0]):
            one = eager(x[i:i + 1], thresholds=thr, fallback=fallback)
            assert one.exit_index.tolist() == [int(want_exit[i])] and one.answer_index.tolist() == [int(want_answer[i])]
            if fallback == fused.fallback:  # the fused graph serves the set's own fallback
                got = fused(x[i:i + 1], thresholds=thr)
                assert got.exit_index.tolist() == [int(want_exit[i])], (thr, i)
                assert got.answer_index.tolist() == [int(want_answer[i])], (thr, i)
                np.testing.assert_allclose(got.logits, want_logits[i:i + 1], atol=1e-4, rtol=0)
            seen.add(int(want_exit[i]))
    assert seen == {*active, 2}  # only kept exits (and the final one) ever answer


def test_a_dropped_exit_s_head_never_runs(bundle):
    rt = nd.ProgressiveRuntime(bundle, plan="eager", active=(1,))  # stage by stage (no fused graph)
    calls = []
    heads = rt._heads_fns
    rt._heads_fns = [lambda s, k=k, h=h: (calls.append(k), h(s))[1] for k, h in enumerate(heads)]
    rt(_frames(4), thresholds=[0.0, 0.0])
    rt(_frames(1), thresholds=[1.0, 1.0])
    assert calls and 0 not in calls
    calls.clear()
    rt.path(_frames(1), 2)
    assert calls == [1, 2]


@pytest.mark.parametrize("bad", [(2,), (-1,), (0, 0), ("a",), (0.5,), 7])
def test_an_exit_the_set_does_not_have_is_refused_by_name(bundle, bad):
    with pytest.raises(BundleError, match=r"`active` must list distinct early exits of exits in \[0, 1\]"):
        nd.ProgressiveRuntime(bundle, plan=None, active=bad)


def test_the_plan_carries_the_kept_exits_and_checks_them(bundle, tmp_path):
    entry = ExitsPlan("eager", 1, (0.1, 0.2, 0.3), (0.1, 0.2, 0.3), (1,), 0.2, 0.25)
    plan = ExecutionPlan(tuple(backends.LevelPlan() for _ in range(bundle.num_levels)), exits={"exits": entry})
    data = json.loads(json.dumps(plan.to_json()))
    assert data["exits"]["exits"]["active"] == [1]
    again = ExecutionPlan.from_json(data)
    assert again.exits["exits"] == entry
    assert nd.ProgressiveRuntime(bundle, plan=again).active == (1,)
    assert nd.ProgressiveRuntime(bundle, plan=again, active=(0, 1)).active == (0, 1)  # the caller's choice wins
    data["exits"]["exits"]["active"] = ["first"]
    with pytest.raises(BackendError, match=r"exits.exits.active must be null or a list of early-exit indices"):
        ExecutionPlan.from_json(data)
    del data["exits"]["exits"]["active"]  # plans written before exits were chosen: every exit
    assert ExecutionPlan.from_json(data).exits["exits"].active is None


def _fake_clock(monkeypatch, per_head_ms, final_says_kept_is_faster=True):
    """Each runtime's mean frame time: 1 ms plus ``per_head_ms`` per kept exit (the measured
    search's inputs, made exact); the last side-by-side check can be told to disagree."""
    calls = []

    def fake(runtimes, x, repeats):
        calls.append(list(runtimes))
        out = {k: 1.0 + per_head_ms * len(rt.active) for k, rt in runtimes.items()}
        if set(runtimes) == {"all", "kept"} and not final_says_kept_is_faster:
            out["kept"] = out["all"] + 1
        return out

    monkeypatch.setattr(tune, "_mean_frame_ms", fake)
    return calls


def test_the_search_drops_exits_that_cost_more_than_they_save_within_the_budget(bundle, monkeypatch):
    _fake_clock(monkeypatch, per_head_ms=0.5)
    got = choose_active_exits(bundle, "exits", ExitsPlan("eager", 1), budget_points=100)
    assert got.active == () and got.mean_ms == 1.0 and got.all_mean_ms == 2.0
    assert got.backend == "eager" and got.threads == 1


def test_the_search_keeps_every_exit_when_dropping_one_gains_nothing(bundle, monkeypatch):
    _fake_clock(monkeypatch, per_head_ms=0.0)
    got = choose_active_exits(bundle, "exits", ExitsPlan("eager", 1), budget_points=100)
    assert got.active is None and got.mean_ms == got.all_mean_ms == 1.0


def test_the_search_keeps_every_exit_when_the_final_measurement_disagrees(bundle, monkeypatch):
    _fake_clock(monkeypatch, per_head_ms=0.5, final_says_kept_is_faster=False)
    for f in tuned_dir(bundle).glob("exits.fused-*-a0.onnx*"):  # the search will build this one itself
        f.unlink()
    before = set(tuned_dir(bundle).glob("exits.fused-*-a*.onnx*"))
    got = choose_active_exits(bundle, "exits", ExitsPlan("onnxruntime", 1), budget_points=100)
    assert got.active is None
    # the subsets' graphs it built are not left behind, nor their weights files; those other runtimes built stay
    assert set(tuned_dir(bundle).glob("exits.fused-*-a*.onnx*")) == before


def _accuracy_needs_every_exit(bundle, monkeypatch):
    """The policy answers right only when it runs every exit (an exit set whose every exit the
    budget needs), at whatever thresholds: the search's accuracy check made decisive."""
    import nestflex.deploy.exits as exits_module

    y = backends.calibration_split(bundle)[1][1]
    real = exits_module.apply_policy
    seen = []

    def policy(logits, thresholds, confidence="max_prob", fallback="most_confident"):
        got = real(logits, thresholds, confidence, fallback)
        seen.append(list(thresholds))
        right = np.eye(10, dtype=np.float32)[y if len(logits) == 3 else (y + 1) % 10]
        return exits_module.ExitResult(right, got.exit_index, got.answer_index, got.confidence)

    monkeypatch.setattr(exits_module, "apply_policy", policy)
    return seen


def test_the_search_never_drops_an_exit_the_accuracy_budget_needs(bundle, monkeypatch):
    _fake_clock(monkeypatch, per_head_ms=0.5)  # every drop would save time
    seen = _accuracy_needs_every_exit(bundle, monkeypatch)
    assert choose_active_exits(bundle, "exits", ExitsPlan("eager", 1), budget_points=50).active is None
    assert seen  # the budget was checked
    assert choose_active_exits(bundle, "exits", ExitsPlan("eager", 1), budget_points=100).active == ()


def test_the_budget_is_checked_at_every_operating_point_the_engine_may_run(bundle, monkeypatch):
    from nestflex.deploy.engine import operating_points

    _fake_clock(monkeypatch, per_head_ms=0.5)
    seen = _accuracy_needs_every_exit(bundle, monkeypatch)
    choose_active_exits(bundle, "exits", ExitsPlan("eager", 1), budget_points=50)
    points = [list(p.thresholds) for p in operating_points(bundle, "exits")[0]]
    full = [t for t in seen if len(t) == 2]  # the policy over every exit: one threshold per early exit
    assert points and all(p in full for p in points)


def test_an_onnxruntime_exit_plan_writes_no_optimised_copy_of_its_fused_graph(bundle):
    rt = nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 1)}))
    assert rt._fused is not None
    assert not list(tuned_dir(bundle).glob("exits.fused-*.optimized.onnx"))



def test_the_synthesis_picks_the_exit_configuration_with_the_least_mean_frame_time(bundle):
    from nestflex.deploy.tune import synthesize

    plan = synthesize(bundle, backends=["eager", "onnxruntime"], threads=[1], repeats=2)
    rows = [c for c in plan.candidates if c.get("exit_set") == "exits" and c.get("agrees")]
    assert {r["backend"] for r in rows} == {"eager", "onnxruntime"} and all(r["mean_frame_ms"] > 0 for r in rows)
    best = min(rows, key=lambda r: r["mean_frame_ms"])
    entry = plan.exits["exits"]
    assert (entry.backend, entry.threads) == (best["backend"], best["threads"])
    assert entry.mean_ms > 0 and entry.all_mean_ms > 0  # then the exit choice measured it


@pytest.mark.parametrize("confidence", ["max_prob", "entropy"])
@pytest.mark.parametrize("fallback", ["most_confident", "final"])
@pytest.mark.parametrize("active", [(), (0,), (1,)])
def test_the_fused_graph_of_a_subset_gives_the_policy_answer_for_both_confidences_and_fallbacks(
        bundle, confidence, fallback, active):
    from nestflex.deploy.backends.onnxruntime import _fused_call, _session, fused_exits_path

    files = {(o.kind, o.extra.get("stage", o.extra.get("exit"))): o for o in bundle.spec.onnx
             if o.kind in ("stage", "exit") and o.exit_set == "progressive"}
    path = fused_exits_path(bundle, "exits", confidence, fallback, [bundle.file(files[("stage", k)].file) for k in range(3)],
                            [bundle.file(files[("exit", k)].file) for k in range(2)],
                            [int(files[("stage", k)].extra.get("tap_output") or 0) for k in range(2)], list(active))
    assert path.name.endswith(f"-a{'.'.join(map(str, active))}.onnx")
    fused = _fused_call(_session(path, 1, None))
    everything = nd.ProgressiveRuntime(bundle, plan="eager")
    x = _frames(8)
    for thr in ([0.0, 0.0], [0.4, 0.6], [1.0, 1.0]):
        want_logits, want_exit, want_answer = _want(everything.all_exits(x), active, thr, confidence, fallback)
        for i in range(x.shape[0]):
            got = fused(x[i:i + 1], thr)
            assert got.exit_index.tolist() == [int(want_exit[i])] and got.answer_index.tolist() == [int(want_answer[i])]
            np.testing.assert_allclose(got.logits, want_logits[i:i + 1], atol=1e-4, rtol=0)

