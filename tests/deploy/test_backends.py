"""Execution backends and the per-level plan (issue 23, part 1): parity with the eager program,
the plan beside the bundle, the level switch switching configuration, fallbacks and errors; the
synthesis with its torch reference and, where torch is missing, the program's onnxruntime one."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nestflex.deploy as nd
from nestflex.deploy.backends.base import BackendError, get_backend, list_backends
from nestflex.deploy.backends.plan import ExecutionPlan, LevelPlan, load_plan, plan_path, write_plan
from nestflex.deploy.tune import reference_backend, synthesize
from nestflex.cli import main
from tests.export.bundles import write_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backends")
    write_bundle(tmp)  # with ONNX files: a level file per level
    return nd.load(tmp / "model.nfx")


def _x(n=4, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


@pytest.mark.parametrize("name", ["eager", "channels_last", "onnxruntime", "onnxruntime_program"])
def test_every_float_backend_equals_the_eager_program_at_every_level(bundle, name):
    x = _x()
    for level in range(bundle.num_levels):
        ref = nd.CapacityRuntime(bundle, level, plan="eager")(x)
        plan = ExecutionPlan(tuple(LevelPlan(name, 1) for _ in range(bundle.num_levels)))
        rt = nd.CapacityRuntime(bundle, level, plan=plan)
        assert rt.backend == name
        out = rt(x)
        assert isinstance(out, np.ndarray)  # numpy in, numpy out, whatever runs the level
        np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_the_program_backend_runs_the_graph_written_from_the_program_not_the_shipped_one(bundle):
    from nestflex.deploy.backends.graphs import shipped_level_graph

    for level in range(bundle.num_levels):
        shipped = shipped_level_graph(bundle, level)
        assert shipped is not None and get_backend("onnxruntime").model_path(bundle, level) == shipped
        written = get_backend("onnxruntime_program").model_path(bundle, level)
        assert written != shipped and written.name == f"level_{level}.program.onnx"
    assert get_backend("onnxruntime_program").precision == "float32"


def test_a_level_switch_switches_the_configuration(bundle):
    plan = ExecutionPlan((LevelPlan("eager"), LevelPlan("channels_last"), LevelPlan("onnxruntime")))
    rt = nd.CapacityRuntime(bundle, 0, plan=plan, keep="active")
    x = _x(2, seed=3)
    for level, name in [(2, "onnxruntime"), (1, "channels_last"), (0, "eager"), (2, "onnxruntime")]:
        rt.set_level(level)
        assert rt.backend == name
        np.testing.assert_allclose(rt(x), nd.CapacityRuntime(bundle, level, plan="eager")(x), atol=1e-4, rtol=0)
    rt.set_level(0)
    assert rt.resident_bytes == rt.level_bytes(0)  # the other levels' configurations went with them


def test_an_onnxruntime_level_keeps_one_copy_and_pages_back_in_for_eager_use(bundle):
    plan = ExecutionPlan((LevelPlan("eager"), LevelPlan("onnxruntime"), LevelPlan("onnxruntime")))
    rt = nd.CapacityRuntime(bundle, 0, plan=plan, keep="active")
    x = _x(2, seed=5)
    report = rt.set_level(2)
    session = get_backend("onnxruntime").model_path(bundle, 2).stat().st_size
    assert (report.page_in_bytes, report.page_out_bytes) == (session, rt.level_bytes(0))  # level 0's tensors go
    assert rt._store.resident_bytes == 0  # only the session's copy is resident
    assert rt.resident_bytes == report.resident_bytes == session
    np.testing.assert_allclose(rt(x), nd.CapacityRuntime(bundle, 2, plan="eager")(x), atol=1e-4, rtol=0)
    report = rt.set_level(1)  # another session: no tensor pages in
    assert report.page_in_bytes == get_backend("onnxruntime").model_path(bundle, 1).stat().st_size
    assert rt._store.resident_bytes == 0
    split = bundle.splits[0]["name"]
    head, tail = rt.split(split)  # the largest level cut, in sessions of its own: nothing pages in
    np.testing.assert_allclose(tail(*head(x)), nd.CapacityRuntime(bundle, 2, plan="eager")(x), atol=1e-4, rtol=0)
    assert rt._store.resident_bytes == 0
    report = rt.set_level(0)  # back to an eager level: all of it pages in
    assert report.page_in_bytes == rt.level_bytes(0) and rt.resident_bytes == rt.level_bytes(0)
    np.testing.assert_allclose(rt(x), nd.CapacityRuntime(bundle, 0, plan="eager")(x), atol=0, rtol=0)


def test_synthesize_keeps_only_agreeing_configurations_and_tune_writes_beside_the_bundle(bundle, tmp_path):
    plan = synthesize(bundle, threads=[1], repeats=3)
    assert len(plan.levels) == bundle.num_levels and plan.reference == reference_backend() == "eager"
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
    assert nd.CapacityRuntime(bundle, 0).plan == loaded  # picked up by default
    nd.load(bundle.path)  # the checksums still hold
    plan_path(bundle).unlink()
    default = nd.CapacityRuntime(bundle, 0).plan  # none beside the bundle: onnxruntime at one thread
    assert default != loaded and default.levels == tuple(LevelPlan("onnxruntime", 1) for _ in range(bundle.num_levels))


def test_a_missing_backend_package_falls_back_to_eager_with_a_warning(bundle, monkeypatch):
    monkeypatch.setattr(type(get_backend("onnxruntime")), "available", lambda self: False)
    plan = ExecutionPlan(tuple(LevelPlan("onnxruntime") for _ in range(bundle.num_levels)))
    with pytest.warns(UserWarning, match="needs the package 'onnxruntime'.*running eager.*pip install onnxruntime"):
        rt = nd.CapacityRuntime(bundle, 0, plan=plan)
    assert rt.backend == "eager"


def test_a_plan_naming_eager_without_torch_runs_onnxruntime_with_a_warning(bundle, monkeypatch):
    monkeypatch.setattr(type(get_backend("eager")), "available", lambda self: False)  # torch not installed
    with pytest.warns(UserWarning, match="needs the package 'torch'.*running onnxruntime.*pip install torch"):
        rt = nd.CapacityRuntime(bundle, 0, plan="eager")
    assert rt.backend == "onnxruntime"
    np.testing.assert_allclose(rt(_x()), nd.CapacityRuntime(bundle, 0, plan="onnxruntime")(_x()), atol=0, rtol=0)
    monkeypatch.setattr(type(get_backend("onnxruntime")), "available", lambda self: False)
    with pytest.raises(BackendError, match=r"needs the package 'torch'.*no fallback is \(onnxruntime, eager\). HINT: pip install torch"):
        nd.CapacityRuntime(bundle, 0, plan="eager")


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
    # a "folder" that is a regular file: refused whoever runs the tests (root included)
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(BackendError, match="is a file, not a folder"):
        write_plan(bundle, ExecutionPlan((LevelPlan(),)), tmp_path / "a_file" / "p.json")
    assert (tmp_path / "a_file").read_text() == "not a folder"


def _plan_error_as_nobody(folder):
    """What writable_plan_path says about a plan in ``folder`` to the unprivileged user ``nobody``.

    Root may write anywhere, and CI runs as root: a forked child drops to uid/gid 65534 and asks,
    so the permission check is the kernel's real one (no mock), with no new interpreter to start
    (the venv's interpreter may sit under a home folder nobody cannot read)."""
    from nestflex.deploy.backends.plan import writable_plan_path

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        msg = "no error"
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            writable_plan_path(None, folder / "p.json")
        except BackendError as e:
            msg = f"BackendError: {e}"
        except BaseException as e:  # noqa: BLE001 - anything else is reported to the parent, which fails
            msg = f"{type(e).__name__}: {e}"
        finally:
            os.write(w, msg.encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    os.waitpid(pid, 0)
    return msg


def test_a_plan_folder_the_user_cannot_write_is_refused_before_any_measuring(bundle, tmp_path):
    # a folder anyone may enter but only its owner may write: tmp_path itself is private to root
    # here, so the folder sits in a world-readable temporary one
    import tempfile

    top = Path(tempfile.mkdtemp())
    try:
        top.chmod(0o755)
        ro = top / "ro"
        ro.mkdir()
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        if os.geteuid() == 0:  # root ignores the mode bits: ask as nobody
            msg = _plan_error_as_nobody(ro)
            assert msg.startswith("BackendError: ") and "is not writable" in msg, msg
        else:
            with pytest.raises(BackendError, match="not writable"):
                write_plan(bundle, ExecutionPlan((LevelPlan(),)), ro / "p.json")
        assert list(ro.iterdir()) == []
    finally:
        (top / "ro").chmod(stat.S_IRWXU)
        shutil.rmtree(top)


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
    from nestflex.deploy.backends.plan import ExitsPlan

    x = _x(5, seed=4)
    eager = nd.ProgressiveRuntime(bundle, plan="eager")
    rt = nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 1)}))
    assert (eager.backend, rt.backend) == ("eager", "onnxruntime")
    for a, b in zip(rt.all_exits(x), eager.all_exits(x)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    for k in range(rt.num_exits):  # a sample leaving at k: every stage and head up to it
        np.testing.assert_allclose(rt.path(x, k), eager.all_exits(x)[k], atol=1e-4, rtol=0)
    got, ref = rt(x, thresholds=[0.0, 0.0]), eager(x, thresholds=[0.0, 0.0])  # batched early exit, same answers
    assert got.exit_index.tolist() == ref.exit_index.tolist()
    np.testing.assert_allclose(got.logits, ref.logits, atol=1e-4, rtol=0)
    # the sessions hold the stages and heads: no second copy in tensors (the eager ones page in on use)
    assert rt._head_store.resident_bytes == 0 and rt._backbone_store.resident_bytes == 0
    assert rt.own_bytes == rt.resident_bytes == rt._prepared_bytes() > 0
    assert eager._head_store.resident_bytes > 0
    state = eager._stages[0](x)  # the same stage output, through either head
    np.testing.assert_allclose(rt._heads_fns[0](rt._stages[0](x)), eager._heads_fns[0](state), atol=1e-4, rtol=0)


def test_a_level_only_backend_is_refused_for_exits_with_the_fix(bundle):
    from nestflex.deploy.backends.plan import ExitsPlan

    with pytest.raises(BackendError, match=r"'channels_last' runs levels, not exit sets.*`onnxruntime` \(or `eager`\)"):
        nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("channels_last", 1)}))


