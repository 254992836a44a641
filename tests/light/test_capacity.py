"""Every level of the multi-capacity runtime on the base install, numpy in and out, against the
torch training model; switching builds nothing."""

from __future__ import annotations

import numpy as np
import pytest

import nestflex.deploy as nd
from tests.light.conftest import assert_parity


@pytest.mark.parametrize("plan", ["auto", None, "onnxruntime"])
def test_every_level_matches_the_torch_reference(case, plan):
    rt = nd.CapacityRuntime(case.bundle, level=0, plan=plan)
    x = case.x
    for k in [0, 2, 1, 2, 0, 1]:  # up and down, skipping levels
        rt.set_level(k)
        assert rt.level == k
        assert_parity(rt(x), case.ref(f"level_{k}"), f"{case.name} level {k} plan {plan}")


def test_one_sample_at_a_time_gives_the_batch_rows(case):
    rt = nd.CapacityRuntime(case.bundle)
    top = case.meta["levels"] - 1
    for i in range(case.x.shape[0]):
        assert_parity(rt(case.x[i:i + 1]), case.ref(f"level_{top}")[i:i + 1], f"{case.name} sample {i}")


def test_numpy_in_numpy_out(case):
    rt = nd.CapacityRuntime(case.bundle, level=1)
    out = rt(case.x.astype(np.float64))  # any float array: read as float32
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (case.x.shape[0], 10)


def test_switches_between_prepared_levels_build_no_session(case):
    rt = nd.CapacityRuntime(case.bundle, level=0)  # preload: every level prepared now
    levels = case.meta["levels"]
    for a in range(levels):
        for b in range(levels):
            if a != b:
                rt.set_level(a)
                report = rt.set_level(b)
                assert (report.from_level, report.to_level) == (a, b)
                assert report.page_in_bytes == 0, f"switch {a} -> {b} built something: {report}"


def test_misuse_is_explained(case):
    rt = nd.CapacityRuntime(case.bundle, level=1)
    with pytest.raises(nd.BundleError, match=r"`level` must be an int in \[0, 2\] \(the bundle's levels\), got 3"):
        rt.set_level(3)
    with pytest.raises(nd.BundleError, match=r"`x` must be a float array of shape \(N, 3, 32, 32\), got "
                                             r"float32 \(3, 32, 32\)"):
        rt(case.x[0])
