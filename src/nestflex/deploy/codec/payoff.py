"""When does compressing a split tensor pay off? (SPINN's communication optimiser, METHODS §3.)

Sending ``R`` raw bytes over a link of bandwidth ``B`` takes ``R / B``. Compressing first takes
``t_enc + C / B + t_dec`` for ``C`` compressed bytes. The link latency is paid either way and
cancels. So compression pays off exactly when::

    t_enc + t_dec < (R - C) / B

i.e. when the bandwidth is below the break-even ``B* = (R - C) / (t_enc + t_dec)``. On a fast
LAN with a slow device the raw transfer can win; on Wi-Fi or LTE compression nearly always does.
The decision is a pure function so a scheduler can re-evaluate it whenever its bandwidth
estimate moves; :func:`measure_codec` supplies the timing inputs from a sample tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from nestflex.deploy._arrays import is_torch
from nestflex.deploy.codec.codecs import Codec
from nestflex.deploy.codec.errors import CodecError
from nestflex.deploy.timing import alternating_median_s

__all__ = ["CodecTiming", "compression_pays_off", "break_even_bandwidth", "measure_codec"]


def _nonneg(name: str, v: object, *, positive: bool = False, allow_inf: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
    ok = ok and (allow_inf or math.isfinite(v)) and (v > 0 if positive else v >= 0)
    if not ok:
        need = "> 0" if positive else ">= 0"
        raise CodecError(f"`{name}` must be a number {need}{'' if allow_inf else ' and finite'}, got {v!r}.")
    return float(v)


def compression_pays_off(
    raw_bytes: float,
    compressed_bytes: float,
    bandwidth_bytes_per_s: float,
    encode_s: float,
    decode_s: float,
) -> bool:
    """Whether ``encode + send compressed + decode`` beats sending raw: ``t_enc + t_dec < (R - C)/B``.

    Args:
        raw_bytes: Bytes sent without compression (``R``).
        compressed_bytes: Bytes sent with it, side information included (``C``).
        bandwidth_bytes_per_s: Link bandwidth ``B`` in bytes/s, ``> 0`` (``inf`` allowed).
        encode_s: Compression time on the sender, seconds.
        decode_s: Decompression time on the receiver, seconds.

    Returns:
        ``True`` if compressing is strictly faster end to end.

    Raises:
        CodecError: If an argument is negative, NaN, or (bandwidth) zero.

    Examples:
        >>> compression_pays_off(1_000_000, 100_000, 10e6, 0.002, 0.001)   # 10 MB/s link
        True
        >>> compression_pays_off(1_000_000, 100_000, 10e9, 0.002, 0.001)   # 10 GB/s link
        False
    """
    r = _nonneg("raw_bytes", raw_bytes)
    c = _nonneg("compressed_bytes", compressed_bytes)
    b = _nonneg("bandwidth_bytes_per_s", bandwidth_bytes_per_s, positive=True, allow_inf=True)
    cost = _nonneg("encode_s", encode_s) + _nonneg("decode_s", decode_s)
    return cost < (r - c) / b


def break_even_bandwidth(raw_bytes: float, compressed_bytes: float, encode_s: float, decode_s: float) -> float:
    """Bandwidth (bytes/s) below which compression pays off: ``(R - C) / (t_enc + t_dec)``.

    Args:
        raw_bytes: Bytes sent without compression (``R``).
        compressed_bytes: Bytes sent with it, side information included (``C``).
        encode_s: Compression time on the sender, seconds.
        decode_s: Decompression time on the receiver, seconds.

    Returns:
        The break-even bandwidth in bytes/s: ``inf`` for free compression that saves bytes and
        ``0`` when it saves none.

    Raises:
        CodecError: If an argument is negative, NaN or infinite.

    Examples:
        >>> break_even_bandwidth(1_000_000, 100_000, 0.002, 0.001)
        300000000.0
    """
    r, c = _nonneg("raw_bytes", raw_bytes), _nonneg("compressed_bytes", compressed_bytes)
    cost = _nonneg("encode_s", encode_s) + _nonneg("decode_s", decode_s)
    if r <= c:
        return 0.0
    return math.inf if cost == 0 else (r - c) / cost


@dataclass(frozen=True)
class CodecTiming:
    """Sizes and median timings of one codec setting on one sample (input to the pay-off test).

    Attributes:
        raw_bytes: Frame size with float passthrough and no compression.
        compressed_bytes: Frame size with ``bits`` and the codec.
        encode_s: Median :func:`~.frame.encode` time, seconds.
        decode_s: Median :func:`~.frame.decode` time, seconds.
    """

    raw_bytes: int
    compressed_bytes: int
    encode_s: float
    decode_s: float

    @property
    def ratio(self) -> float:
        """``raw_bytes / compressed_bytes``."""
        return self.raw_bytes / self.compressed_bytes

    def pays_off(self, bandwidth_bytes_per_s: float) -> bool:
        """:func:`compression_pays_off` for this measurement at ``bandwidth_bytes_per_s``."""
        return compression_pays_off(
            self.raw_bytes, self.compressed_bytes, bandwidth_bytes_per_s, self.encode_s, self.decode_s
        )


def measure_codec(
    sample: ArrayLike | Sequence[ArrayLike],
    bits: int | None,
    codec: str | Codec = "blosc_lz4",
    repeats: int = 5,
) -> CodecTiming:
    """Time :func:`~.frame.encode`/:func:`~.frame.decode` on ``sample`` (median of ``repeats``).

    Run it on the device (for encode) and read the decode time as an estimate for the server,
    or time each side where it runs.

    Args:
        sample: One array (numpy, torch) or a list of them: the tensors of one frame.
        bits: As :func:`~.frame.encode`.
        codec: As :func:`~.frame.encode`.
        repeats: Timed repetitions, ``>= 1``.

    Returns:
        The sizes of the uncompressed float frame and of the coded one, and the median encode
        and decode times.

    Raises:
        CodecError: If ``repeats`` is not an int ``>= 1``, or as :func:`~.frame.encode`.

    Examples:
        >>> x = np.maximum(np.random.default_rng(0).standard_normal((4, 8, 16, 16)), 0).astype(np.float32)
        >>> t = measure_codec(x, bits=4, repeats=1)
        >>> t.raw_bytes > t.compressed_bytes
        True
    """
    from nestflex.deploy.codec.frame import decode, encode

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise CodecError(f"`repeats` must be an int >= 1, got {repeats!r}.")
    tensors = [sample] if isinstance(sample, np.ndarray) or is_torch(sample) else list(sample)
    raw = len(encode(tensors, None, "raw"))
    frame = encode(tensors, bits, codec)
    # encode and decode alternate within each repeat: load drift on the device hits both alike
    t = alternating_median_s({"encode": lambda: encode(tensors, bits, codec), "decode": lambda: decode(frame)}, repeats)
    return CodecTiming(raw, len(frame), t["encode"], t["decode"])