def test_synthesize_plans_the_exits_and_the_plan_round_trips(bundle):
    plan = synthesize(bundle, threads=[1], repeats=2)
    ep = plan.exits["exits"]
    assert ep.backend in ("eager", "onnxruntime", "onnxruntime_program") and len(ep.latency_ms) == len(ep.eager_ms) == 3
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
        rematched = [c for c in timed if "batch_8_ms_rematch" in c]
        if rematched:  # configurations within 10% were timed again side by side, and that round decided
            assert lp.latency_ms == min(c["batch_8_ms_rematch"] for c in rematched)
            assert (lp.backend, lp.threads) in {(c["backend"], c["threads"]) for c in rematched}
        else:
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


def test_without_torch_the_synthesis_checks_every_candidate_against_the_program_in_onnxruntime(bundle, monkeypatch):
    monkeypatch.setattr(type(get_backend("eager")), "available", lambda self: False)  # torch not installed
    assert reference_backend() == "onnxruntime_program"
    plan = synthesize(bundle, backends=["onnxruntime"], threads=[1], repeats=1)
    assert plan.reference == "onnxruntime_program"
    rows = [c for c in plan.candidates if "agrees" in c]
    # the reference is always a candidate (exact against itself); the shipped graphs, exported by
    # torch.onnx, agree with the program's
    assert {c["backend"] for c in rows} == {"onnxruntime_program", "onnxruntime"}
    assert all(c["agrees"] for c in rows)
    assert all(c["max_abs_diff"] == 0.0 for c in rows if c["backend"] == "onnxruntime_program")
    assert all(lp.backend in ("onnxruntime", "onnxruntime_program") and lp.eager_ms > 0 for lp in plan.levels)
    assert plan.exits["exits"].backend in ("onnxruntime", "onnxruntime_program")
    again = ExecutionPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.reference == "onnxruntime_program" and again.levels == plan.levels
    assert ExecutionPlan.from_json({"format": "nestflex-execution-plan", "levels": [{"backend": "eager"}]}).reference \
        == "eager"  # plans written before the reference was recorded
    with pytest.raises(BackendError, match="`reference` must be a backend name"):
        ExecutionPlan.from_json({**plan.to_json(), "reference": 3})


