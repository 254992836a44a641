"""ISQuant: DESIGN invariant 4 (error bound, exact float path), array types and input validation."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nestflex.deploy.codec import (
    CodecError,
    QuantizedTensor,
    dequantize,
    fake_quantize,
    fixed_quantize,
    isquant,
)
from nestflex.errors import NestflexError

EPS32 = float(np.finfo(np.float32).eps)

# Finite float32 values away from the subnormal range: below ~1e-30 the per-sample scale can
# exceed float32 (documented in isquant.py) and the bound only holds up to ~3e-39 absolute.
_elem = st.one_of(
    st.just(0.0),
    st.floats(min_value=2.0**-66, max_value=2.0**100, width=32),
    st.floats(min_value=-(2.0**100), max_value=-(2.0**-66), width=32),
)
_shape = st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6))
_tensors = _shape.flatmap(lambda s: arrays(np.float32, s, elements=_elem)).map(torch.from_numpy)


def _bound(x: np.ndarray, bits: int, per_sample: bool) -> np.ndarray:
    """Invariant 4's bound per element, plus float32 rounding slack (a few ulps of the data)."""
    x64 = np.asarray(x, dtype=np.float64)
    flat = x64.reshape(x64.shape[0], -1) if per_sample else x64.reshape(1, -1)
    lo, hi = flat.min(axis=1), flat.max(axis=1)
    mag = np.maximum(np.abs(lo), np.abs(hi))
    b = (hi - lo) / (2**bits - 1) / 2 * (1 + 1e-5) + 4 * EPS32 * mag + 1e-37
    return b.reshape((-1,) + (1,) * (x64.ndim - 1)) if per_sample else b.reshape(())


def _numpy(v) -> np.ndarray:
    return v.numpy() if isinstance(v, torch.Tensor) else v


@settings(max_examples=150, deadline=None)
@given(x=_tensors, bits=st.integers(1, 16), per_sample=st.booleans(), as_numpy=st.booleans())
def test_error_per_element_within_invariant_bound(x, bits, per_sample, as_numpy):
    x = x.numpy() if as_numpy else x
    array = np.ndarray if as_numpy else torch.Tensor
    qt = isquant(x, bits, per_sample=per_sample)
    assert all(isinstance(v, array) for v in (qt.q, qt.lo, qt.scale))
    q, lo, scale = _numpy(qt.q), _numpy(qt.lo), _numpy(qt.scale)
    assert q.shape == x.shape
    assert q.dtype == (np.uint8 if bits <= 8 else np.int32)
    assert int(q.min()) >= 0 and int(q.max()) <= 2**bits - 1
    assert lo.shape == ((x.shape[0],) if per_sample else ())
    assert lo.dtype == scale.dtype == np.float32
    out = dequantize(qt)
    assert isinstance(out, array)
    err = np.abs(_numpy(out).astype(np.float64) - _numpy(x).astype(np.float64))
    assert bool((err <= _bound(_numpy(x), bits, per_sample)).all())


@settings(max_examples=100, deadline=None)
@given(x=_tensors, bits=st.integers(1, 16), per_sample=st.booleans())
def test_numpy_and_torch_inputs_give_the_same_bits(x, bits, per_sample):
    a, t = isquant(x.numpy(), bits, per_sample=per_sample), isquant(x, bits, per_sample=per_sample)
    for f in ("q", "lo", "scale"):
        assert getattr(a, f).tobytes() == getattr(t, f).numpy().tobytes()
    assert dequantize(a).tobytes() == dequantize(t).numpy().tobytes()
    assert fake_quantize(x.numpy(), bits).tobytes() == fake_quantize(x, bits).numpy().tobytes()


