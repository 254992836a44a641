"""Dense bit packing of b-bit integer codes (the step between ISQuant and the byte compressor).

Layout (little-endian, the frame format depends on it, so it is part of the format):

* ``bits <= 8``: codes are taken in groups of 8; code ``i`` of a group occupies bits
  ``[b*i, b*i + b)`` of the group's ``8*b``-bit little-endian word, which is stored as ``b``
  bytes. The last group is padded with zero codes. So 4-bit codes go two per byte (low nibble
  first), 2-bit four per byte, 1-bit eight per byte (``np.packbits(bitorder="little")``) and
  3-bit codes fill 3 bytes per 8 codes.
* ``9 <= bits <= 16``: the low byte of every code, then the high ``bits - 8`` bits packed as
  above. Splitting at the byte keeps the common 8-bit path a plain copy and lets the 16-bit case
  reuse the same code.

The frame also knows a second, unpacked layout, ``"bytes"``: one byte per code (``bits <= 8``)
or a little-endian ``uint16`` (``bits > 8``). It exists for bit-shuffling codecs: a bit shuffle
transposes bytes into bit planes, which *is* a dense packing with equal-significance bits side
by side (DynO's layout); the ``8 - b`` unused planes are all zero and LZ4 reduces them to almost
nothing. On the VGG recipe's ReLU activations, bit shuffle over byte codes compressed better
than bit shuffle over densely packed codes at every bitwidth tried (most at 3 bits, where dense
packing splits codes across bytes, so a byte's bits no longer share a significance). Codecs
without a shuffle get the dense layout.

Packing is pure numpy (no torch) so the frame decoder stays small and auditable; it takes codes
as numpy arrays, torch tensors or array-likes and returns bytes, and unpacking returns numpy.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from nestflex.deploy._arrays import to_numpy
from nestflex.deploy.codec.errors import CodecError
from nestflex.deploy.codec.isquant import check_bits

__all__ = ["LAYOUTS", "packed_size", "pack_codes", "unpack_codes"]

LAYOUTS = ("dense", "bytes")

# Powers of two divide a byte: a shift-or over strided views beats the generic 64-bit path.
_PER_BYTE = {1: 8, 2: 4, 4: 2}


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise CodecError(f"`layout` must be one of {list(LAYOUTS)}, got {layout!r}.")
    return layout


def packed_size(n: int, bits: int, layout: str = "dense") -> int:
    """Bytes that ``n`` codes of ``bits`` bits take once packed in ``layout``.

    Args:
        n: Number of codes, ``>= 0``.
        bits: Bitwidth, 1..16.
        layout: ``"dense"`` (bit-packed) or ``"bytes"`` (one byte / uint16 per code).

    Raises:
        CodecError: If an argument is out of range.

    Examples:
        >>> packed_size(10, 4), packed_size(10, 3), packed_size(10, 12), packed_size(10, 3, "bytes")
        (5, 6, 15, 10)
    """
    check_bits(bits)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CodecError(f"`n` must be an int >= 0, got {n!r}.")
    if _check_layout(layout) == "bytes":
        return n if bits <= 8 else 2 * n
    if bits > 8:
        return n + packed_size(n, bits - 8)
    if bits == 8:
        return n
    if bits in _PER_BYTE:
        return -(-n // _PER_BYTE[bits])
    return -(-n // 8) * bits


def pack_codes(codes: ArrayLike, bits: int, layout: str = "dense") -> bytes:
    """Pack unsigned integer codes (each ``< 2**bits``); see the module docstring for layouts.

    Args:
        codes: Integer array (numpy, torch or array-like) of any shape, flattened in C order,
            values in ``[0, 2**bits)``; higher bits are ignored, so callers must clamp first
            (ISQuant does).
        bits: Bitwidth, 1..16.
        layout: ``"dense"`` (bit-packed) or ``"bytes"`` (one byte / uint16 per code).

    Returns:
        ``packed_size(n, bits, layout)`` bytes for ``n`` codes.

    Examples:
        >>> pack_codes(np.array([1, 2, 3], dtype=np.uint8), 4).hex()
        '2103'
        >>> pack_codes(np.array([1, 2, 3], dtype=np.uint8), 4, "bytes").hex()
        '010203'
    """
    bits = check_bits(bits)
    c = np.ascontiguousarray(to_numpy(codes)).reshape(-1)
    if _check_layout(layout) == "bytes":
        mask = 2**bits - 1
        return (c & mask).astype(np.uint8 if bits <= 8 else "<u2", copy=False).tobytes()
    if bits > 8:
        c = c.astype(np.uint16, copy=False)
        return (c & 0xFF).astype(np.uint8).tobytes() + pack_codes(c >> 8, bits - 8)
    c = c.astype(np.uint8, copy=False)
    if bits == 8:
        return c.tobytes()
    if bits == 1:
        return np.packbits(c & 1, bitorder="little").tobytes()
    k = _PER_BYTE.get(bits)
    if k is not None:
        c = np.pad(c, (0, -c.size % k)).reshape(-1, k)
        out = c[:, 0].copy()
        for i in range(1, k):
            out |= c[:, i] << np.uint8(bits * i)
        return out.tobytes()
    # 3, 5, 6, 7 bits: 8 codes -> one 64-bit word -> its low `bits` bytes
    c = np.pad(c, (0, -c.size % 8)).reshape(-1, 8)
    word = c[:, 0].astype("<u8")
    for i in range(1, 8):
        word |= c[:, i].astype("<u8") << np.uint64(bits * i)
    return word.view(np.uint8).reshape(-1, 8)[:, :bits].tobytes()


def unpack_codes(data: bytes | memoryview, n: int, bits: int, layout: str = "dense") -> np.ndarray:
    """Inverse of :func:`pack_codes`: ``n`` codes as ``uint8`` (``bits <= 8``) or ``int32``.

    Codes of the ``"bytes"`` layout are masked to ``bits`` bits, so a tampered payload can never
    yield a code outside ``[0, 2**bits)``.

    Args:
        data: The packed bytes.
        n: Number of codes packed.
        bits: Bitwidth, 1..16.
        layout: ``"dense"`` (bit-packed) or ``"bytes"`` (one byte / uint16 per code).

    Raises:
        CodecError: If ``data`` does not hold exactly ``packed_size(n, bits, layout)`` bytes.

    Examples:
        >>> unpack_codes(bytes.fromhex("2103"), 3, 4).tolist()
        [1, 2, 3]
    """
    bits = check_bits(bits)
    buf = np.frombuffer(data, dtype=np.uint8)
    want = packed_size(n, bits, layout)
    if buf.size != want:
        raise CodecError(
            f"packed codes: expected {want} bytes for {n} {bits}-bit codes ({layout}), got {buf.size}."
        )
    if layout == "bytes":
        if bits <= 8:
            return buf & np.uint8(2**bits - 1)
        return (buf.view("<u2") & np.uint16(2**bits - 1)).astype(np.int32)
    if bits > 8:
        hi = unpack_codes(buf[n:], n, bits - 8).astype(np.int32)
        return (hi << 8) | buf[:n].astype(np.int32)
    if bits == 8:
        return buf.copy()
    if bits == 1:
        return np.unpackbits(buf, count=n, bitorder="little")
    mask = np.uint8(2**bits - 1)
    k = _PER_BYTE.get(bits)
    if k is not None:
        out = np.empty((buf.size, k), dtype=np.uint8)
        for i in range(k):
            np.bitwise_and(buf >> np.uint8(bits * i), mask, out=out[:, i])
        return out.reshape(-1)[:n]
    words = np.zeros((buf.size // bits, 8), dtype=np.uint8)
    words[:, :bits] = buf.reshape(-1, bits)
    w = words.view("<u8").reshape(-1)
    out = np.empty((w.size, 8), dtype=np.uint8)
    for i in range(8):
        out[:, i] = (w >> np.uint64(bits * i)) & np.uint64(mask)
    return out.reshape(-1)[:n]