def test_a_plan_at_other_threads_keeps_its_backends_and_names_every_exit_set():
    from nestflex.deploy.backends.plan import ExitsPlan

    plan = ExecutionPlan((LevelPlan("eager", 1, 2.0), LevelPlan("onnxruntime", 3)), exits={"exits": ExitsPlan("eager", 2)},
                         batches={8: (LevelPlan("channels_last", 1), LevelPlan("onnxruntime", 1))})
    got = plan.with_threads(4, ["exits", "flex_exits"])
    assert [(lp.backend, lp.threads, lp.latency_ms) for lp in got.levels] == [("eager", 4, 2.0), ("onnxruntime", 4, None)]
    assert got.exits == {"exits": ExitsPlan("eager", 4), "flex_exits": ExitsPlan("onnxruntime", 4)}
    assert [(lp.backend, lp.threads) for lp in got.batches[8]] == [("channels_last", 4), ("onnxruntime", 4)]
    assert plan.levels[0].threads == 1  # the plan itself is left as it was
    for bad in (0, 2000, 1.5, True):
        with pytest.raises(BackendError, match=r"`threads` must be an int in \[1, 1024\]"):
            plan.with_threads(bad)


def test_levels_not_faster_than_a_larger_one_are_found_at_each_batch():
    """Issue 38 item 4, as the recipe's own latency table had it: level 2 faster than levels 0 and 1."""
    lp = lambda ms: LevelPlan("onnxruntime", 1, ms)  # noqa: E731
    plan = ExecutionPlan((lp(1.24), lp(1.57), lp(1.17), lp(2.0)), batches={8: (lp(3.0), lp(4.0), lp(5.0), lp(6.0))})
    assert plan.out_of_order() == [(0, 2), (1, 2)]
    assert plan.out_of_order(8) == []  # strictly ordered at batch 8
    assert ExecutionPlan((lp(1.0), lp(1.0))).out_of_order() == [(0, 1)]  # a tie saves no time either
    assert ExecutionPlan((lp(1.0), lp(None))).out_of_order() == []  # nothing measured, nothing said


