"""Byte compressors for frame payloads, and their registry (chosen by name, like timm's models).

A codec turns the packed payload of one tensor into bytes and back. Each has a one-byte ``id``
written into frames, so a frame names its own codec; ids are part of the frame format and never
reused. Decompression is told the exact expected output size (from the validated frame header)
and never produces more, so a crafted payload cannot make the decoder allocate more than the
header allowed (DESIGN invariant 7: payloads are data).

Built in:

* ``raw`` (id 0): no compression.
* ``blosc_lz4`` (id 1, the default): numcodecs' Blosc with bit shuffle and LZ4, i.e. DynO's
  "bit shuffle, then LZ4" (METHODS §4). Bit shuffle puts equal-significance bits of neighbouring
  codes next to each other; in sparse ReLU activations the high planes are almost all zero and
  LZ4 collapses them.
* ``lz4`` (id 2): plain ``lz4.frame``, the SPINN-style baseline.
* ``zlib`` (id 3): DEFLATE level 6, the "what would a generic compressor do" baseline.
"""

from __future__ import annotations

import struct
import zlib
from abc import ABC, abstractmethod
from typing import ClassVar

import lz4.frame
import numpy as np

from nestflex.deploy._registry import Registry
from nestflex.deploy.codec.errors import CodecError

__all__ = [
    "Codec",
    "RawCodec",
    "BloscLZ4Codec",
    "LZ4FrameCodec",
    "ZlibCodec",
    "register_codec",
    "list_codecs",
    "get_codec",
    "codec_by_id",
]


