"""SPINN's compression pay-off test: a pure function, checked against its formula."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nestflex.deploy.codec import (
    CodecError,
    CodecTiming,
    break_even_bandwidth,
    compression_pays_off,
    encode,
    measure_codec,
)

_pos = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@given(r=_pos, c=_pos, b=st.floats(min_value=1e-3, max_value=1e12), e=_pos, d=_pos)
def test_matches_formula_and_break_even(r, c, b, e, d):
    # reference: compare total times directly
    assert compression_pays_off(r, c, b, e, d) == (e + c / b + d < r / b) or math.isclose(
        e + c / b + d, r / b, rel_tol=1e-9
    )
    be = break_even_bandwidth(r, c, e, d)
    if r > c and e + d > 0 and not math.isclose(b, be, rel_tol=1e-6):
        assert compression_pays_off(r, c, b, e, d) == (b < be)


def test_examples():
    # 1 MB -> 100 kB in 3 ms: worth it on a 10 MB/s link, not on 10 GB/s; break-even 300 MB/s
    assert compression_pays_off(1_000_000, 100_000, 10e6, 0.002, 0.001)
    assert not compression_pays_off(1_000_000, 100_000, 10e9, 0.002, 0.001)
    assert break_even_bandwidth(1_000_000, 100_000, 0.002, 0.001) == pytest.approx(3e8)
    # compression that does not shrink never pays; free compression that shrinks always does
    assert not compression_pays_off(100, 100, 1.0, 0.0, 0.0)
    assert compression_pays_off(100, 50, math.inf, 0.0, 0.0) is False  # infinite link: nothing to save
    assert compression_pays_off(100, 50, 1e12, 0.0, 0.0)
    assert break_even_bandwidth(100, 200, 1.0, 1.0) == 0.0
    assert break_even_bandwidth(100, 50, 0.0, 0.0) == math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(raw_bytes=-1), r"`raw_bytes` must be a number >= 0 and finite, got -1\."),
        (dict(compressed_bytes=float("nan")), r"`compressed_bytes` must be a number >= 0 and finite, got nan\."),
        (dict(bandwidth_bytes_per_s=0), r"`bandwidth_bytes_per_s` must be a number > 0, got 0\."),
        (dict(encode_s=math.inf), r"`encode_s` must be a number >= 0 and finite, got inf\."),
        (dict(decode_s="1"), r"`decode_s` must be a number >= 0 and finite, got '1'\."),
        (dict(raw_bytes=True), r"`raw_bytes` must be a number >= 0 and finite, got True\."),
    ],
)
def test_arguments_validated(kwargs, message):
    args = dict(raw_bytes=100, compressed_bytes=10, bandwidth_bytes_per_s=1e6, encode_s=0.1, decode_s=0.1)
    args.update(kwargs)
    with pytest.raises(CodecError, match=message):
        compression_pays_off(**args)


def test_measure_codec():
    x = torch.relu(torch.randn(4, 8, 16, 16, generator=torch.Generator().manual_seed(0)))
    t = measure_codec(x, 4, "blosc_lz4", repeats=3)
    assert isinstance(t, CodecTiming)
    assert t.raw_bytes == len(encode([x], None, "raw"))
    assert t.compressed_bytes == len(encode([x], 4))
    assert t.encode_s > 0 and t.decode_s > 0 and t.ratio > 4
    assert t.pays_off(1e3) and not t.pays_off(1e15)
    assert measure_codec([x, x], None, "raw", repeats=1).ratio == pytest.approx(1.0)
    # the device holds numpy: the same frames from the same values
    a = measure_codec(x.numpy(), 4, "blosc_lz4", repeats=1)
    assert (a.raw_bytes, a.compressed_bytes) == (t.raw_bytes, t.compressed_bytes)
    assert measure_codec([x.numpy(), x], 4, repeats=1).compressed_bytes == len(encode([x, x], 4))
    with pytest.raises(CodecError, match=r"`repeats` must be an int >= 1, got 0\."):
        measure_codec(x, 4, repeats=0)