def test_numpy_in_numpy_out_torch_in_torch_out():
    x = np.array([[0.0, 1.0, 2.0], [4.0, 4.0, 5.0]], dtype=np.float32)
    t = torch.from_numpy(x)
    for per_sample in (True, False):
        qa, qt = isquant(x, 4, per_sample=per_sample), isquant(t, 4, per_sample=per_sample)
        assert all(isinstance(getattr(qa, f), np.ndarray) for f in ("q", "lo", "scale"))
        assert all(isinstance(getattr(qt, f), torch.Tensor) for f in ("q", "lo", "scale"))
        # shapes survive the conversion, 0-d tensor-wide ranges included
        assert qt.lo.shape == qt.scale.shape == qa.lo.shape == ((2,) if per_sample else ())
        assert qt.per_sample == qa.per_sample == per_sample
        assert isinstance(dequantize(qa), np.ndarray) and isinstance(dequantize(qt), torch.Tensor)
    assert isinstance(fake_quantize(x, 4), np.ndarray) and isinstance(fake_quantize(t, 4), torch.Tensor)
    fa, ft = fixed_quantize(x, 4, 0.0, 5.0), fixed_quantize(t, 4, 0.0, 5.0)
    assert isinstance(fa.q, np.ndarray) and isinstance(ft.q, torch.Tensor) and ft.lo.shape == ()
    assert torch.equal(dequantize(ft), torch.from_numpy(dequantize(fa)))
    # a tensor that needs a gradient is read through detach, as before
    assert isinstance(fake_quantize(t.clone().requires_grad_(), 4), torch.Tensor)


@settings(max_examples=60, deadline=None)
@given(x=_tensors)
def test_float_path_is_exact(x):
    assert fake_quantize(x, None) is x
    assert fake_quantize(x, 32) is x
    a = x.numpy()
    assert fake_quantize(a, None) is a and fake_quantize(a, 32) is a


@settings(max_examples=60, deadline=None)
@given(value=_elem, bits=st.integers(1, 16), n=st.integers(1, 4))
def test_constant_samples_come_back_exactly(value, bits, n):
    x = torch.full((n, 3, 2), value, dtype=torch.float32)
    qt = isquant(x, bits)
    assert bool((qt.scale == 0).all()) and bool((qt.q == 0).all())
    assert torch.equal(dequantize(qt), x)


def test_constant_sample_next_to_a_varying_one():
    x = torch.tensor([[2.5, 2.5], [0.0, 1.0]])
    assert torch.equal(dequantize(isquant(x, 4)), x)


def test_range_is_per_sample():
    # a large-range sample must not coarsen a small-range one (the point of ISQuant over SPINN)
    x = torch.tensor([[0.0, 0.01, 0.02, 0.03], [0.0, 100.0, 200.0, 300.0]])
    out = dequantize(isquant(x, 2))
    assert torch.allclose(out[0], x[0], atol=1e-7)
    coarse = dequantize(isquant(x, 2, per_sample=False))
    assert not torch.allclose(coarse[0], x[0], atol=1e-3)


def test_rounds_to_nearest():
    qt = isquant(torch.tensor([[0.0, 0.24, 0.26, 0.74, 0.76, 1.0]]), 2)
    assert qt.q.tolist() == [[0, 1, 1, 2, 2, 3]]


def test_extreme_float32_range_does_not_overflow():
    big = float(np.finfo(np.float32).max)
    x = np.array([[-big, 0.0, big]], dtype=np.float32)
    out = dequantize(isquant(x, 8))
    assert bool(np.isfinite(out).all())
    assert bool((np.abs(out.astype(np.float64) - x.astype(np.float64)) <= _bound(x, 8, True)).all())


def test_float64_and_half_inputs():
    x = torch.linspace(-1, 1, 17, dtype=torch.float64).reshape(1, 17)
    assert fake_quantize(x, 8).dtype == torch.float64
    assert fake_quantize(x.half(), 8).dtype == torch.float16
    assert fake_quantize(x.bfloat16(), 8).dtype == torch.bfloat16
    assert dequantize(isquant(x, 8)).dtype == torch.float32
    a = x.numpy()
    assert fake_quantize(a, 8).dtype == np.float64
    assert fake_quantize(a.astype(np.float16), 8).dtype == np.float16
    assert dequantize(isquant(a, 8)).dtype == np.float32
    assert fake_quantize([[0.0, 0.5, 1.0]], 8).dtype == np.float64  # an array-like: numpy's dtype for it


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("per_sample", [True, False])
def test_non_finite_rejected(bad, per_sample):
    x = torch.tensor([[0.0, 1.0], [2.0, bad]])
    with pytest.raises(CodecError, match=r"`x` contains NaN or Inf \(1 non-finite of 4 elements"):
        isquant(x, 8, per_sample=per_sample)
    with pytest.raises(CodecError, match="NaN or Inf"):
        fake_quantize(x, 8, per_sample=per_sample)
    with pytest.raises(CodecError, match="NaN or Inf"):
        fixed_quantize(x, 8, 0.0, 1.0)