class Codec(ABC):
    """A lossless byte compressor with a stable name and frame id.

    Subclasses set ``name`` and ``id`` and implement :meth:`compress` and :meth:`decompress`.
    ``layout`` says how ISQuant codes are laid out before compression (see
    :mod:`~nestflex.deploy.codec.packing`): ``"dense"`` bit packing for ordinary compressors,
    ``"bytes"`` for bit-shuffling ones, whose shuffle does the packing itself.
    """

    name: ClassVar[str]
    id: ClassVar[int]
    layout: ClassVar[str] = "dense"

    @abstractmethod
    def compress(self, data: bytes | memoryview, typesize: int = 1) -> bytes:
        """Compress ``data``; ``typesize`` is the element width in bytes (a hint for shuffles)."""

    @abstractmethod
    def decompress(self, data: bytes | memoryview, raw_len: int) -> bytes:
        """Decompress to exactly ``raw_len`` bytes or raise :class:`CodecError`; never more."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _short(what: str, got: int, want: int) -> CodecError:
    return CodecError(f"{what}: payload decompresses to {got} bytes, the frame header says {want}.")


class RawCodec(Codec):
    """No compression: the packed payload as is."""

    name = "raw"
    id = 0

    def compress(self, data: bytes | memoryview, typesize: int = 1) -> bytes:
        return bytes(data)

    def decompress(self, data: bytes | memoryview, raw_len: int) -> bytes:
        if len(data) != raw_len:
            raise _short("raw", len(data), raw_len)
        return bytes(data)


# Blosc1 header: version, versionlz, flags, typesize (u8 each), nbytes, blocksize, cbytes (u32).
_BLOSC_HEADER = struct.Struct("<BBBBIII")


class BloscLZ4Codec(Codec):
    """Bit shuffle + LZ4 through numcodecs' Blosc (DynO's packing).

    Why numcodecs: it is maintained, ships wheels that need only numpy, and its Blosc has a
    SIMD bit shuffle. On byte-per-code ISQuant output the shuffle makes the ``8 - b`` unused bit
    planes all-zero runs, so no separate bit packing is needed (docs/codec.md has the measured
    ratios from ``benchmarks/split/codec.py``).

    Args:
        clevel: Blosc compression level 0..9 (5 is Blosc's default and a good speed/ratio point).
    """

    name = "blosc_lz4"
    id = 1
    layout = "bytes"  # the bit shuffle packs: see packing.py for the measurement behind this

    def __init__(self, clevel: int = 5) -> None:
        if isinstance(clevel, bool) or not isinstance(clevel, int) or not 0 <= clevel <= 9:
            raise CodecError(f"`clevel` must be an int in 0..9, got {clevel!r}.")
        self.clevel = clevel

    def compress(self, data: bytes | memoryview, typesize: int = 1) -> bytes:
        from numcodecs import blosc

        # bit shuffle needs the element width; codes are bytes, float passthrough uses itemsize
        return blosc.compress(
            np.frombuffer(data, dtype=np.uint8), b"lz4", self.clevel, blosc.BITSHUFFLE, typesize=typesize
        )

    def decompress(self, data: bytes | memoryview, raw_len: int) -> bytes:
        from numcodecs import blosc

        # Check Blosc's own header before handing the buffer to C: it must promise exactly the
        # size the (already validated) frame header promised, in exactly the bytes we have.
        if len(data) < _BLOSC_HEADER.size:
            raise CodecError(f"blosc_lz4: payload of {len(data)} bytes is shorter than a Blosc header.")
        _, _, _, typesize, nbytes, _, cbytes = _BLOSC_HEADER.unpack_from(data)
        if nbytes != raw_len or cbytes != len(data) or typesize == 0:
            raise CodecError(
                f"blosc_lz4: Blosc header says {nbytes} bytes from {cbytes} (typesize {typesize}), "
                f"the frame says {raw_len} bytes from {len(data)}."
            )
        out = np.empty(raw_len, dtype=np.uint8)
        if raw_len:
            try:
                blosc.decompress(bytes(data), out)
            except (RuntimeError, ValueError) as e:  # numcodecs reports C errors as RuntimeError
                raise CodecError(f"blosc_lz4: corrupt payload ({e}).") from e
        return out.tobytes()

    def __repr__(self) -> str:
        return f"BloscLZ4Codec(clevel={self.clevel})"


class LZ4FrameCodec(Codec):
    """Plain ``lz4.frame`` (no shuffle): the SPINN-style baseline."""

    name = "lz4"
    id = 2

    def compress(self, data: bytes | memoryview, typesize: int = 1) -> bytes:
        return lz4.frame.compress(bytes(data), store_size=True)

    def decompress(self, data: bytes | memoryview, raw_len: int) -> bytes:
        d = lz4.frame.LZ4FrameDecompressor()
        try:
            # max_length caps the allocation whatever the LZ4 frame's own header claims
            out = d.decompress(bytes(data), max_length=raw_len)
        except RuntimeError as e:
            raise CodecError(f"lz4: corrupt payload ({e}).") from e
        if len(out) != raw_len or not d.eof or d.unused_data:
            raise _short("lz4", len(out), raw_len)
        return out


class ZlibCodec(Codec):
    """DEFLATE via ``zlib`` (level 6): a generic-compressor baseline."""

    name = "zlib"
    id = 3

    def compress(self, data: bytes | memoryview, typesize: int = 1) -> bytes:
        return zlib.compress(bytes(data), 6)

    def decompress(self, data: bytes | memoryview, raw_len: int) -> bytes:
        d = zlib.decompressobj()
        try:
            # max_length caps the allocation; zlib reads 0 as "no limit", so a frame declaring 0 bytes
            # would let a few hundred KB of compressed zeros expand to gigabytes: cap at 1 instead
            out = d.decompress(bytes(data), max(raw_len, 1))
        except zlib.error as e:
            raise CodecError(f"zlib: corrupt payload ({e}).") from e
        if len(out) != raw_len or not d.eof or d.unconsumed_tail or d.unused_data:
            raise _short("zlib", len(out), raw_len)
        return out


# One registry (nestflex.deploy._registry) by name; ids are the frame format's, kept beside it.
_CODECS: Registry[Codec] = Registry(
    "codec",
    CodecError,
    accepts=lambda c: isinstance(c, Codec),
    callable_entries=False,
    register_hint="register your own with `register_codec(codec)`",
    unknown="unknown codec {name!r}; known codecs: {known}. HINT: {hint}",
)
_BY_ID: dict[int, Codec] = {}


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Add ``codec`` to the registry under ``codec.name`` and ``codec.id``.

    Args:
        codec: A :class:`Codec` instance with a name and an id in 0..255.
        replace: Allow replacing an entry with the same name *and* id (e.g. other settings).

    Returns:
        ``codec``, so the call can be used as an expression.

    Raises:
        CodecError: If ``codec`` is not a Codec, its id is out of 0..255, or its name or id is
            taken by another codec.

    Examples:
        >>> class Lz4Fast(LZ4FrameCodec):
        ...     name, id = "lz4_doc_example", 200
        >>> register_codec(Lz4Fast(), replace=True).name in list_codecs()
        True
    """
    if not isinstance(codec, Codec):
        raise CodecError(f"`codec` must be a Codec instance, got {type(codec).__name__}.")
    cid = getattr(codec, "id", None)
    if isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid <= 255:
        raise CodecError(f"`codec.id` must be an int in 0..255 (one byte in the frame), got {cid!r}.")
    same_name = _CODECS.get(codec.name) if codec.name in _CODECS else None
    same_id = _BY_ID.get(cid)
    # a name and an id travel together: replacing one entry must not orphan another's id
    if (same_name is not None or same_id is not None) and not (
        replace and same_name is not None and same_name is same_id
    ):
        raise CodecError(
            f"codec name {codec.name!r} or id {cid} is already registered "
            f"(names: {list_codecs()}, ids: {sorted(_BY_ID)}). HINT: pass replace=True to swap "
            "settings of the same codec, or pick a free name and id."
        )
    _CODECS.register(codec.name, codec, overwrite=True)
    _BY_ID[cid] = codec
    return codec


def list_codecs() -> list[str]:
    """Names of the registered codecs, sorted.

    Examples:
        >>> [n for n in list_codecs() if n in ("blosc_lz4", "lz4", "raw", "zlib")]
        ['blosc_lz4', 'lz4', 'raw', 'zlib']
    """
    return _CODECS.names()


def get_codec(codec: str | Codec) -> Codec:
    """Return the codec registered as ``codec``, or ``codec`` itself if it is a :class:`Codec`.

    Args:
        codec: A registered name (:func:`list_codecs`) or a :class:`Codec` instance.

    Raises:
        CodecError: For an unknown name (the message lists the known ones) or another type.

    Examples:
        >>> get_codec("zlib").id
        3
    """
    if not isinstance(codec, (str, Codec)):
        raise CodecError(f"`codec` must be a codec name or a Codec, got {type(codec).__name__}.")
    return _CODECS.get(codec)


def codec_by_id(cid: int) -> Codec:
    """The registered codec with frame id ``cid``; :class:`CodecError` if none."""
    try:
        return _BY_ID[cid]
    except KeyError:
        raise CodecError(f"unknown codec id {cid} in frame; known ids: {sorted(_BY_ID)}.") from None


for _c in (RawCodec(), BloscLZ4Codec(), LZ4FrameCodec(), ZlibCodec()):
    register_codec(_c)
del _c
