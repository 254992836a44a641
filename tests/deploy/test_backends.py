"""Execution backends and the per-level plan (issue 23, part 1): parity with the eager program,
the plan beside the bundle, the level switch switching configuration, fallbacks and errors."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

import nestflex.deploy as nd
from nestflex.deploy.backends.base import BackendError, get_backend, list_backends
from nestflex.deploy.backends.plan import ExecutionPlan, LevelPlan, load_plan, plan_path, write_plan
from nestflex.deploy.tune import synthesize
from nestflex.cli import main
from tests.export.bundles import write_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backends")
    write_bundle(tmp)  # with ONNX files: a level file per level
    return nd.load(tmp / "model.nfx")


def _x(n=4, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["eager", "channels_last", "onnxruntime"])
def test_every_float_backend_equals_the_eager_program_at_every_level(bundle, name):
    pytest.importorskip(get_backend(name).package or "torch")
    x = _x()
    for level in range(bundle.num_levels):
        ref = nd.CapacityRuntime(bundle, level, plan=None)(x)
        plan = ExecutionPlan(tuple(LevelPlan(name, 1) for _ in range(bundle.num_levels)))
        rt = nd.CapacityRuntime(bundle, level, plan=plan)
        assert rt.backend == name
        torch.testing.assert_close(rt(x), ref, atol=1e-4, rtol=0)


def test_a_level_switch_switches_the_configuration(bundle):
    plan = ExecutionPlan((LevelPlan("eager"), LevelPlan("channels_last"), LevelPlan("onnxruntime")))
    rt = nd.CapacityRuntime(bundle, 0, plan=plan)
    x = _x(2, seed=3)
    for level, name in [(2, "onnxruntime"), (1, "channels_last"), (0, "eager"), (2, "onnxruntime")]:
        rt.set_level(level)
        assert rt.backend == name
        torch.testing.assert_close(rt(x), nd.CapacityRuntime(bundle, level, plan=None)(x), atol=1e-4, rtol=0)
    rt.set_level(0)
    assert rt.resident_bytes == rt.level_bytes(0)


def test_an_onnxruntime_level_keeps_one_copy_and_pages_back_in_for_eager_use(bundle):
    pytest.importorskip("onnxruntime")
    plan = ExecutionPlan((LevelPlan("eager"), LevelPlan("onnxruntime"), LevelPlan("onnxruntime")))
    rt = nd.CapacityRuntime(bundle, 0, plan=plan)
    x = _x(2, seed=5)
    report = rt.set_level(2)
    assert (report.page_in_bytes, report.page_out_bytes) == (0, rt.level_bytes(0))  # level 0's tensors go
    assert rt._store.resident_bytes == 0  # only the session's copy is resident
    session = get_backend("onnxruntime").model_path(bundle, 2).stat().st_size
    assert rt.resident_bytes == report.resident_bytes == session
    torch.testing.assert_close(rt(x), nd.CapacityRuntime(bundle, 2, plan=None)(x), atol=1e-4, rtol=0)
    assert rt.set_level(1).page_in_bytes == 0
    split = bundle.splits[0]["name"]
    head, tail = rt.split(split)  # eager: the level's tensors page in on demand
    torch.testing.assert_close(tail(*head(x)), nd.CapacityRuntime(bundle, 1, plan=None)(x), atol=1e-5, rtol=0)
    assert rt._store.resident_bytes == rt.level_bytes(1)
    report = rt.set_level(0)  # back to an eager level: all of it pages in
    assert rt.resident_bytes == rt.level_bytes(0)
    torch.testing.assert_close(rt(x), nd.CapacityRuntime(bundle, 0, plan=None)(x), atol=0, rtol=0)


def test_synthesize_keeps_only_agreeing_configurations_and_tune_writes_beside_the_bundle(bundle, tmp_path):
    plan = synthesize(bundle, threads=[1], repeats=3)
    assert len(plan.levels) == bundle.num_levels
    assert all(lp.backend in list_backends() and lp.latency_ms > 0 for lp in plan.levels)
    for c in plan.candidates:
        if "agrees" in c and c["backend"] == "eager":
            assert c["max_abs_diff"] == 0.0
    chosen = {(c["level"], c["backend"], c["threads"]): c for c in plan.candidates if "agrees" in c}
    assert all(chosen[(k, lp.backend, lp.threads)]["agrees"] for k, lp in enumerate(plan.levels))
    before = {p.name: p.stat().st_mtime_ns for p in bundle.path.rglob("*")}
    assert main(["tune", str(bundle.path), "--threads", "1", "--repeats", "2", "--quiet"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in bundle.path.rglob("*")} == before  # the bundle is untouched
    loaded = load_plan(bundle)
    assert loaded is not None and len(loaded.levels) == bundle.num_levels
    assert nd.CapacityRuntime(bundle, 0).plan is not None  # picked up by default
    nd.load(bundle.path)  # the checksums still hold
    plan_path(bundle).unlink()
    assert nd.CapacityRuntime(bundle, 0).plan is None


def test_a_missing_backend_package_falls_back_to_eager_with_a_warning(bundle, monkeypatch):
    monkeypatch.setattr(type(get_backend("onnxruntime")), "available", lambda self: False)
    plan = ExecutionPlan(tuple(LevelPlan("onnxruntime") for _ in range(bundle.num_levels)))
    with pytest.warns(UserWarning, match="needs the package 'onnxruntime'.*pip install onnxruntime"):
        rt = nd.CapacityRuntime(bundle, 0, plan=plan)
    assert rt.backend == "eager"


def test_bad_plans_and_unwritable_folders_are_clear_errors(bundle, tmp_path):
    with pytest.raises(BackendError, match="unknown execution backend `tensorrt`"):
        nd.CapacityRuntime(bundle, 0, plan=ExecutionPlan(tuple(LevelPlan("tensorrt") for _ in range(bundle.num_levels))))
    with pytest.raises(BackendError, match="not a nestflex execution plan"):
        ExecutionPlan.from_json({"levels": []})
    with pytest.raises(BackendError, match=r"threads must be an int"):
        ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager", "threads": 0}]})
    for key, value, match in [("budget_points", "1", "`budget_points` must be null or a number"),
                              ("budget_points", -1, "`budget_points` must be null or a number"),
                              ("check_samples", 2.5, "`check_samples` must be an int >= 0"),
                              ("check_samples", "many", "`check_samples` must be an int >= 0")]:
        with pytest.raises(BackendError, match=match):
            ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager"}], key: value})
    ok = ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager"}],
                                  "budget_points": 1, "check_samples": None})
    assert (ok.budget_points, ok.check_samples) == (1.0, 0)
    with pytest.raises(BackendError, match="does not exist"):
        write_plan(bundle, ExecutionPlan((LevelPlan(),)), tmp_path / "missing" / "p.json")
    assert main(["tune", str(bundle.path), "--threads", "1", "--repeats", "1", "--quiet",
                 "--out", str(tmp_path / "missing" / "p.json")]) == 2
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(BackendError, match="not writable"):
            write_plan(bundle, ExecutionPlan((LevelPlan(),)), ro / "p.json")
    finally:
        ro.chmod(stat.S_IRWXU)


def test_a_plan_for_another_bundle_is_ignored_with_a_warning(bundle):
    path = plan_path(bundle)
    path.write_text(json.dumps(ExecutionPlan(tuple(LevelPlan() for _ in range(bundle.num_levels)),
                                             bundle="0" * 64).to_json()))
    try:
        with pytest.warns(UserWarning, match="tuned for another bundle"):
            assert load_plan(bundle) is None
    finally:
        path.unlink()


# exit sets in the plan (issue 23: levels *and exits*)


def test_onnxruntime_exits_equal_the_eager_program_at_every_exit(bundle):
    pytest.importorskip("onnxruntime")
    from nestflex.deploy.backends.plan import ExitsPlan

    x = _x(5, seed=4)
    eager = nd.ProgressiveRuntime(bundle, plan=None)
    rt = nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 1)}))
    assert (eager.backend, rt.backend) == ("eager", "onnxruntime")
    for a, b in zip(rt.all_exits(x), eager.all_exits(x)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    for k in range(rt.num_exits):  # a sample leaving at k: every stage and head up to it
        torch.testing.assert_close(rt.path(x, k), eager.all_exits(x)[k], atol=1e-4, rtol=0)
    got, ref = rt(x, thresholds=[0.0, 0.0]), eager(x, thresholds=[0.0, 0.0])  # batched early exit, same answers
    assert got.exit_index.tolist() == ref.exit_index.tolist()
    torch.testing.assert_close(got.logits, ref.logits, atol=1e-4, rtol=0)
    # the sessions hold the stages and heads: no second copy in tensors (the eager heads page in on use)
    assert rt._head_store.resident_bytes == 0 and rt.capacity.resident_bytes == 0
    assert rt.own_bytes == rt.resident_bytes == rt._session_bytes > 0
    state = eager._eager_stages[0](x)
    torch.testing.assert_close(rt._eager_heads[0](state), eager._eager_heads[0](state), atol=0, rtol=0)
    assert rt._head_store.resident_bytes == eager._head_store.resident_bytes


def test_a_level_only_backend_is_refused_for_exits_with_the_fix(bundle):
    from nestflex.deploy.backends.plan import ExitsPlan

    with pytest.raises(BackendError, match="'channels_last' runs levels, not exit sets.*`eager` or `onnxruntime`"):
        nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("channels_last", 1)}))


def test_synthesize_plans_the_exits_and_the_plan_round_trips(bundle):
    plan = synthesize(bundle, threads=[1], repeats=2)
    ep = plan.exits["exits"]
    assert ep.backend in ("eager", "onnxruntime") and len(ep.latency_ms) == len(ep.eager_ms) == 3
    rows = [c for c in plan.candidates if c.get("exit_set") == "exits"]
    assert {c["backend"] for c in rows} >= {"eager"} and all(c["agrees"] for c in rows if c["backend"] == "eager")
    again = ExecutionPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.exits == plan.exits
    assert ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager"}]}).exits == {}
    for raw, match in [({"progressive": {"backend": "eager"}}, "names exit set 'progressive'"),
                       ({"exits": {"backend": "eager", "threads": 0}}, r"exits.exits.threads must be an int"),
                       ({"exits": {"backend": "eager", "latency_ms": "fast"}}, "must be lists of numbers"),
                       ([1], "`exits` must be an object")]:
        with pytest.raises(BackendError, match=match):
            ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager"}],
                                     "exits": raw})


def test_batch_sizes_get_their_own_choice_per_level_and_a_runtime_made_for_one_uses_it(bundle, capsys):
    plan = synthesize(bundle, backends=["eager", "channels_last"], threads=[1], repeats=2, batches=[1, 8])
    assert set(plan.batches) == {8} and len(plan.batches[8]) == bundle.num_levels
    rows = [c for c in plan.candidates if c.get("level") is not None and "batch_ms" in c]
    assert rows and all(set(c["batch_ms"]) == {"8"} for c in rows)
    for k, lp in enumerate(plan.batches[8]):  # the fastest agreeing configuration at batch 8
        timed = [c for c in rows if c["level"] == k and c["agrees"]]
        assert lp.latency_ms == min(c["batch_ms"]["8"] for c in timed)
    assert plan.for_batch(1) == plan.levels and plan.for_batch(7) == plan.levels
    assert plan.for_batch(8) == plan.batches[8] == plan.for_batch(64)
    custom = ExecutionPlan(tuple(LevelPlan("eager") for _ in range(bundle.num_levels)),
                           batches={8: tuple(LevelPlan("channels_last") for _ in range(bundle.num_levels))})
    assert nd.CapacityRuntime(bundle, 0, plan=custom).backend == "eager"
    assert nd.CapacityRuntime(bundle, 0, plan=custom, batch=16).backend == "channels_last"
    assert ExecutionPlan.from_json(json.loads(json.dumps(custom.to_json()))).batches == custom.batches
    with pytest.raises(BackendError, match="maps a batch size >= 2 to 3 level entries"):
        ExecutionPlan.from_json({**custom.to_json(), "batches": {"1": []}})
    with pytest.raises(nd.BundleError, match="`batch` must be an int >= 1"):
        nd.CapacityRuntime(bundle, 0, plan=custom, batch=0)
    with pytest.raises(BackendError, match="`batches` must be ints >= 1"):
        synthesize(bundle, batches=[0])
    assert main(["tune", str(bundle.path), "--threads", "1", "--repeats", "1", "--batches", "1", "4",
                 "--backends", "eager"]) == 0
    assert "batch 4:" in capsys.readouterr().out
    plan_path(bundle).unlink()
