"""Both exit sets (SDN and FlexDNN; on the shared backbone and on their own) on the base install:
every exit, the batched and the per-sample early exit, against the torch training model."""

from __future__ import annotations

import numpy as np
import pytest

import nestflex.deploy as nd
from tests.light.conftest import assert_answers, assert_parity

SETS = ["exits", "flex_exits"]


@pytest.mark.parametrize("key", SETS)
def test_every_exit_matches_the_torch_reference(case, key):
    prog = nd.ProgressiveRuntime(case.bundle, exit_set=key)
    n = case.meta["exit_sets"][key]["num_exits"]
    assert prog.num_exits == n
    got = prog.all_exits(case.x)
    assert len(got) == n
    for k in range(n):
        assert_parity(got[k], case.ref(f"{key}.exit_{k}"), f"{case.name} {key} all_exits[{k}]")
        assert_parity(prog.exit_logits(case.x, k), case.ref(f"{key}.exit_{k}"), f"{case.name} {key} exit {k}")


@pytest.mark.parametrize("key", SETS)
def test_the_batched_early_exit_matches_under_every_policy(case, key):
    prog = nd.ProgressiveRuntime(case.bundle, exit_set=key)
    assert_answers(prog(case.x), case, key, "shipped", what=f"{case.name} {key} shipped policy (defaults)")
    for p in case.policies(key):
        got = prog(case.x, thresholds=p["thresholds"], fallback=p["fallback"])
        assert_answers(got, case, key, p["name"])


@pytest.mark.parametrize("key", SETS)
def test_one_frame_at_a_time_gives_the_batch_answers(case, key):
    """A single frame takes the fused one-call path where the set's confidence and fallback apply."""
    prog = nd.ProgressiveRuntime(case.bundle, exit_set=key)
    for p in case.policies(key):
        for i in range(case.x.shape[0]):
            got = prog(case.x[i:i + 1], thresholds=p["thresholds"], fallback=p["fallback"])
            assert_answers(got, case, key, p["name"], rows=slice(i, i + 1), what=f"{case.name} {key} {p['name']} frame {i}")


@pytest.mark.parametrize("key", SETS)
def test_sharing_the_capacity_runtime_gives_the_same_answers(case, key):
    rt = nd.CapacityRuntime(case.bundle, level=0)
    prog = nd.ProgressiveRuntime(case.bundle, rt, exit_set=key)
    if case.meta["exit_sets"][key]["backbone"] == "shared":
        assert rt.level == case.meta["levels"] - 1  # the heads sit on the largest level
    for p in case.policies(key):
        assert_answers(prog(case.x, thresholds=p["thresholds"], fallback=p["fallback"]), case, key, p["name"])


def test_the_references_exercise_every_exit(refs):
    """Guard on make_bundles.py: over its policies, every exit of every set answers some sample, and
    no confidence sits so close to a threshold that float32 noise could flip a decision."""
    for name in refs.meta:
        for key, ex in refs.meta[name]["exit_sets"].items():
            answered = np.concatenate([refs(name, f"{key}.ee.{p['name']}.answer_index") for p in ex["policies"]])
            assert set(answered.tolist()) == set(range(ex["num_exits"])), (name, key)
            assert min(p["margin"] for p in ex["policies"]) > 1e-5, (name, key)


def test_an_exit_set_the_bundle_lacks_is_explained(case):
    with pytest.raises(nd.BundleError, match=r"`exit_set` must be one of exits, flex_exits"):
        nd.ProgressiveRuntime(case.bundle, exit_set="nope")