def test_float64_beyond_float32_rejected():
    with pytest.raises(CodecError, match="beyond the float32 range"):
        isquant(torch.tensor([[1e300, 0.0]], dtype=torch.float64), 8)


@pytest.mark.parametrize("bits", [0, 17, 32, -1, True, 4.0, "8", None])
def test_bits_out_of_range(bits):
    with pytest.raises(CodecError, match=r"`bits` must be an int in 1\.\.16, got "):
        isquant(torch.zeros(1, 2), bits)
    with pytest.raises(CodecError, match=r"`bits` must be an int in 1\.\.16"):
        fixed_quantize(torch.zeros(1, 2), bits, 0.0, 1.0)


@pytest.mark.parametrize("bits", [0, 17, 33])
def test_fake_quantize_bits_out_of_range(bits):
    with pytest.raises(CodecError, match=rf"`bits` must be an int in 1\.\.16, got {bits}\."):
        fake_quantize(torch.zeros(1, 2), bits)


def test_codec_error_is_nestflex_and_value_error():
    with pytest.raises(NestflexError):
        isquant(torch.zeros(1), 0)
    with pytest.raises(ValueError):
        isquant(torch.zeros(1), 0)


def test_array_likes_and_what_is_not_an_array():
    qt = isquant([[1.0, 2.0]], 8)
    assert isinstance(qt.q, np.ndarray) and qt.q.tolist() == [[0, 255]]
    assert isquant(np.array([[1, 2]], np.int64), 8).q.tolist() == [[0, 255]]  # integers are real
    with pytest.raises(CodecError, match=r"`x` must be a numpy array, a torch tensor or array-like, got list"):
        isquant([[1.0], [1.0, 2.0]], 8)
    with pytest.raises(CodecError, match=r"`x` must be a real array, got dtype <U3\."):
        isquant(["abc"], 8)
    with pytest.raises(CodecError, match=r"`x` must be a real array, got dtype object\."):
        fixed_quantize(np.array([None]), 8, 0.0, 1.0)


def test_complex_rejected():
    with pytest.raises(CodecError, match=r"`x` must be a real array, got dtype torch\.complex64\."):
        isquant(torch.zeros(2, 2, dtype=torch.complex64), 8)
    with pytest.raises(CodecError, match=r"`x` must be a real array, got dtype complex128\."):
        fake_quantize(np.zeros((2, 2), np.complex128), 8)


def test_zero_dim():
    with pytest.raises(CodecError, match=r"`per_sample=True` needs a sample dimension \(dim 0\)"):
        isquant(torch.tensor(3.0), 8)
    qt = isquant(torch.tensor(3.0), 8, per_sample=False)
    assert qt.q.shape == () and torch.equal(dequantize(qt), torch.tensor(3.0))


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0), (3, 0, 4)])
@pytest.mark.parametrize("per_sample", [True, False])
def test_empty(shape, per_sample):
    x = torch.zeros(shape)
    qt = isquant(x, 4, per_sample=per_sample)
    assert qt.q.shape == x.shape
    assert qt.lo.shape == ((shape[0],) if per_sample else ())
    assert dequantize(qt).shape == x.shape


def test_fixed_quantize_clamps_and_bounds():
    x = torch.linspace(-2, 2, 101)
    qt = fixed_quantize(x, 6, -1.0, 1.0)
    assert qt.lo.shape == () and qt.scale.shape == ()
    out = dequantize(qt)
    inside = x.abs() <= 1
    assert bool(((out - x).abs()[inside] <= 2 / 63 / 2 + 1e-6).all())
    assert torch.equal(out[~inside].abs(), torch.ones(int((~inside).sum())))


@pytest.mark.parametrize(("lo", "hi"), [(1.0, 1.0), (2.0, 1.0), (0.0, math.inf), (math.nan, 1.0)])
def test_fixed_quantize_bad_range(lo, hi):
    with pytest.raises(CodecError, match=r"`lo` and `hi` must be finite float32 values with lo < hi"):
        fixed_quantize(torch.zeros(3), 8, lo, hi)


def test_quantized_tensor_is_frozen():
    qt = isquant(torch.zeros(1, 2), 8)
    assert isinstance(qt, QuantizedTensor) and qt.per_sample
    with pytest.raises(AttributeError):
        qt.bits = 4
