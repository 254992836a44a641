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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
_F32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class QuantizedTensor:
    """One ISQuant-quantised tensor: integer codes plus the side information to undo them.

    Attributes:
        q: Integer codes in ``[0, 2^bits - 1]``, same shape as the quantised tensor; ``uint8``
            for ``bits <= 8`` and ``int32`` otherwise (torch has no general-purpose ``uint16``).
        lo: Per-sample minimum, float32, shape ``(N,)``; shape ``()`` for a tensor-wide range.
        scale: ``(2^bits - 1) / (max - min)`` per sample, float32, same shape as ``lo``. A scale
            of 0 marks a constant sample: every code is 0 and :func:`dequantize` returns ``lo``
            exactly.
        bits: Bitwidth, 1..16.
    """

    q: torch.Tensor
    lo: torch.Tensor
    scale: torch.Tensor
    bits: int

    @property
    def per_sample(self) -> bool:
        """Whether ``lo`` and ``scale`` hold one value per sample (dim 0) of ``q``."""
        return self.lo.dim() == 1


def check_bits(bits: object, name: str = "bits") -> int:
    """Return ``bits`` if it is an int in ``MIN_BITS..MAX_BITS``, else raise :class:`CodecError`.

    Example:
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


def code_dtype(bits: int) -> torch.dtype:
    """The dtype of the integer codes for ``bits``: ``uint8`` up to 8 bits, else ``int32``."""
    return torch.uint8 if check_bits(bits) <= 8 else torch.int32


def _as_float32(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}.")
    if x.is_complex():
        raise CodecError(f"`{name}` must be a real tensor, got dtype {x.dtype}.")
    # float64 values beyond float32 turn into inf here and are rejected by the finiteness check
    return x.detach().to(torch.float32)


def _reject_non_finite(lo: torch.Tensor, hi: torch.Tensor, x: torch.Tensor, name: str) -> None:
    # min/max propagate NaN and surface Inf, so checking the two reductions finds any non-finite
    # element without a separate full pass over the data on the happy path.
    if lo.numel() and not bool(torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise CodecError(
            f"`{name}` contains NaN or Inf ({bad} non-finite of {x.numel()} elements, or values "
            "beyond the float32 range); quantisation needs finite values."
            " HINT: check the model for overflow before the split point."
        )


def _scale_for(lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    # The range in float64: max - min of two finite float32 values can overflow float32.
    rng = hi.double() - lo.double()
    scale = torch.where(rng > 0, (2**bits - 1) / rng.clamp_min(1e-300), torch.zeros_like(rng))
    # A range below (2^b - 1) / 3.4e38 (only possible among values < 1e-33) would give an inf
    # scale; clamping keeps it finite at the cost of a resolution of ~3e-39, i.e. below float32's
    # normal range anyway.
    return scale.clamp(max=_F32_MAX).to(torch.float32)


def _broadcast(v: torch.Tensor, ndim: int) -> torch.Tensor:
    return v.reshape(v.shape + (1,) * (ndim - v.dim()))


def _codes(x: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    lo_b, scale_b = _broadcast(lo, x.dim()), _broadcast(scale, x.dim())
    rng = (2**bits - 1) / scale.double().clamp_min(1e-300)
    if scale.numel() and float(rng.max()) > _F32_MAX / 2:
        # x - lo would overflow float32 for ranges near the float32 limit: do that rare case in
        # float64. The common case stays float32, which is what makes packing fast.
        t = (x.double() - lo_b.double()) * scale_b.double()
    else:
        t = x - lo_b
        t.mul_(scale_b)
    # Clamp: float rounding can push the maximum a hair past 2^b - 1, and the fixed-range baseline
    # clamps out-of-range values by design.
    return t.round_().clamp_(0, 2**bits - 1).to(code_dtype(bits))


def isquant(x: torch.Tensor, bits: int, per_sample: bool = True) -> QuantizedTensor:
    """Quantise ``x`` to ``bits`` with a range taken from each input sample (DynO ISQuant).

    Args:
        x: Real tensor; dim 0 is the sample dimension when ``per_sample`` is true. Computed in
            float32 (float64 input is cast first).
        bits: Bitwidth, 1..16.
        per_sample: One ``(lo, scale)`` per sample along dim 0 (the method's default); ``False``
            uses a single range for the whole tensor.

    Returns:
        The codes and side information; :func:`dequantize` inverts it within
        ``(max - min) / (2^bits - 1) / 2`` per element.

    Raises:
        CodecError: If ``bits`` is out of range, ``x`` holds NaN/Inf or values beyond float32, or
            ``per_sample`` is requested for a 0-d tensor.

    Example:
        >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
        >>> qt = isquant(x, bits=2)
        >>> qt.q.tolist(), qt.lo.tolist(), qt.scale.tolist()
        ([[0, 1, 2, 3], [0, 0, 0, 0]], [0.0, 5.0], [1.0, 0.0])
        >>> dequantize(qt).tolist()
        [[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]]
    """
    bits = check_bits(bits)
    x = _as_float32(x)
    if per_sample:
        if x.dim() == 0:
            raise CodecError(
                "`per_sample=True` needs a sample dimension (dim 0), got a 0-d tensor."
                " HINT: pass per_sample=False for scalars."
            )
        if x.numel() == 0:
            # samples with no elements: nothing to quantise, a constant-zero range
            lo = torch.zeros(x.shape[0], dtype=torch.float32)
            hi = lo
        else:
            flat = x.reshape(x.shape[0], -1)
            # amin + amax: ~20x faster than torch.aminmax(dim=1) on one core (torch 2.x), and
            # both propagate NaN like aminmax
            lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    elif x.numel() == 0:
        lo = hi = torch.zeros((), dtype=torch.float32)
    else:
        lo, hi = torch.aminmax(x)
    _reject_non_finite(lo, hi, x, "x")
    scale = _scale_for(lo, hi, bits)
    return QuantizedTensor(q=_codes(x, lo, scale, bits), lo=lo.clone(), scale=scale, bits=bits)


def dequantize(qt: QuantizedTensor) -> torch.Tensor:
    """Map codes back to float32 values: ``lo + q / scale`` (``lo`` where ``scale == 0``).

    Args:
        qt: Output of :func:`isquant`, :func:`fixed_quantize` or a decoded frame.

    Returns:
        A float32 tensor of ``qt.q``'s shape.

    Example:
        >>> x = torch.tensor([[1.0, 2.0, 3.0]])
        >>> err = (dequantize(isquant(x, bits=8)) - x).abs().max()
        >>> bool(err <= (3.0 - 1.0) / 255 / 2)
        True
    """
    check_bits(qt.bits, "qt.bits")
    nd = qt.q.dim()
    lo = _broadcast(qt.lo.to(torch.float32), nd)
    scale = qt.scale.to(torch.float64)
    # step = 1 / scale in float64: for scale ~1e-38 it exceeds float32 and would turn into inf
    step64 = torch.where(scale > 0, 1.0 / scale.clamp_min(1e-300), torch.zeros_like(scale))
    if step64.numel() and float(step64.max()) * (2**qt.bits - 1) > _F32_MAX / 2:
        out = _broadcast(qt.lo.double(), nd) + qt.q.double() * _broadcast(step64, nd)
        # values were finite float32 on the way in; rounding must not make them inf on the way out
        return out.clamp(-_F32_MAX, _F32_MAX).to(torch.float32)
    out = qt.q.to(torch.float32)
    out.mul_(_broadcast(step64.to(torch.float32), nd))
    return out.add_(lo)


def fake_quantize(x: torch.Tensor, bits: int | None, per_sample: bool = True) -> torch.Tensor:
    """Quantise and dequantise ``x`` in one go, to simulate a lossy split in float code.

    Args:
        x: Real tensor.
        bits: Bitwidth 1..16, or ``None``/``32`` for lossless float passthrough.
        per_sample: See :func:`isquant`.

    Returns:
        ``x`` itself when ``bits`` is ``None`` or 32; otherwise ``dequantize(isquant(x, bits))``
        cast back to ``x``'s dtype.

    Raises:
        CodecError: As :func:`isquant`.

    Example:
        >>> x = torch.tensor([[0.0, 0.4, 1.0]])
        >>> fake_quantize(x, 1)
        tensor([[0., 0., 1.]])
        >>> fake_quantize(x, None) is x
        True
    """
    if bits is None or (bits == 32 and not isinstance(bits, bool)):
        return x
    return dequantize(isquant(x, bits, per_sample=per_sample)).to(x.dtype)


def fixed_quantize(x: torch.Tensor, bits: int, lo: float, hi: float) -> QuantizedTensor:
    """Quantise with one range fixed offline (SPINN-style baseline); values outside are clamped.

    Args:
        x: Real tensor.
        bits: Bitwidth, 1..16.
        lo: Calibrated minimum.
        hi: Calibrated maximum, ``> lo``.

    Returns:
        A :class:`QuantizedTensor` with scalar (shape ``()``) ``lo`` and ``scale``.

    Raises:
        CodecError: If ``bits`` is out of range, ``lo``/``hi`` are not finite with ``lo < hi``,
            or ``x`` holds NaN/Inf.

    Example:
        >>> qt = fixed_quantize(torch.tensor([-1.0, 0.5, 9.0]), bits=1, lo=0.0, hi=1.0)
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
    x = _as_float32(x)
    if x.numel():
        mn, mx = torch.aminmax(x)
        _reject_non_finite(mn, mx, x, "x")
    lo_t = torch.tensor(lo_f, dtype=torch.float32)
    scale = _scale_for(lo_t, torch.tensor(hi_f, dtype=torch.float32), bits)
    return QuantizedTensor(q=_codes(x, lo_t, scale, bits), lo=lo_t, scale=scale, bits=bits)
