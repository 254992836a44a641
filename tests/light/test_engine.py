"""The device engine on the base install: two apps (one with FlexDNN exits, one levels only) served
on numpy frames, each answer equal to the torch reference of the configuration that ran it."""

from __future__ import annotations

import numpy as np
import pytest

import nestflex.deploy as nd
from tests.light.conftest import ATOL, Case


def _check(result, case, i: int, exit_key: str | None) -> None:
    logits = result.logits
    assert isinstance(logits, np.ndarray), f"{case.name} frame {i}: logits are a {type(logits).__name__}"
    assert result.prediction == int(np.argmax(logits))
    if result.exit is None:
        want = [case.ref(f"level_{result.level}")[i]]
    else:  # the answer is one of the exits that ran (the policy may fall back to an earlier one)
        assert exit_key is not None and result.level == case.meta["levels"] - 1
        want = [case.ref(f"{exit_key}.exit_{j}")[i] for j in range(result.exit + 1)]
    assert any(np.allclose(logits, w, rtol=0, atol=ATOL) for w in want), (
        f"{case.name} frame {i} (level {result.level}, exit {result.exit}): {logits} matches no reference")


@pytest.mark.parametrize("scheduler", ["greedy_total", "flexdnn"])
def test_two_apps_answer_as_the_reference(refs, scheduler):
    shipped, derived = Case("shipped", refs), Case("derived", refs)
    exits_used = 0
    with nd.Engine(scheduler) as engine:
        engine.add_app("shipped", shipped.path, fps=30, exit_set="flex_exits", profile_repeats=2)
        engine.add_app("derived", derived.bundle, fps=30, exit_set=None, profile_repeats=2)
        assert sorted(engine.apps) == ["derived", "shipped"]
        for i in range(shipped.x.shape[0]):
            a = engine.infer("shipped", shipped.x[i], tag=i, timeout=30)
            b = engine.infer("derived", derived.x[i][None], tag=i, timeout=30)  # (C, H, W) or (1, C, H, W)
            assert (a.tag, b.tag) == (i, i) and a.answered and b.answered
            _check(a, shipped, i, "flex_exits")
            _check(b, derived, i, None)
            exits_used += a.exit is not None
        stats = engine.stats()
    assert {n: s["answered"] for n, s in stats["apps"].items()} == {"shipped": 8, "derived": 8}
    if scheduler == "flexdnn":  # the largest level with its exits: the progressive path ran
        assert exits_used == 8


def test_a_bad_frame_names_the_app(refs):
    case = Case("derived", refs)
    with nd.Engine("greedy_total") as engine:
        engine.add_app("cam", case.path, exit_set=None, profile_repeats=1)
        with pytest.raises(nd.EngineError, match=r"app 'cam'"):
            engine.infer("cam", np.zeros((5, 32, 32), np.float32))
