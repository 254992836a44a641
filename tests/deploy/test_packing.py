"""Dense bit packing and the byte-codec registry."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nestflex.deploy.codec import (
    BloscLZ4Codec,
    Codec,
    CodecError,
    LZ4FrameCodec,
    get_codec,
    list_codecs,
    pack_codes,
    packed_size,
    register_codec,
    unpack_codes,
)
from nestflex.deploy.codec.codecs import codec_by_id

BUILTIN = ["blosc_lz4", "lz4", "raw", "zlib"]


@settings(max_examples=300, deadline=None)
@given(
    bits=st.integers(1, 16),
    n=st.integers(0, 200),
    seed=st.integers(0, 2**32 - 1),
    layout=st.sampled_from(["dense", "bytes"]),
)
def test_pack_round_trip(bits, n, seed, layout):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**bits, n).astype(np.uint8 if bits <= 8 else np.int32)
    packed = pack_codes(codes, bits, layout)
    assert len(packed) == packed_size(n, bits, layout)
    out = unpack_codes(packed, n, bits, layout)
    assert out.dtype == codes.dtype and np.array_equal(out, codes)


@pytest.mark.parametrize("bits", range(1, 17))
def test_packing_is_dense(bits):
    # at most one group of padding: b bits per code, rounded up to whole 8-code groups
    n = 1000
    assert packed_size(n, bits) * 8 <= n * bits + 8 * bits
    assert packed_size(8 * 125, bits) * 8 == 8 * 125 * bits


def test_layout_is_little_endian_low_code_first():
    assert pack_codes(np.array([1, 2, 3], np.uint8), 4) == bytes([0x21, 0x03])
    assert pack_codes(np.array([1, 0, 0, 0, 0, 0, 0, 1], np.uint8), 1) == bytes([0x81])
    assert pack_codes(np.array([7, 0, 0, 0, 0, 0, 0, 7], np.uint8), 3) == bytes([0x07, 0x00, 0xE0])
    assert pack_codes(np.array([0x1234], np.int32), 16) == bytes([0x34, 0x12])


def test_pack_accepts_torch_codes_any_shape():
    codes = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4) % 8
    assert pack_codes(codes, 3) == pack_codes(codes.numpy(), 3) == pack_codes(codes.tolist(), 3)
    out = unpack_codes(pack_codes(codes, 3), 24, 3)
    assert isinstance(out, np.ndarray) and out.tolist() == codes.reshape(-1).tolist()


def test_bytes_layout_masks_tampered_codes():
    assert unpack_codes(b"\xff\x07", 2, 3, "bytes").tolist() == [7, 7]
    assert unpack_codes(b"\xff\xff", 1, 12, "bytes").tolist() == [4095]


def test_unknown_layout():
    with pytest.raises(CodecError, match=r"`layout` must be one of \['dense', 'bytes'\], got 'planes'\."):
        pack_codes(np.zeros(3, np.uint8), 4, "planes")


def test_unpack_wrong_length():
    with pytest.raises(CodecError, match=r"packed codes: expected 2 bytes for 3 4-bit codes \(dense\), got 3\."):
        unpack_codes(b"\x00\x00\x00", 3, 4)


def test_packed_size_negative():
    with pytest.raises(CodecError, match=r"`n` must be an int >= 0, got -1\."):
        packed_size(-1, 4)


@pytest.mark.parametrize("bits", [0, 17])
def test_pack_bits_out_of_range(bits):
    with pytest.raises(CodecError, match=rf"`bits` must be an int in 1\.\.16, got {bits}\."):
        pack_codes(np.zeros(3, np.uint8), bits)


# ---- codecs ---------------------------------------------------------------------------------


def test_builtin_codecs_listed():
    assert set(BUILTIN) <= set(list_codecs())
    assert list_codecs() == sorted(list_codecs())


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("typesize", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 4096, 100_003])
def test_codec_round_trip(name, typesize, n):
    rng = np.random.default_rng(n)
    data = (rng.random(n * typesize) < 0.2).astype(np.uint8).tobytes()
    c = get_codec(name)
    assert c.decompress(c.compress(data, typesize), len(data)) == data


def test_bitshuffle_beats_plain_lz4_on_relu_like_codes():
    # ReLU of a smooth random field, 4-bit codes one per byte: the reason blosc_lz4 is the default
    from nestflex.deploy.codec import isquant

    g = torch.Generator().manual_seed(0)
    field = torch.nn.functional.interpolate(torch.randn(8, 16, 8, 8, generator=g), size=32, mode="bilinear")
    x = torch.relu(field + 0.1 * torch.randn(field.shape, generator=g))
    codes = pack_codes(isquant(x, 4).q.numpy(), 4, "bytes")
    assert len(get_codec("blosc_lz4").compress(codes)) < 0.8 * len(get_codec("lz4").compress(codes))


@pytest.mark.parametrize("name", BUILTIN)
def test_codec_refuses_wrong_size(name):
    c = get_codec(name)
    comp = c.compress(b"abcdefgh" * 100)
    with pytest.raises(CodecError, match=rf"{name}: "):
        c.decompress(comp, 799)
    with pytest.raises(CodecError, match=rf"{name}: "):
        c.decompress(comp, 801)


@pytest.mark.parametrize("name", ["blosc_lz4", "lz4", "zlib"])
def test_codec_refuses_garbage(name):
    with pytest.raises(CodecError, match=rf"{name}: "):
        get_codec(name).decompress(b"\x02\x01\x21\x01" + b"\xff" * 60, 100)


def test_blosc_header_checked_before_c():
    c = get_codec("blosc_lz4")
    with pytest.raises(CodecError, match=r"blosc_lz4: payload of 3 bytes is shorter than a Blosc header"):
        c.decompress(b"abc", 10)
    comp = c.compress(b"\x00" * 1000)
    with pytest.raises(CodecError, match=r"blosc_lz4: Blosc header says 1000 bytes from \d+ \(typesize 1\), "
                       r"the frame says 2000 bytes"):
        c.decompress(comp, 2000)


def test_get_codec_accepts_object_and_name():
    c = LZ4FrameCodec()
    assert get_codec(c) is c
    assert get_codec("blosc_lz4").name == "blosc_lz4"
    assert codec_by_id(1).name == "blosc_lz4"


def test_get_codec_unknown_lists_known():
    with pytest.raises(CodecError, match=r"unknown codec 'zstd'; known codecs: \[.*'blosc_lz4'.*'zlib'"):
        get_codec("zstd")
    with pytest.raises(CodecError, match=r"`codec` must be a codec name or a Codec, got int\."):
        get_codec(3)
    with pytest.raises(CodecError, match=r"unknown codec id 250 in frame; known ids: \[0, 1, 2, 3"):
        codec_by_id(250)


def test_register_codec_rules():
    class Dup(LZ4FrameCodec):
        name, id = "lz4", 2

    with pytest.raises(CodecError, match=r"codec name 'lz4' or id 2 is already registered"):
        register_codec(Dup())

    class BadId(LZ4FrameCodec):
        name, id = "bad_id_codec", 256

    with pytest.raises(CodecError, match=r"`codec.id` must be an int in 0\.\.255"):
        register_codec(BadId())
    with pytest.raises(CodecError, match=r"`codec` must be a Codec instance, got str\."):
        register_codec("lz4")
    # same name and id, other settings: allowed with replace=True
    original = get_codec("blosc_lz4")
    try:
        fast = register_codec(BloscLZ4Codec(clevel=1), replace=True)
        assert get_codec("blosc_lz4") is fast
    finally:
        register_codec(original, replace=True)


def test_registered_codec_is_usable_in_frames():
    from nestflex.deploy.codec import decode, encode

    class Reverse(Codec):
        name, id = "test_reverse", 201

        def compress(self, data, typesize=1):
            return bytes(data)[::-1]

        def decompress(self, data, raw_len):
            return bytes(data)[::-1]

    register_codec(Reverse(), replace=True)
    x = torch.arange(12.0).reshape(3, 4)
    assert np.array_equal(decode(encode([x], None, "test_reverse"))[0], x.numpy())


@pytest.mark.parametrize("clevel", [-1, 10, 2.0, True])
def test_blosc_clevel_validated(clevel):
    with pytest.raises(CodecError, match=r"`clevel` must be an int in 0\.\.9"):
        BloscLZ4Codec(clevel=clevel)
