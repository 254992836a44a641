"""The fused early-exit graph (issue 23): one onnxruntime call per frame gives the torch policy's
answers for every exit, confidence and fallback; the per-stage sessions open only when used."""

from __future__ import annotations

import numpy as np
import pytest

import nestflex.deploy as nd
from nestflex.deploy.backends.plan import ExecutionPlan, ExitsPlan
from nestflex.deploy.backends.onnxruntime import _fused_call, _session, fused_exits_path
from nestflex.deploy.backends.base import tuned_dir
from nestflex.deploy.backends.fused_exits import weights_file
from nestflex.deploy.exits import apply_policy, get_confidence, register_confidence
from tests.export.bundles import write_bundle



@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused")
    write_bundle(tmp)
    return nd.load(tmp / "model.nfx")


def _plan():
    return ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 1)})


def _frames(n=12):
    return np.random.default_rng(7).standard_normal((n, 3, 32, 32), dtype=np.float32) * 3


def _fused(bundle, confidence, fallback):
    files = {(o.kind, o.extra.get("stage", o.extra.get("exit"))): o for o in bundle.spec.onnx
             if o.kind in ("stage", "exit") and o.exit_set == "progressive"}
    n = len(bundle.spec.exit_set("exits").names)
    path = fused_exits_path(bundle, "exits", confidence, fallback, [bundle.file(files[("stage", k)].file) for k in range(n)],
                            [bundle.file(files[("exit", k)].file) for k in range(n - 1)],
                            [int(files[("stage", k)].extra.get("tap_output") or 0) for k in range(n - 1)])
    return path, _fused_call(_session(path, 1, tuned_dir(bundle) / f"{path.stem}.optimized.onnx"))


def test_the_fused_graph_keeps_its_weights_in_a_file_beside_it(bundle):
    import onnx

    path, _ = _fused(bundle, "max_prob", "final")
    weights = sum(bundle.file(o.file).stat().st_size for o in bundle.spec.onnx
                  if o.kind in ("stage", "exit") and o.exit_set == "progressive")
    # every weight of the stages and heads is in the data file, none in the graph (or its branches)
    assert weights_file(path).stat().st_size > 0.8 * weights > path.stat().st_size
    model = onnx.load(str(path), load_external_data=False)
    inline = [t.name for g in [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.type == a.GRAPH]
              for t in g.initializer if len(t.raw_data) >= 1024]
    assert inline == []


@pytest.mark.parametrize("confidence", ["max_prob", "entropy"])
@pytest.mark.parametrize("fallback", ["most_confident", "final"])
def test_the_fused_graph_gives_the_policy_answer_for_every_frame_and_threshold(bundle, confidence, fallback):
    eager = nd.ProgressiveRuntime(bundle, plan="eager")
    path, fused = _fused(bundle, confidence, fallback)
    assert path.parent == tuned_dir(bundle)  # kept beside the bundle, never in it
    frames = _frames()
    # every exit forced, nothing passing (the fallback), everything passing, and values in between
    settings = [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.3, 0.6], [0.6, 0.3], [0.5, 0.5]]
    exits_seen = set()
    for thr in settings:
        for i in range(frames.shape[0]):
            x = frames[i:i + 1]
            want = apply_policy(eager.all_exits(x), thr, confidence, fallback)
            got = fused(x, thr)
            assert got.exit_index.tolist() == want.exit_index.tolist(), (thr, i)
            assert got.answer_index.tolist() == want.answer_index.tolist(), (thr, i)
            np.testing.assert_allclose(got.logits, want.logits, atol=1e-4, rtol=0)
            assert got.confidence.dtype == np.float32
            np.testing.assert_allclose(got.confidence, want.confidence.astype(np.float32), atol=1e-5, rtol=0)
            exits_seen.add((int(got.exit_index[0]), int(got.answer_index[0])))
    assert {e for e, _ in exits_seen} == {0, 1, 2}  # the settings reach every exit
    if fallback == "most_confident":
        assert any(e != a for e, a in exits_seen)  # and the fallback answered from an earlier exit


def test_an_onnxruntime_exit_plan_serves_one_frame_in_one_call_and_opens_stages_on_use(bundle, monkeypatch):
    rt = nd.ProgressiveRuntime(bundle, plan=_plan())
    eager = nd.ProgressiveRuntime(bundle, plan="eager")
    assert rt._fused is not None
    fused_bytes = rt.own_bytes  # only the fused graph is open so far
    assert fused_bytes > 0 and rt._head_store.resident_bytes == 0
    frames = _frames(6)
    for i in range(frames.shape[0]):
        got, want = rt(frames[i:i + 1], thresholds=[0.4, 0.5]), eager(frames[i:i + 1], thresholds=[0.4, 0.5])
        assert got.exit_index.tolist() == want.exit_index.tolist()
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-4, rtol=0)
    assert rt.own_bytes == fused_bytes
    rt(frames, thresholds=[0.4, 0.5])  # up to fused_batch frames: frame by frame in the fused graph
    assert rt.own_bytes == fused_bytes
    frames = _frames(12)
    batch = rt(frames, thresholds=[0.4, 0.5])  # a larger batch runs stage by stage: those sessions open now
    assert rt.own_bytes > fused_bytes
    assert batch.exit_index.tolist() == eager(frames, thresholds=[0.4, 0.5]).exit_index.tolist()
    calls = []
    monkeypatch.setattr(rt, "_fused", lambda *a: calls.append(a))
    rt(frames[:1], fallback="final" if rt.fallback != "final" else "most_confident")  # another policy: stage by stage
    rt(frames[:1], confidence=get_confidence("max_prob"))  # a callable, not the set's own name
    assert calls == []


