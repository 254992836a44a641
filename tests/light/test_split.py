"""Split inference in one process on the base install: the largest level's head and tail at every
split point, and SplitRuntime's head / tail / combine with the exits on both sides, through the
codec, against the torch training model."""

from __future__ import annotations

import numpy as np
import pytest

import nestflex.deploy as nd
from nestflex.deploy.codec import decode, encode
from tests.light.conftest import Case, assert_answers, assert_parity


def test_head_and_tail_of_every_split_point_give_the_largest_level(case):
    rt = nd.CapacityRuntime(case.bundle)
    top = case.ref(f"level_{case.meta['levels'] - 1}")
    for s in case.meta["splits"]:
        head, tail = rt.split(s["name"])
        sent = head(case.x)
        assert [list(t.shape[1:]) for t in sent][: len(s["tensors"])] == [shape for _, shape in s["tensors"]]
        for i in range(s["crossing"]):
            assert_parity(sent[i], case.ref(f"split.{s['name']}.crossing_{i}"), f"{case.name} {s['name']} crossing {i}")
        assert_parity(tail(*sent), top, f"{case.name} {s['name']} tail")


def _split_names(case) -> list[str]:
    return [nd.SERVER_ONLY, *(s["name"] for s in case.meta["splits"])]


def test_split_runtime_equals_the_early_exit_reference_at_every_split(case):
    """head -> codec frame (lossless) -> tail -> combine gives the unsplit early exit's answers."""
    for key in case.shared_sets():
        for name in _split_names(case):
            rt = nd.SplitRuntime(case.bundle, name, key)
            for p in case.policies(key):
                thr, fb = p["thresholds"], p["fallback"]
                head = rt.head(case.x, thr)
                rest = np.asarray(head.rest)
                tail = None
                if rest.size:
                    crossing = decode(encode(list(head.crossing), None))  # what the server receives
                    tail = rt.tail(crossing, thr, fallback=fb)
                got = rt.combine(head, tail, fallback=fb)
                assert_answers(got, case, key, p["name"], what=f"{case.name} {key} split {name} {p['name']}")


def test_the_backbone_alone_split_anywhere_gives_the_largest_level(case):
    top = case.ref(f"level_{case.meta['levels'] - 1}")
    for name in _split_names(case):
        rt = nd.SplitRuntime(case.bundle, name, None)
        assert rt.num_exits == 1
        assert_parity(rt(case.x).logits, top, f"{case.name} split {name} backbone only")


def test_an_exit_set_on_its_own_backbone_cannot_be_split(refs):
    case = Case("derived", refs)  # its FlexDNN exits have their own backbone
    assert case.meta["exit_sets"]["flex_exits"]["backbone"] == "own"
    with pytest.raises(nd.BundleError, match="has its own backbone"):
        nd.SplitRuntime(case.bundle, case.meta["splits"][0]["name"], "flex_exits")
