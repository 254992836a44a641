"""The split frame: a versioned, self-describing binary container for the tensors crossing a cut.

One frame carries every dependency tensor of one offload request (the split output plus, e.g.,
a residual's skip tensor). It is plain data parsed with :mod:`struct`: no pickle, no
``torch.load`` (DESIGN invariant 7), so a frame from the network can at worst be rejected.

Layout, all integers little-endian:

=============  ==========================  ==============================================
part           format                      meaning
=============  ==========================  ==============================================
header         ``4s H H I`` (12 B)         magic ``b"NFXC"``, version (1), flags (0),
                                           tensor count
per tensor     ``B B B B B I`` (9 B)       dtype id, bits (0 = float passthrough, 1..16),
                                           codec id, rank (<= 8), flags (bit 0: per-sample
                                           range; bit 1: codes one byte/uint16 each instead
                                           of bit-packed), number of side pairs ``S``
               ``rank x I``                shape
               ``S x f``, ``S x f``        ``lo`` then ``scale`` (ISQuant side information;
                                           ``S`` = N per-sample, 1 tensor-wide, 0 float)
               ``Q Q``                     packed (uncompressed) length, compressed length
               bytes                       the compressed payload
trailer        ``I``                       CRC-32 (zlib) of every byte before it
=============  ==========================  ==============================================

The payload of a quantised tensor is its codes packed by :func:`~.packing.pack_codes` in the
layout the codec asks for (flag bit 1); of a float tensor, its raw little-endian bytes in its own
dtype. Quantised tensors decode to float32; float passthrough decodes bit-exactly to its original
dtype (DESIGN invariant 4: head + lossless transfer + tail = unsplit model), except bfloat16,
which numpy lacks: it decodes to the float32 array of exactly the same values.

Encoding and decoding run on numpy (no torch on the device). :func:`encode` takes numpy arrays,
torch tensors (bfloat16 included) or array-likes; :func:`decode` returns numpy arrays, whatever
the sender held (``torch.from_numpy`` turns them into tensors without a copy). The format and the
bytes are those of the earlier torch implementation (``tests/deploy/test_codec_golden.py``; the
one freedom, the sign of a zero ``lo``, is described in :mod:`.isquant`).

:func:`decode` validates the whole frame before it allocates anything sized by the frame: the
checksum, every id, rank, dimension and element count against ``max_elements``, and that every
length adds up to exactly the buffer it was given. The CRC detects corruption, not an attacker;
a frame with a forged CRC still has to pass every other check, and decompressors are capped at
the validated size.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from nestflex.deploy._arrays import is_torch
from nestflex.deploy.codec.codecs import Codec, codec_by_id, get_codec
from nestflex.deploy.codec.errors import CodecError
from nestflex.deploy.codec.isquant import (
    MAX_BITS,
    QuantizedTensor,
    dequantize,
    is_bfloat16,
    isquant,
    numpy_view,
)
from nestflex.deploy.codec.packing import pack_codes, packed_size, unpack_codes

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_RANK",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAX_TENSORS",
    "TensorInfo",
    "encode",
    "decode",
    "inspect_frame",
]

MAGIC = b"NFXC"
VERSION = 1
MAX_RANK = 8
DEFAULT_MAX_ELEMENTS = 64 * 2**20  # 64M elements: 256 MB of float32, far above any split tensor
DEFAULT_MAX_TENSORS = 256

_HEADER = struct.Struct("<4sHHI")
_TENSOR = struct.Struct("<BBBBBI")
_LENGTHS = struct.Struct("<QQ")
_TRAILER = struct.Struct("<I")
_PER_SAMPLE = 0x01
_BYTE_CODES = 0x02  # codes in the "bytes" layout (one byte / uint16 each) rather than dense

# Frame dtype ids (part of the format: never renumber). Values: dtype name, little-endian
# unsigned integer of the same width used to move its bits without conversion.
_DTYPES: dict[int, tuple[str, str]] = {
    0: ("float32", "<u4"),
    1: ("float16", "<u2"),
    2: ("bfloat16", "<u2"),
    3: ("float64", "<u8"),
}
_DTYPE_IDS = {name: i for i, (name, _) in _DTYPES.items()}
_BITS_VIEW = dict(_DTYPES.values())


@dataclass(frozen=True)
class TensorInfo:
    """What a frame says about one tensor, as read by :func:`inspect_frame`.

    Attributes:
        dtype: The tensor's dtype before encoding, by name: ``"float32"``, ``"float16"``,
            ``"bfloat16"`` or ``"float64"``.
        shape: Its shape.
        bits: 1..16, or ``None`` for float passthrough.
        codec: Name of the payload codec.
        per_sample: Whether ``lo``/``scale`` are per sample (dim 0).
        raw_bytes: Packed, uncompressed payload length.
        compressed_bytes: Payload length in the frame.
        layout: ``"dense"`` or ``"bytes"`` code layout (see :mod:`~.packing`).
    """

    dtype: str
    shape: tuple[int, ...]
    bits: int | None
    codec: str
    per_sample: bool
    raw_bytes: int
    compressed_bytes: int
    layout: str = "dense"


@dataclass(frozen=True)
class _Entry:
    info: TensorInfo
    codec: Codec
    lo: np.ndarray
    scale: np.ndarray
    payload: memoryview


def _check_limit(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise CodecError(f"`{name}` must be an int >= {lo}, got {value!r}.")
    return value


def _payload_len(shape: tuple[int, ...], dtype: str, bits: int | None, layout: str) -> int:
    n = math.prod(shape)
    return n * np.dtype(_BITS_VIEW[dtype]).itemsize if bits is None else packed_size(n, bits, layout)


def _frame_array(t: object, i: int) -> tuple[np.ndarray, str]:
    """``tensors[i]`` as a numpy array and its frame dtype name (bfloat16 widened to float32)."""
    a = numpy_view(t, f"tensors[{i}]")
    name = "bfloat16" if is_bfloat16(t) else a.dtype.name
    if name not in _DTYPE_IDS:
        raise CodecError(
            f"`tensors[{i}]` has dtype {getattr(t, 'dtype', a.dtype)}; frames carry "
            f"{list(_DTYPE_IDS)}. HINT: cast integer arrays to float32."
        )
    if a.ndim > MAX_RANK:
        raise CodecError(f"`tensors[{i}]` has rank {a.ndim}; frames allow rank <= {MAX_RANK}.")
    return a, name


def _float_bytes(a: np.ndarray, dtype: str) -> bytes:
    """The values' own bits, little-endian (NaN payloads and signed zeros included)."""
    if dtype == "bfloat16":  # a holds the exact float32 widening: the bfloat16 is its upper half
        return (a.view(np.uint32) >> 16).astype("<u2").tobytes()
    same_order_ints = np.dtype(f"u{a.itemsize}").newbyteorder(a.dtype.byteorder)
    return a.view(same_order_ints).astype(_BITS_VIEW[dtype]).tobytes()