def test_the_stage_sessions_a_batch_opens_are_trimmed_for_once_when_the_last_opens(bundle, monkeypatch):
    import nestflex.deploy.backends.onnxruntime as ort_backend

    frames = _frames(12)  # more than fused_batch: a batch through the stage sessions
    nd.ProgressiveRuntime(bundle, plan=_plan())(frames, thresholds=[1.0, 1.0])  # the optimised copies are saved
    trims = []
    monkeypatch.setattr(ort_backend, "release_freed", lambda: trims.append(1) or True)
    rt = nd.ProgressiveRuntime(bundle, plan=_plan())
    built = len(trims)  # the fused graph's own build (optimised every time)
    rt(frames[:1])
    assert len(trims) == built  # one frame: the fused graph, no stage session
    rt(frames, thresholds=[1.0, 1.0])  # no sample leaves early: every stage and head opens
    assert len(trims) == built + 1  # once for the group, not after each of its sessions (issue 37)
    rt(frames, thresholds=[1.0, 1.0])
    assert len(trims) == built + 1


def test_the_stage_sessions_a_batch_runs_one_after_another_do_not_spin_and_the_fused_one_does(bundle, monkeypatch):
    import onnxruntime as ort

    spins = []
    real = ort.InferenceSession

    def recording(path, sess_options=None, *args, **kwargs):
        try:
            entry = sess_options.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: onnxruntime's default, spinning
            entry = "default"
        spins.append((str(path), entry))
        return real(path, sess_options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    rt = nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime", 2)}))
    fused = list(spins)
    rt(_frames(12), thresholds=[1.0, 1.0])  # more than fused_batch: every stage and head session opens
    batch = spins[len(fused):]
    # the fused graph serves one frame in one call: its threads may spin between frames; a batch's
    # sessions run in turn, and one's spinning threads would take the cores from the next (issue 37)
    assert any("fused" in path for path, _ in fused)
    assert all(entry == "default" for path, entry in fused if "fused" in path)
    assert len(batch) >= 2 and all(entry == "0" for _, entry in batch)


def test_a_small_batch_runs_frame_by_frame_through_the_fused_graph_and_opens_no_stage_session(bundle, monkeypatch):
    import onnxruntime as ort

    frames = _frames(6)
    stages = nd.ProgressiveRuntime(bundle, plan=_plan(), fused_batch=1)(frames, thresholds=[0.4, 0.5])
    opened = []
    real = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", lambda path, *a, **k: opened.append(str(path)) or real(path, *a, **k))
    rt = nd.ProgressiveRuntime(bundle, plan=_plan())  # fused_batch 8
    at_build = list(opened)
    got = rt(frames, thresholds=[0.4, 0.5])
    assert opened == at_build and any("fused" in p for p in at_build)  # the batch opened no session
    # each frame leaves at its own exit, as in the batched stages
    assert got.exit_index.tolist() == stages.exit_index.tolist()
    assert got.answer_index.tolist() == stages.answer_index.tolist()
    np.testing.assert_allclose(got.logits, stages.logits, rtol=1e-4, atol=1e-4)
    assert got.logits.shape == stages.logits.shape and got.confidence.shape == (6,)
    rt(_frames(12), thresholds=[0.4, 0.5])  # above fused_batch: through the stages
    assert len(opened) > len(at_build)
    with pytest.raises(nd.BundleError, match="`fused_batch` must be an int >= 1.*got 0"):
        nd.ProgressiveRuntime(bundle, plan=_plan(), fused_batch=0)


def _top2(z):
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.clip(np.sort(p, -1)[..., -2:].sum(-1), 0, 1).astype(np.float32)


def test_a_custom_confidence_set_runs_stage_by_stage(bundle, monkeypatch):
    import nestflex.deploy.exits as exits_module
    from nestflex.deploy.backends.base import ExitsContext, get_backend

    # the registry is global: work on a copy so other tests' pinned name lists stay as they are
    monkeypatch.setattr(exits_module._CONFIDENCES, "_entries", dict(exits_module._CONFIDENCES._entries))
    register_confidence("test_fused_top2", overwrite=True)(_top2)
    rt = nd.ProgressiveRuntime(bundle, plan=_plan())
    # a set calibrated with a registered measure the graph cannot compute: what the backend prepares
    ctx = ExitsContext(bundle, "exits", rt.spec, 1, "test_fused_top2", rt.fallback, rt.active,
                       bundle.spec.capacity.program.nodes, bundle.num_levels - 1, dict, dict)
    prepared = get_backend("onnxruntime").prepare_exits(ctx)
    assert prepared.fused is None and len(prepared.stages) == rt.num_exits
    rt.confidence, rt._stages, rt._heads_fns, rt._fused = "test_fused_top2", prepared.stages, prepared.heads, None
    x = _frames(4)
    for i in range(4):
        want = apply_policy(nd.ProgressiveRuntime(bundle, plan="eager").all_exits(x[i:i + 1]), [0.9, 0.9],
                            "test_fused_top2", rt.fallback)
        assert rt(x[i:i + 1], thresholds=[0.9, 0.9]).exit_index.tolist() == want.exit_index.tolist()


def test_a_graph_that_cannot_be_fused_warns_and_runs_stage_by_stage(bundle, monkeypatch):
    import nestflex.deploy.backends.onnxruntime as backends

    def broken(*args, **kwargs):
        raise ValueError("no graph form")

    monkeypatch.setattr(backends, "fused_exits_path", broken)
    with pytest.warns(UserWarning, match="fused early-exit graph could not be built.*no graph form"):
        rt = nd.ProgressiveRuntime(bundle, plan=_plan())
    assert rt._fused is None
    x = _frames(1)
    assert rt(x, thresholds=[0.5, 0.5]).exit_index.tolist() == \
        nd.ProgressiveRuntime(bundle, plan="eager")(x, thresholds=[0.5, 0.5]).exit_index.tolist()


def test_without_onnx_the_fused_graph_is_skipped_with_a_warning_naming_the_extra(bundle, tmp_path, monkeypatch):
    import shutil
    import sys

    copy = nd.load(shutil.copytree(bundle.path, tmp_path / "model.nfx"))  # no fused graph built beside it yet
    monkeypatch.setitem(sys.modules, "onnx", None)  # the base install
    with pytest.warns(UserWarning, match=r"no fused early-exit graph \(onnx is not installed\).*stage by stage.*"
                                         r"nestflex\[tune\]"):
        rt = nd.ProgressiveRuntime(copy, plan=_plan())
    assert rt._fused is None
    x = _frames(3)
    for i in range(3):
        got, want = rt(x[i:i + 1], thresholds=[0.4, 0.5]), nd.ProgressiveRuntime(copy, plan="eager")(
            x[i:i + 1], thresholds=[0.4, 0.5])
        assert got.exit_index.tolist() == want.exit_index.tolist()
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-4, rtol=0)