def test_tune_says_which_levels_save_no_time(bundle, tmp_path, monkeypatch, capsys):
    from nestflex import cli
    from nestflex.deploy import tune

    real = tune.synthesize

    def slow_smallest(b, **kwargs):  # the measured plan, with level 0 made slower than level 1
        plan = real(b, **kwargs)
        levels = list(plan.levels)
        levels[0] = replace(levels[0], latency_ms=levels[1].latency_ms + 1.0)
        return replace(plan, levels=tuple(levels))

    monkeypatch.setattr(tune, "synthesize", slow_smallest)
    assert cli.main(["tune", str(bundle.path), "--threads", "1", "--repeats", "1", "--backends", "onnxruntime", "--quiet",
                     "--out", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    # level 0 now runs 1 ms slower than level 1, so some larger level (the fastest of them) beats it
    assert re.search(r"warning: at batch 1, level 0 \([\d.]+ ms\) is not faster than level [12] \([\d.]+ ms\): "
                     r"it saves memory here, not time", out), out


def test_the_eager_backend_runs_at_its_plan_s_threads_and_leaves_torch_s_setting(bundle, monkeypatch):
    import torch

    from nestflex.deploy.backends import torch_program

    seen = []
    real = torch_program.run_program
    monkeypatch.setattr(torch_program, "run_program",
                        lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    rt = nd.CapacityRuntime(bundle, 0, plan=ExecutionPlan(tuple(LevelPlan("eager", 3) for _ in range(bundle.num_levels))))
    torch.set_num_threads(2)
    rt(_x(1))
    assert seen == [3] and torch.get_num_threads() == 2  # the caller's setting is put back