def encode(
    tensors: Sequence[ArrayLike],
    bits: int | None,
    codec: str | Codec = "blosc_lz4",
    *,
    per_sample: bool = True,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> bytes:
    """Quantise (or not), pack and compress ``tensors`` into one frame.

    Args:
        tensors: The dependency tensors of one request (numpy arrays, torch tensors or
            array-likes), float32, float16, bfloat16 (torch) or float64, rank <= 8.
        bits: ISQuant bitwidth 1..16 for every tensor, or ``None``/``32`` for lossless float
            passthrough in each tensor's own dtype.
        codec: Codec name (see :func:`~.codecs.list_codecs`) or object.
        per_sample: Per-sample ISQuant ranges along dim 0 (default) or one range per tensor.
        max_elements: Refuse frames the default decoder would refuse (total elements).

    Returns:
        The frame bytes; ``len()`` is the payload on the wire, side information included.

    Raises:
        CodecError: For a non-sequence, a non-float or oversized tensor, a rank above 8, an
            unknown codec, or the cases :func:`~.isquant.isquant` rejects.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> x = np.maximum(rng.standard_normal((2, 4, 8, 8)), 0).astype(np.float32)
        >>> np.array_equal(decode(encode([x], bits=None))[0], x)
        True
        >>> y = decode(encode([x], bits=8))[0]
        >>> bool((np.abs(y - x) <= x.max() / 255 / 2 + 1e-6).all())
        True
    """
    if (isinstance(tensors, (np.ndarray, str, bytes)) or is_torch(tensors)
            or not isinstance(tensors, Sequence)):
        raise CodecError(
            f"`tensors` must be a sequence of arrays, got {type(tensors).__name__}."
            " HINT: wrap a single array in a list: encode([x], bits)."
        )
    if bits == 32 and not isinstance(bits, bool):
        bits = None
    c = get_codec(codec)
    _check_limit("max_elements", max_elements, 1)
    if len(tensors) > DEFAULT_MAX_TENSORS:
        raise CodecError(f"a frame holds at most {DEFAULT_MAX_TENSORS} tensors, got {len(tensors)}.")
    parts = [_HEADER.pack(MAGIC, VERSION, 0, len(tensors))]
    total = 0
    for i, t in enumerate(tensors):
        a, dtype = _frame_array(t, i)
        total += a.size
        if total > max_elements:
            raise CodecError(
                f"frame would hold {total} elements, above `max_elements`={max_elements}."
                " HINT: raise max_elements on both ends, or split the request."
            )
        if bits is None:
            flags, lo, scale = 0, np.empty(0, "<f4"), np.empty(0, "<f4")
            raw = _float_bytes(a, dtype)
            typesize = np.dtype(_BITS_VIEW[dtype]).itemsize
        else:
            qt = isquant(a, bits, per_sample=per_sample)
            flags = (_PER_SAMPLE if per_sample else 0) | (_BYTE_CODES if c.layout == "bytes" else 0)
            lo = qt.lo.reshape(-1).astype("<f4")
            scale = qt.scale.reshape(-1).astype("<f4")
            raw = pack_codes(qt.q, bits, c.layout)
            typesize = 2 if c.layout == "bytes" and bits > 8 else 1
        comp = c.compress(raw, typesize)
        parts += [
            _TENSOR.pack(_DTYPE_IDS[dtype], bits or 0, c.id, a.ndim, flags, lo.size),
            struct.pack(f"<{a.ndim}I", *a.shape),
            lo.tobytes(),
            scale.tobytes(),
            _LENGTHS.pack(len(raw), len(comp)),
            comp,
        ]
    body = b"".join(parts)
    return body + _TRAILER.pack(zlib.crc32(body))


class _Reader:
    """Bounds-checked cursor over the frame: every read says what it was reading when it fails."""

    def __init__(self, buf: memoryview, end: int) -> None:
        self.buf, self.pos, self.end = buf, 0, end

    def take(self, n: int, what: str) -> memoryview:
        if n > self.end - self.pos:
            raise CodecError(
                f"frame truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.end - self.pos} left."
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct, what: str) -> tuple:
        return s.unpack(self.take(s.size, what))


def _parse(frame: bytes | bytearray | memoryview, max_elements: int, max_tensors: int) -> list[_Entry]:
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise CodecError(f"`frame` must be bytes-like, got {type(frame).__name__}.")
    _check_limit("max_elements", max_elements, 1)
    _check_limit("max_tensors", max_tensors, 0)
    buf = memoryview(frame).cast("B")
    if len(buf) < _HEADER.size + _TRAILER.size:
        raise CodecError(
            f"frame truncated: {len(buf)} bytes, a frame has at least {_HEADER.size + _TRAILER.size}."
        )
    magic, version, flags, count = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise CodecError(f"not a nestflex frame: magic {bytes(magic)!r}, expected {MAGIC!r}.")
    if version != VERSION:
        raise CodecError(
            f"unsupported frame version {version}; this nestflex reads version {VERSION}."
            " HINT: use the same nestflex release on both ends of the split."
        )
    end = len(buf) - _TRAILER.size
    (crc,) = _TRAILER.unpack_from(buf, end)
    if zlib.crc32(buf[:end]) != crc:
        raise CodecError("frame checksum mismatch: the frame was corrupted or truncated in transit.")
    if flags != 0:
        raise CodecError(f"unknown frame flags 0x{flags:04x}; version {VERSION} defines none.")
    if count > max_tensors:
        raise CodecError(f"frame holds {count} tensors, above `max_tensors`={max_tensors}.")
    r = _Reader(buf, end)
    r.pos = _HEADER.size
    entries: list[_Entry] = []
    total = 0
    for i in range(count):
        where = f"tensor {i}"
        dtype_id, bits, codec_id, rank, tflags, n_side = r.unpack(_TENSOR, f"{where} header")
        if dtype_id not in _DTYPES:
            raise CodecError(f"{where}: unknown dtype id {dtype_id}; known ids: {sorted(_DTYPES)}.")
        dtype = _DTYPES[dtype_id][0]
        if bits > MAX_BITS:
            raise CodecError(f"{where}: bits {bits} out of range (0 = float, 1..{MAX_BITS}).")
        codec = codec_by_id(codec_id)
        if rank > MAX_RANK:
            raise CodecError(f"{where}: rank {rank} above the maximum {MAX_RANK}.")
        if tflags & ~(_PER_SAMPLE | _BYTE_CODES):
            raise CodecError(f"{where}: unknown tensor flags 0x{tflags:02x}.")
        shape = r.unpack(struct.Struct(f"<{rank}I"), f"{where} shape")
        n = 1
        for d in shape:
            # checked one dimension at a time so the running product never grows unbounded
            n *= d
            if d > max_elements or total + n > max_elements:
                raise CodecError(
                    f"{where}: shape {tuple(shape)} exceeds `max_elements`={max_elements} "
                    "(per frame). HINT: raise max_elements if the sender is trusted."
                )
        total += n
        per_sample = bool(tflags & _PER_SAMPLE)
        layout = "bytes" if tflags & _BYTE_CODES else "dense"
        if bits == 0:
            want_side = 0
            if tflags:
                raise CodecError(f"{where}: float passthrough takes no flags, got 0x{tflags:02x}.")
        elif per_sample:
            if rank == 0:
                raise CodecError(f"{where}: per-sample range on a 0-d tensor.")
            want_side = shape[0]
        else:
            want_side = 1
        if n_side != want_side:
            raise CodecError(f"{where}: {n_side} lo/scale pairs, expected {want_side} for this shape.")
        lo = np.frombuffer(r.take(4 * n_side, f"{where} lo"), dtype="<f4")
        scale = np.frombuffer(r.take(4 * n_side, f"{where} scale"), dtype="<f4")
        if not (np.isfinite(lo).all() and np.isfinite(scale).all() and (scale >= 0).all()):
            raise CodecError(f"{where}: lo/scale must be finite with scale >= 0.")
        raw_len, comp_len = r.unpack(_LENGTHS, f"{where} lengths")
        want_raw = _payload_len(tuple(shape), dtype, bits or None, layout)
        if raw_len != want_raw:
            raise CodecError(
                f"{where}: packed length {raw_len} does not match shape {tuple(shape)} at "
                f"{bits or 'float'} bits ({want_raw} bytes)."
            )
        payload = r.take(comp_len, f"{where} payload")
        info = TensorInfo(dtype, tuple(shape), bits or None, codec.name, per_sample, raw_len, comp_len, layout)
        entries.append(_Entry(info, codec, lo, scale, payload))
    if r.pos != end:
        raise CodecError(f"frame has {end - r.pos} unexpected bytes after its last tensor.")
    return entries


def inspect_frame(
    frame: bytes | bytearray | memoryview,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_tensors: int = DEFAULT_MAX_TENSORS,
) -> list[TensorInfo]:
    """Validate ``frame`` and describe its tensors without decompressing anything.

    Args:
        frame: The frame bytes (made by :func:`encode`).
        max_elements: Largest total element count accepted (as :func:`decode`).
        max_tensors: Largest tensor count accepted.

    Returns:
        One :class:`TensorInfo` per tensor, in order.

    Raises:
        CodecError: As :func:`decode`, except for payloads that fail to decompress.

    Examples:
        >>> info = inspect_frame(encode([np.zeros((2, 3), np.float32)], bits=4, codec="raw"))
        >>> info[0].dtype, info[0].shape, info[0].bits, info[0].codec, info[0].raw_bytes
        ('float32', (2, 3), 4, 'raw', 3)
    """
    return [e.info for e in _parse(frame, max_elements, max_tensors)]


def decode(
    frame: bytes | bytearray | memoryview,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_tensors: int = DEFAULT_MAX_TENSORS,
) -> list[np.ndarray]:
    """Validate and decode a frame made by :func:`encode`.

    Args:
        frame: The frame bytes.
        max_elements: Largest total element count accepted (bounds every allocation).
        max_tensors: Largest tensor count accepted.

    Returns:
        The tensors in order, as numpy arrays whatever the sender held: float32 for quantised
        ones, the original dtype (bit-exact) for float passthrough, except bfloat16, which comes
        as float32 holding exactly the sent values: the upper 16 bits of each float32 are the
        sent bfloat16's bits, NaN payloads included (``torch.from_numpy(y).bfloat16()`` gives
        the same values; torch rewrites NaN payloads when it narrows).

    Raises:
        CodecError: For anything malformed, truncated, oversized or tampered with; nothing else.

    Examples:
        >>> decode(encode([np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)], bits=2))
        [array([[0., 1., 2., 3.]], dtype=float32)]
    """
    out = []
    for e in _parse(frame, max_elements, max_tensors):
        info = e.info
        raw = e.codec.decompress(e.payload, info.raw_bytes)
        if len(raw) != info.raw_bytes:  # a registered third-party codec might not check
            raise CodecError(f"codec {info.codec!r} returned {len(raw)} bytes, expected {info.raw_bytes}.")
        if info.bits is None:
            view = _BITS_VIEW[info.dtype]
            ints = np.frombuffer(raw, dtype=view).astype(view[1:])  # native order, writable copy
            if info.dtype == "bfloat16":  # the float32 whose upper half it is: the same value
                values = (ints.astype(np.uint32) << 16).view(np.float32)
            else:
                values = ints.view(info.dtype)
            out.append(values.reshape(info.shape))
            continue
        codes = unpack_codes(raw, math.prod(info.shape), info.bits, info.layout)
        side_shape = (len(e.lo),) if info.per_sample else ()
        qt = QuantizedTensor(
            q=codes.reshape(info.shape),
            lo=e.lo.astype(np.float32).reshape(side_shape),
            scale=e.scale.astype(np.float32).reshape(side_shape),
            bits=info.bits,
        )
        out.append(dequantize(qt))
    return out