def test_fused_false_runs_a_single_frame_stage_by_stage_with_the_same_answers(bundle):
    fused = nd.ProgressiveRuntime(bundle, plan="onnxruntime")
    plain = nd.ProgressiveRuntime(bundle, plan="onnxruntime", fused=False)
    assert fused._fused is not None and plain._fused is None
    x = np.random.default_rng(9).standard_normal((6, 3, 32, 32)).astype(np.float32)
    for i in range(x.shape[0]):
        a, b = fused(x[i:i + 1], thresholds=[0.5, 0.5]), plain(x[i:i + 1], thresholds=[0.5, 0.5])
        np.testing.assert_allclose(a.logits, b.logits, atol=1e-5, rtol=0)
        assert a.exit_index.tolist() == b.exit_index.tolist() and a.answer_index.tolist() == b.answer_index.tolist()


def _branches(graph):
    import onnx

    return [a.g for node in graph.node for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


@pytest.mark.parametrize("active", [None, [0], [1]])
def test_the_fused_graph_is_a_flat_chain_holding_each_weight_once_in_its_block(bundle, active):
    # Nested branches made onnxruntime hold a deep exit set's weights about 20 times (each If's
    # attribute carried every deeper weight): no branch may hold another If, and the graph's
    # weights are exactly the stages' and kept heads' weights, each once.
    import onnx

    files = {(o.kind, o.extra.get("stage", o.extra.get("exit"))): o for o in bundle.spec.onnx
             if o.kind in ("stage", "exit") and o.exit_set == "progressive"}
    n = len(bundle.spec.exit_set("exits").names)
    stages = [bundle.file(files[("stage", k)].file) for k in range(n)]
    heads = [bundle.file(files[("exit", k)].file) for k in range(n - 1)]
    path = fused_exits_path(bundle, "exits", "max_prob", "final", stages, heads,
                            [int(files[("stage", k)].extra.get("tap_output") or 0) for k in range(n - 1)], active)
    graph = onnx.load(str(path)).graph
    branches = _branches(graph)
    kept = list(range(n - 1)) if active is None else active
    assert len(branches) == 2 * len(kept)  # one If (skip, run) per block after the first
    assert not any(_branches(b) for b in branches)
    weights = sorted(t.raw_data or t.SerializeToString() for g in [graph, *branches] for t in g.initializer
                     if len(t.dims) >= 2)  # the conv and linear weights, not the graph's small constants
    want = sorted(t.raw_data or t.SerializeToString() for f in stages + [heads[k] for k in kept]
                  for t in onnx.load(str(f)).graph.initializer if len(t.dims) >= 2)
    assert weights == want
