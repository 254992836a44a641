"""ISQuant: input-specific linear quantisation of the tensors that cross a split (DynO, METHODS §4).

For each input sample ``i`` (dim 0) of a dependency tensor ``D`` and a bitwidth ``b``::

    lo_i    = min D_i
    scale_i = (2^b - 1) / (max D_i - min D_i)
    q       = round((d - lo_i) * scale_i)            # integer code in [0, 2^b - 1]
    d'      = lo_i + q / scale_i                     # dequantised value

The range is taken from the sample itself at run time (no offline calibration, no retraining), so
one outlier image never clips another image's activations. Round-to-nearest gives the bound of
DESIGN invariant 4: ``|d - d'| <= (max - min) / (2^b - 1) / 2`` per element, up to float32
rounding (a few ulps of the largest magnitude in the sample).

:func:`fixed_quantize` is the SPINN-style baseline: one range calibrated offline and clamping
everything outside it; it exists so benchmarks can show what the per-sample range buys.

Everything here computes on numpy, so the device needs no torch, and follows the runtime's array
rule (:mod:`nestflex.deploy._arrays`): numpy arrays and array-likes in, numpy out; a torch tensor
in, torch tensors out (on the tensor's device), so the training side passes tensors unchanged.
The arithmetic is the same float32/float64 sequence, with the same round-half-to-even, as the
torch implementation it replaced, so codes, ranges and dequantised values are bit-identical
(``tests/deploy/test_codec_golden.py``). One freedom: when a sample's minimum is a zero present
with both signs, ``lo`` may be either zero (torch's own ``amin`` and ``aminmax`` already picked
differently, and SIMD reductions pick by lane order); codes and dequantised values are the same
either way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from nestflex.deploy._arrays import is_torch, like, to_numpy
from nestflex.deploy.codec.errors import CodecError

__all__ = [
    "MIN_BITS",
    "MAX_BITS",
    "QuantizedTensor",
    "isquant",
    "dequantize",
    "fake_quantize",
    "fixed_quantize",
    "code_dtype",
    "check_bits",
]

MIN_BITS = 1
MAX_BITS = 16

# Largest finite float32. Side information (lo, scale) is stored as float32 in frames, so the
# quantiser works in float32 and refuses values that float32 cannot hold.
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class QuantizedTensor:
    """One ISQuant-quantised tensor: integer codes plus the side information to undo them.

    The fields are numpy arrays, or torch tensors when the quantised input was a torch tensor
    (so ``dequantize(isquant(t, b))`` gives a tensor back for a tensor).

    Attributes:
        q: Integer codes in ``[0, 2^bits - 1]``, same shape as the quantised tensor; ``uint8``
            for ``bits <= 8`` and ``int32`` otherwise (the types of the torch implementation:
            torch had no general-purpose ``uint16``).
        lo: Per-sample minimum, float32, shape ``(N,)``; shape ``()`` for a tensor-wide range.
        scale: ``(2^bits - 1) / (max - min)`` per sample, float32, same shape as ``lo``. A scale
            of 0 marks a constant sample: every code is 0 and :func:`dequantize` returns ``lo``
            exactly.
        bits: Bitwidth, 1..16.
    """

    q: np.ndarray
    lo: np.ndarray
    scale: np.ndarray
    bits: int

    @property
    def per_sample(self) -> bool:
        """Whether ``lo`` and ``scale`` hold one value per sample (dim 0) of ``q``."""
        return len(self.lo.shape) == 1


def check_bits(bits: object, name: str = "bits") -> int:
    """Return ``bits`` if it is an int in ``MIN_BITS..MAX_BITS``, else raise :class:`CodecError`.

    Examples:
        >>> check_bits(4)
        4
    """
    # bool is an int subclass; ``bits=True`` is a bug in the caller, not a 1-bit request
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise CodecError(
            f"`{name}` must be an int in {MIN_BITS}..{MAX_BITS}, got {bits!r}."
            " HINT: use bits=None (or 32) in `fake_quantize`/`encode` for lossless float transfer."
        )
    return bits


def code_dtype(bits: int) -> np.dtype:
    """The dtype of the integer codes for ``bits``: ``uint8`` up to 8 bits, else ``int32``."""
    return np.dtype(np.uint8 if check_bits(bits) <= 8 else np.int32)


def is_bfloat16(x: Any) -> bool:
    """Whether ``x`` is a bfloat16 torch tensor (a dtype numpy lacks), decided without importing torch."""
    return is_torch(x) and x.dtype is sys.modules["torch"].bfloat16


def numpy_view(x: Any, name: str = "x") -> np.ndarray:
    """``x`` as a numpy array (no copy where possible); a bfloat16 tensor comes widened to float32.

    numpy has no bfloat16. The widening (:func:`~nestflex.deploy._arrays.to_numpy`'s) is exact: a
    bfloat16 is the upper half of a float32, so quantising the widened values is quantising the
    original ones, and the frame recovers the original bits from it.
    """
    try:
        return to_numpy(x)
    except (TypeError, ValueError) as e:  # ragged lists, tensors numpy cannot view
        raise CodecError(f"`{name}` must be a numpy array, a torch tensor or array-like, got "
                         f"{type(x).__name__} ({e}).") from None


def real_array(x: Any, name: str = "x") -> np.ndarray:
    """:func:`numpy_view` of ``x``, refusing dtypes that are not real numbers."""
    a = numpy_view(x, name)
    if a.dtype.kind not in "biuf":
        # report the caller's own dtype: torch.complex64 for a tensor, complex64 for an array
        raise CodecError(f"`{name}` must be a real array, got dtype {getattr(x, 'dtype', a.dtype)}.")
    return a


def _as_float32(x: Any, name: str = "x") -> np.ndarray:
    a = real_array(x, name)
    # float64 values beyond float32 turn into inf here and are rejected by the finiteness check
    with np.errstate(over="ignore"):
        return a.astype(np.float32, copy=False)


def _reject_non_finite(lo: np.ndarray, hi: np.ndarray, x: np.ndarray, name: str) -> None:
    # min/max propagate NaN and surface Inf, so checking the two reductions finds any non-finite
    # element without a separate full pass over the data on the happy path.
    if lo.size and not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        bad = int((~np.isfinite(x)).sum())
        raise CodecError(
            f"`{name}` contains NaN or Inf ({bad} non-finite of {x.size} elements, or values "
            "beyond the float32 range); quantisation needs finite values."
            " HINT: check the model for overflow before the split point."
        )


def _scale_for(lo: np.ndarray, hi: np.ndarray, bits: int) -> np.ndarray:
    # The range in float64: max - min of two finite float32 values can overflow float32.
    rng = hi.astype(np.float64) - lo.astype(np.float64)
    scale = np.where(rng > 0, (2**bits - 1) / np.maximum(rng, 1e-300), 0.0)
    # A range below (2^b - 1) / 3.4e38 (only possible among values < 1e-33) would give an inf
    # scale; clamping keeps it finite at the cost of a resolution of ~3e-39, i.e. below float32's
    # normal range anyway.
    return np.asarray(np.minimum(scale, _F32_MAX), dtype=np.float32)


def _broadcast(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape(v.shape + (1,) * (ndim - v.ndim))


def _codes(x: np.ndarray, lo: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    lo_b, scale_b = _broadcast(lo, x.ndim), _broadcast(scale, x.ndim)
    rng = (2**bits - 1) / np.maximum(scale.astype(np.float64), 1e-300)
    if scale.size and float(rng.max()) > _F32_MAX / 2:
        # x - lo would overflow float32 for ranges near the float32 limit: do that rare case in
        # float64. The common case stays float32, which is what makes packing fast.
        t = (x.astype(np.float64) - lo_b.astype(np.float64)) * scale_b.astype(np.float64)
    else:
        # every operand float32, so no numpy version promotes: the bits of the float32 path
        t = np.subtract(x, lo_b, dtype=np.float32)
        t *= scale_b
    # Clamp: float rounding can push the maximum a hair past 2^b - 1, and the fixed-range baseline
    # clamps out-of-range values by design. rint rounds half to even, like torch.round.
    t = np.asarray(t)
    np.rint(t, out=t)
    np.clip(t, 0, 2**bits - 1, out=t)
    return t.astype(code_dtype(bits))


def _min_max(x: np.ndarray, per_sample: bool) -> tuple[np.ndarray, np.ndarray]:
    if per_sample:
        if x.size == 0:
            # samples with no elements: nothing to quantise, a constant-zero range
            lo = np.zeros(x.shape[0], dtype=np.float32)
            return lo, lo
        flat = x.reshape(x.shape[0], -1)
        return flat.min(axis=1), flat.max(axis=1)  # both propagate NaN
    if x.size == 0:
        lo = np.zeros((), dtype=np.float32)
        return lo, lo
    return np.asarray(x.min()), np.asarray(x.max())


def isquant(x: ArrayLike, bits: int, per_sample: bool = True) -> QuantizedTensor:
    """Quantise ``x`` to ``bits`` with a range taken from each input sample (DynO ISQuant).

    Args:
        x: Real array (numpy, torch or array-like); dim 0 is the sample dimension when
            ``per_sample`` is true. Computed in float32 (float64 input is cast first).
        bits: Bitwidth, 1..16.
        per_sample: One ``(lo, scale)`` per sample along dim 0 (the method's default); ``False``
            uses a single range for the whole tensor.

    Returns:
        The codes and side information, numpy arrays (torch tensors for a tensor ``x``);
        :func:`dequantize` inverts it within ``(max - min) / (2^bits - 1) / 2`` per element.

    Raises:
        CodecError: If ``bits`` is out of range, ``x`` is not a real array, holds NaN/Inf or
            values beyond float32, or ``per_sample`` is requested for a 0-d tensor.

    Examples:
        >>> x = np.array([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
        >>> qt = isquant(x, bits=2)
        >>> qt.q.tolist(), qt.lo.tolist(), qt.scale.tolist()
        ([[0, 1, 2, 3], [0, 0, 0, 0]], [0.0, 5.0], [1.0, 0.0])
        >>> dequantize(qt).tolist()
        [[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]]
    """
    bits = check_bits(bits)
    a = _as_float32(x)
    if per_sample and a.ndim == 0:
        raise CodecError(
            "`per_sample=True` needs a sample dimension (dim 0), got a 0-d tensor."
            " HINT: pass per_sample=False for scalars."
        )
    lo, hi = _min_max(a, per_sample)
    _reject_non_finite(lo, hi, a, "x")
    scale = _scale_for(lo, hi, bits)
    q, lo, scale = like(x, (_codes(a, lo, scale, bits), lo, scale))
    return QuantizedTensor(q=q, lo=lo, scale=scale, bits=bits)


def dequantize(qt: QuantizedTensor) -> np.ndarray:
    """Map codes back to float32 values: ``lo + q / scale`` (``lo`` where ``scale == 0``).

    Args:
        qt: Output of :func:`isquant`, :func:`fixed_quantize` or a decoded frame.

    Returns:
        A float32 array of ``qt.q``'s shape; a torch tensor when ``qt.q`` is one.

    Examples:
        >>> x = np.array([[1.0, 2.0, 3.0]])
        >>> err = np.abs(dequantize(isquant(x, bits=8)) - x).max()
        >>> bool(err <= (3.0 - 1.0) / 255 / 2)
        True
    """
    check_bits(qt.bits, "qt.bits")
    q = to_numpy(qt.q)
    nd = q.ndim
    lo = to_numpy(qt.lo)
    scale = to_numpy(qt.scale).astype(np.float64)
    # step = 1 / scale in float64: for scale ~1e-38 it exceeds float32 and would turn into inf
    step64 = np.where(scale > 0, 1.0 / np.maximum(scale, 1e-300), 0.0)
    if step64.size and float(step64.max()) * (2**qt.bits - 1) > _F32_MAX / 2:
        out = _broadcast(lo.astype(np.float64), nd) + q.astype(np.float64) * _broadcast(step64, nd)
        # values were finite float32 on the way in; rounding must not make them inf on the way out
        out = np.clip(out, -_F32_MAX, _F32_MAX).astype(np.float32)
    else:
        out = q.astype(np.float32)
        out *= _broadcast(step64.astype(np.float32), nd)
        out += _broadcast(lo.astype(np.float32), nd)
    return like(qt.q, np.asarray(out))


def fake_quantize(x: ArrayLike, bits: int | None, per_sample: bool = True) -> np.ndarray:
    """Quantise and dequantise ``x`` in one go, to simulate a lossy split in float code.

    Args:
        x: Real array (numpy, torch or array-like).
        bits: Bitwidth 1..16, or ``None``/``32`` for lossless float passthrough.
        per_sample: See :func:`isquant`.

    Returns:
        ``x`` itself when ``bits`` is ``None`` or 32; otherwise ``dequantize(isquant(x, bits))``
        cast back to ``x``'s dtype (a tensor on ``x``'s device for a tensor ``x``).

    Raises:
        CodecError: As :func:`isquant`.

    Examples:
        >>> x = np.array([[0.0, 0.4, 1.0]], dtype=np.float32)
        >>> fake_quantize(x, 1)
        array([[0., 0., 1.]], dtype=float32)
        >>> fake_quantize(x, None) is x
        True
    """
    if bits is None or (bits == 32 and not isinstance(bits, bool)):
        return x
    out = dequantize(isquant(x, bits, per_sample=per_sample))
    if is_torch(out):
        return out.to(x.dtype)  # torch's own cast, e.g. to bfloat16, which numpy lacks
    return out.astype(x.dtype if isinstance(x, np.ndarray) else real_array(x).dtype, copy=False)


def fixed_quantize(x: ArrayLike, bits: int, lo: float, hi: float) -> QuantizedTensor:
    """Quantise with one range fixed offline (SPINN-style baseline); values outside are clamped.

    Args:
        x: Real array (numpy, torch or array-like).
        bits: Bitwidth, 1..16.
        lo: Calibrated minimum.
        hi: Calibrated maximum, ``> lo``.

    Returns:
        A :class:`QuantizedTensor` with scalar (shape ``()``) ``lo`` and ``scale``; torch fields
        for a tensor ``x``.

    Raises:
        CodecError: If ``bits`` is out of range, ``lo``/``hi`` are not finite with ``lo < hi``,
            or ``x`` is not a real array or holds NaN/Inf.

    Examples:
        >>> qt = fixed_quantize(np.array([-1.0, 0.5, 9.0]), bits=1, lo=0.0, hi=1.0)
        >>> qt.q.tolist(), dequantize(qt).tolist()
        ([0, 0, 1], [0.0, 0.0, 1.0])
    """
    bits = check_bits(bits)
    lo_f, hi_f = float(lo), float(hi)
    if not (abs(lo_f) <= _F32_MAX and abs(hi_f) <= _F32_MAX and lo_f < hi_f):
        raise CodecError(
            f"`lo` and `hi` must be finite float32 values with lo < hi, got lo={lo!r}, hi={hi!r}."
            " HINT: calibrate them as the min and max of the tensor on a calibration set."
        )
    a = _as_float32(x)
    if a.size:
        mn, mx = _min_max(a, per_sample=False)
        _reject_non_finite(mn, mx, a, "x")
    lo_a = np.array(lo_f, dtype=np.float32)
    scale = _scale_for(lo_a, np.array(hi_f, dtype=np.float32), bits)
    q, lo_a, scale = like(x, (_codes(a, lo_a, scale, bits), lo_a, scale))
    return QuantizedTensor(q=q, lo=lo_a, scale=scale, bits=bits)
