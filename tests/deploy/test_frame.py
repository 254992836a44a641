"""The split frame: round trips (DESIGN invariant 4) and hostile input (DESIGN invariant 7)."""

import os
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nestflex.deploy.codec import (
    CodecError,
    decode,
    dequantize,
    encode,
    get_codec,
    inspect_frame,
    isquant,
    list_codecs,
)
from nestflex.deploy.codec.frame import MAGIC, VERSION

BUILTIN = ["blosc_lz4", "lz4", "raw", "zlib"]
# Default suite: a few seconds. NESTFLEX_FUZZ_EXAMPLES=200000 for a long run.
FUZZ_EXAMPLES = int(os.environ.get("NESTFLEX_FUZZ_EXAMPLES", "5000"))


def _relu(*shape, seed=0):
    return torch.relu(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)))


def _same(y, x) -> bool:
    """``y`` is a numpy array with ``x``'s dtype, shape and bits (NaN payloads and zero signs too)."""
    x = x.numpy() if isinstance(x, torch.Tensor) else x
    return isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()


def _resign(frame: bytes) -> bytes:
    """Recompute the CRC so a tampered frame reaches the parser (a forging attacker's view)."""
    body = bytes(frame[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


def _set(frame: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(frame)
    struct.pack_into(fmt, b, offset, value)
    return _resign(bytes(b))


# Offsets in a one-tensor frame: header 12 B, then dtype, bits, codec, rank, flags, n_side (u32).
DTYPE, BITS, CODEC, RANK, FLAGS, NSIDE, SHAPE0 = 12, 13, 14, 15, 16, 17, 21


# ---- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", BUILTIN)
@pytest.mark.parametrize("bits", range(1, 17))
def test_round_trip_matches_isquant(codec, bits):
    x = _relu(3, 4, 5, 6, seed=bits)
    frame = encode([x], bits, codec)
    assert encode([x.numpy()], bits, codec) == frame  # a tensor and its numpy view: the same bytes
    (y,) = decode(frame)
    assert _same(y, dequantize(isquant(x.numpy(), bits)))


@pytest.mark.parametrize("codec", BUILTIN)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_float_passthrough_is_bit_exact(codec, dtype):
    x = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1)).to(dtype)
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]).to(dtype)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    sent = x.view(ints).numpy()
    for bits in (None, 32):
        (y,) = decode(encode([x], bits, codec))
        assert isinstance(y, np.ndarray) and y.shape == x.shape
        if dtype == torch.bfloat16:
            # numpy has no bfloat16: the float32 of the same value, whose upper half is the bfloat16
            assert y.dtype == np.float32
            assert np.array_equal((y.view(np.uint32) >> 16).astype(np.uint16), sent.view(np.uint16))
        else:
            assert y.dtype == x.numpy().dtype and np.array_equal(y.view(sent.dtype), sent)
            assert encode([x.numpy()], bits, codec) == encode([x], bits, codec)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=0, max_size=4),
    bits=st.one_of(st.none(), st.integers(1, 16)),
    codec=st.sampled_from(BUILTIN),
    per_sample=st.booleans(),
)
def test_multi_tensor_round_trip(shapes, bits, codec, per_sample):
    xs = [_relu(*s, seed=i) for i, s in enumerate(shapes)]
    ys = decode(encode(xs, bits, codec, per_sample=per_sample))
    assert len(ys) == len(xs)
    for x, y in zip(xs, ys):
        want = x if bits is None else dequantize(isquant(x, bits, per_sample=per_sample))
        assert _same(y, want)


def test_zero_dim_and_empty():
    s = torch.tensor(2.5)
    assert _same(decode(encode([s], None))[0], s)
    assert _same(decode(encode([s], 8, per_sample=False))[0], s)
    assert _same(decode(encode([np.float32(2.5)], 8, per_sample=False))[0], s)
    e = torch.zeros(0, 3)
    assert decode(encode([e], 4))[0].shape == (0, 3)
    assert decode(encode([], 4)) == []


def test_unsplit_model_equals_head_transfer_tail():
    # invariant 4 end to end on a tiny conv net split after a ReLU with a skip tensor
    torch.manual_seed(0)
    conv1, conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    a = torch.relu(conv1(x))
    b = torch.relu(conv2(a))
    full = b + a
    b2, a2 = decode(encode([b, a], None))
    assert torch.equal(torch.from_numpy(b2) + torch.from_numpy(a2), full)


def test_inspect_frame_reports_layout_and_sizes():
    x = _relu(4, 8, 8, 8)
    frame = encode([x, x[:, :2]], 4)
    info = inspect_frame(frame)
    assert [i.shape for i in info] == [(4, 8, 8, 8), (4, 2, 8, 8)]
    assert info[0].codec == "blosc_lz4" and info[0].layout == "bytes" and info[0].per_sample
    assert info[0].dtype == "float32" and inspect_frame(encode([x.bfloat16()], None))[0].dtype == "bfloat16"
    assert info[0].raw_bytes == x.numel()
    assert inspect_frame(encode([x], 3, "lz4"))[0].raw_bytes == x.numel() * 3 // 8


def test_compresses_relu_activations():
    x = _relu(8, 16, 32, 32)
    assert x.numel() * 4 / len(encode([x], 4)) > 8


def test_array_types_in_and_out():
    # the device holds numpy, the training side torch: both encode to the same frame, which
    # decodes to numpy whatever the sender held
    x = _relu(2, 3, 4)
    for bits in (None, 4, 12):
        frame = encode([x], bits)
        assert encode([x.numpy()], bits) == frame
        assert encode([x.tolist()], bits) == encode([x.double().numpy()], bits)  # array-likes: numpy's dtype
        assert all(isinstance(y, np.ndarray) for y in decode(frame))
    big_endian = x.numpy().astype(">f4")
    assert encode([big_endian], None) == encode([x], None) and encode([big_endian], 6) == encode([x], 6)
    assert encode([x[:, ::2].numpy()], 5) == encode([x[:, ::2].contiguous()], 5)  # strided views


def test_sign_of_a_zero_lo_never_changes_the_decoded_values():
    # A sample whose minimum is 0 with both signs present may store either zero as lo: torch's
    # own reductions (amin, aminmax) disagreed on it. Either sign must decode to the same values.
    x = np.array([[0.0, -0.0, 2.0, 1.0], [-0.0, 0.0, 0.0, -0.0]], np.float32)
    for bits in (1, 4, 8, 12, 16):
        frame = encode([x], bits, "raw")
        lo_at = SHAPE0 + 4 * x.ndim
        flipped = bytearray(frame)
        for k in range(2):
            flipped[lo_at + 4 * k + 3] ^= 0x80  # the sign bit of lo[k], little-endian
        (a,), (b,) = decode(frame), decode(_resign(bytes(flipped)))
        assert a.tobytes() == b.tobytes()
        assert np.array_equal(a[1], np.zeros(4)) and a[0, 2] == 2.0


# ---- encode errors --------------------------------------------------------------------------


def test_encode_rejects_bad_arguments():
    x = torch.zeros(2, 2)
    with pytest.raises(CodecError, match=r"`tensors` must be a sequence of arrays, got Tensor\. HINT: wrap"):
        encode(x, 8)
    with pytest.raises(CodecError, match=r"`tensors` must be a sequence of arrays, got ndarray\. HINT"):
        encode(x.numpy(), 8)
    with pytest.raises(CodecError, match=r"`tensors` must be a sequence of arrays, got str\."):
        encode("abc", 8)
    with pytest.raises(CodecError, match=r"`tensors\[1\]` must be a numpy array, a torch tensor or array-like, "
                       r"got list"):
        encode([x, [[1.0], [1.0, 2.0]]], 8)
    with pytest.raises(CodecError, match=r"`tensors\[0\]` has dtype torch\.int64; frames carry \['float32', "
                       r"'float16', 'bfloat16', 'float64'\]\. HINT: cast integer arrays to float32\."):
        encode([torch.zeros(2, dtype=torch.long)], 8)
    with pytest.raises(CodecError, match=r"`tensors\[1\]` has dtype <U3; frames carry"):
        encode([x, "abc"], None)
    with pytest.raises(CodecError, match=r"`tensors\[0\]` has dtype int32; frames carry"):
        encode([np.zeros(2, np.int32)], 8)
    with pytest.raises(CodecError, match=r"`tensors\[0\]` has rank 9; frames allow rank <= 8\."):
        encode([torch.zeros([1] * 9)], 8)
    with pytest.raises(CodecError, match=r"frame would hold 8 elements, above `max_elements`=5\."):
        encode([x, x], 8, max_elements=5)
    with pytest.raises(CodecError, match=r"`max_elements` must be an int >= 1, got 0\."):
        encode([x], 8, max_elements=0)
    with pytest.raises(CodecError, match=r"unknown codec 'brotli'; known codecs"):
        encode([x], 8, "brotli")
    with pytest.raises(CodecError, match=r"`bits` must be an int in 1\.\.16, got 0\."):
        encode([x], 0)
    with pytest.raises(CodecError, match=r"`tensors\[0\]`|NaN or Inf"):
        encode([torch.tensor([[float("nan")]])], 8)
    with pytest.raises(CodecError, match=r"a frame holds at most 256 tensors, got 257\."):
        encode([x] * 257, 8)


# ---- decode errors: each check, with its message --------------------------------------------


@pytest.fixture
def frame():
    return encode([_relu(2, 3, 4)], 4, "raw")


def test_decode_not_bytes():
    with pytest.raises(CodecError, match=r"`frame` must be bytes-like, got str\."):
        decode("NFXC")


def test_decode_too_short():
    with pytest.raises(CodecError, match=r"frame truncated: 5 bytes, a frame has at least 16\."):
        decode(b"NFXC\x01")


def test_decode_bad_magic(frame):
    with pytest.raises(CodecError, match=r"not a nestflex frame: magic b'PK\\x03\\x04', expected b'NFXC'\."):
        decode(b"PK\x03\x04" + frame[4:])


def test_decode_bad_version(frame):
    with pytest.raises(CodecError, match=r"unsupported frame version 2; this nestflex reads version 1\. HINT"):
        decode(_set(frame, 4, "<H", 2))


def test_decode_checksum(frame):
    flipped = bytearray(frame)
    flipped[30] ^= 0x10
    with pytest.raises(CodecError, match=r"frame checksum mismatch: the frame was corrupted or truncated"):
        decode(bytes(flipped))
    with pytest.raises(CodecError, match="checksum mismatch"):
        decode(frame[:-1])


def test_decode_frame_flags(frame):
    with pytest.raises(CodecError, match=r"unknown frame flags 0x0001; version 1 defines none\."):
        decode(_set(frame, 6, "<H", 1))


def test_decode_too_many_tensors(frame):
    with pytest.raises(CodecError, match=r"frame holds 4294967295 tensors, above `max_tensors`=256\."):
        decode(_set(frame, 8, "<I", 2**32 - 1))
    with pytest.raises(CodecError, match=r"frame truncated: tensor 1 header needs 9 bytes"):
        decode(_set(frame, 8, "<I", 2))


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "message"),
    [
        (DTYPE, "<B", 9, r"tensor 0: unknown dtype id 9; known ids: \[0, 1, 2, 3\]\."),
        (BITS, "<B", 17, r"tensor 0: bits 17 out of range \(0 = float, 1\.\.16\)\."),
        (CODEC, "<B", 99, r"unknown codec id 99 in frame; known ids"),
        (RANK, "<B", 9, r"tensor 0: rank 9 above the maximum 8\."),
        (FLAGS, "<B", 0x80, r"tensor 0: unknown tensor flags 0x80\."),
        (NSIDE, "<I", 3, r"tensor 0: 3 lo/scale pairs, expected 2 for this shape\."),
        (SHAPE0, "<I", 2**32 - 1, r"tensor 0: shape \(4294967295, 3, 4\) exceeds `max_elements`=67108864"),
        (SHAPE0 + 4, "<I", 5, r"tensor 0: packed length 12 does not match shape \(2, 5, 4\) at 4 bits"),
        (BITS, "<B", 0, r"tensor 0: float passthrough takes no flags, got 0x01\."),
    ],
)
def test_decode_rejects_each_header_field(frame, offset, fmt, value, message):
    with pytest.raises(CodecError, match=message):
        decode(_set(frame, offset, fmt, value))


def test_decode_shape_product_limit():
    # each dim is small, the product is not: the running product is checked dim by dim
    f = encode([torch.zeros(1, 1, 1, 1)], 4, "raw")
    for i in range(4):
        f = _set(f, SHAPE0 + 4 * i, "<I", 65536)
    with pytest.raises(CodecError, match=r"shape \(65536, 65536, 65536, 65536\) exceeds `max_elements`"):
        decode(f)


def test_decode_max_elements_configurable(frame):
    assert len(decode(frame, max_elements=24)) == 1
    with pytest.raises(CodecError, match=r"exceeds `max_elements`=23 \(per frame\)"):
        decode(frame, max_elements=23)
    two = encode([torch.zeros(2, 3), torch.zeros(2, 3)], 4)
    with pytest.raises(CodecError, match=r"tensor 1: shape \(2, 3\) exceeds `max_elements`=10"):
        decode(two, max_elements=10)
    with pytest.raises(CodecError, match=r"`max_tensors` must be an int >= 0, got -1\."):
        decode(frame, max_tensors=-1)


def test_decode_side_info_checked(frame):
    lo_at = SHAPE0 + 12
    with pytest.raises(CodecError, match=r"tensor 0: lo/scale must be finite with scale >= 0\."):
        decode(_set(frame, lo_at, "<f", float("nan")))
    with pytest.raises(CodecError, match=r"lo/scale must be finite with scale >= 0"):
        decode(_set(frame, lo_at + 8, "<f", -1.0))


def test_decode_per_sample_on_zero_dim():
    f = encode([torch.tensor(1.0)], 4, "raw", per_sample=False)
    with pytest.raises(CodecError, match=r"tensor 0: per-sample range on a 0-d tensor\."):
        decode(_set(f, FLAGS, "<B", 1))


def test_decode_trailing_bytes(frame):
    padded = _resign(frame[:-4] + b"\x00\x00\x00" + frame[-4:])
    with pytest.raises(CodecError, match=r"frame has 3 unexpected bytes after its last tensor\."):
        decode(padded)


def test_decode_truncated_payload(frame):
    with pytest.raises(CodecError, match=r"frame truncated: tensor 0 payload needs 12 bytes at offset \d+, 11 left"):
        decode(_resign(frame[:-5] + frame[-4:]))


@pytest.mark.parametrize("codec", ["blosc_lz4", "lz4", "zlib"])
def test_decode_corrupt_payload_with_forged_crc(codec):
    f = bytearray(encode([_relu(4, 8, 16, 16)], 6, codec))
    payload_start = len(f) - 4 - inspect_frame(bytes(f))[0].compressed_bytes
    for i in range(payload_start + 16, len(f) - 4, 7):
        f[i] ^= 0xA5
    with pytest.raises(CodecError, match=rf"{codec}: "):
        decode(_resign(bytes(f)))


# ---- fuzz: only CodecError may come out -----------------------------------------------------


def _seeds():
    xs = [_relu(2, 3, 5, 5, seed=7), _relu(3, 4, seed=8)]
    frames = [encode(xs, b, c) for c in BUILTIN for b in (None, 1, 3, 4, 8, 12)]
    frames.append(encode([torch.tensor(1.5), torch.zeros(0, 2)], 5, "zlib", per_sample=False))
    return frames


def _decode_or_codec_error(data: bytes) -> None:
    try:
        out = decode(data, max_elements=1 << 20)
    except CodecError:
        return
    assert all(isinstance(t, np.ndarray) for t in out)


def test_fuzz_random_truncated_flipped_frames():
    rng = np.random.default_rng(12345)
    seeds = _seeds()
    for i in range(FUZZ_EXAMPLES):
        f = bytearray(seeds[i % len(seeds)])
        kind = i % 6
        if kind == 0:  # random bytes, sometimes behind a valid magic and version
            f = bytearray(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes())
            if i % 12 == 0:
                f = bytearray(MAGIC + struct.pack("<H", VERSION)) + f
        elif kind == 1:  # truncated anywhere
            f = f[: int(rng.integers(0, len(f)))]
        elif kind in (2, 3):  # 1-8 bit flips
            for _ in range(int(rng.integers(1, 9))):
                j = int(rng.integers(0, len(f)))
                f[j] ^= 1 << int(rng.integers(0, 8))
        elif kind == 4:  # random bytes overwritten in the headers
            for _ in range(int(rng.integers(1, 4))):
                j = int(rng.integers(0, min(len(f), 64)))
                f[j] = int(rng.integers(0, 256))
        else:  # bytes spliced out or duplicated
            a, b = sorted(int(v) for v in rng.integers(0, len(f), 2))
            f = f[:a] + f[b:] if i % 2 else f[:b] + f[a:]
        data = bytes(f)
        _decode_or_codec_error(data)
        # and the same frame with a forged CRC, so it reaches the parser and the decompressors
        if len(data) >= 16 and kind:
            _decode_or_codec_error(_resign(data))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data):
    _decode_or_codec_error(data)
    _decode_or_codec_error(MAGIC + struct.pack("<HHI", VERSION, 0, 1) + data)
    if len(data) >= 4:
        _decode_or_codec_error(_resign(MAGIC + struct.pack("<HHI", VERSION, 0, 1) + data))


def test_every_registered_codec_round_trips():
    x = _relu(2, 4, 6)
    for name in list_codecs():
        assert _same(decode(encode([x], None, name))[0], x)


@pytest.mark.parametrize("codec", ["zlib", "lz4"])
@pytest.mark.parametrize("raw_len", [0, 16])
def test_a_compression_bomb_is_refused_without_expanding(codec, raw_len):
    """200 MB of zeros compress to ~200 KB; a payload that declares 0 (or 16) bytes must be refused
    after producing at most what it declared (zlib reads max_length 0 as 'no limit')."""
    import tracemalloc

    import lz4.frame

    zeros = b"\0" * (200 << 20)
    payload = zlib.compress(zeros, 9) if codec == "zlib" else lz4.frame.compress(zeros)
    del zeros
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match=rf"{codec}: payload decompresses to \d+ bytes, the frame header says {raw_len}"):
            get_codec(codec).decompress(payload, raw_len)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(payload) + (4 << 20), peak  # the payload copy and zlib's window, not 200 MB


# ---- every decoder on its own: arbitrary bytes and sizes --------------------------------------


def _decompress_within(codec: str, data: bytes, raw_len: int) -> None:
    """Only CodecError, an output of exactly ``raw_len`` bytes, and no allocation beyond the input,
    the declared output and a small constant (the check of DESIGN invariant 7 at the codec level)."""
    import tracemalloc

    import numcodecs.blosc  # noqa: F401 - imported before tracing: the import allocates, not the decoder

    tracemalloc.start()
    try:
        try:
            out = get_codec(codec).decompress(data, raw_len)
        except CodecError:
            out = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out is None or (isinstance(out, bytes) and len(out) == raw_len)
    assert peak <= 2 * (len(data) + raw_len) + (256 << 10), (codec, len(data), raw_len, peak)


@pytest.mark.parametrize("codec", BUILTIN)
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=4096), raw_len=st.integers(0, 1 << 16))
def test_decompress_of_arbitrary_bytes_raises_only_codec_error(codec, data, raw_len):
    _decompress_within(codec, data, raw_len)


@pytest.mark.parametrize("codec", BUILTIN)
@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=2048), zeros=st.integers(0, 1 << 20), raw_len=st.integers(0, 1 << 16),
       cut=st.integers(0, 64), flip=st.integers(0, 255))
def test_decompress_of_a_damaged_or_mis_sized_stream_raises_only_codec_error(codec, payload, zeros, raw_len, cut,
                                                                             flip):
    # a real stream (random bytes, or up to 1 MB of zeros: a bomb when raw_len is smaller), declared
    # with a size that rarely matches, and truncated or with one byte changed
    c = get_codec(codec)
    stream = bytearray(c.compress(payload + b"\0" * zeros))
    _decompress_within(codec, bytes(stream), raw_len)
    if stream:
        stream[cut % len(stream)] ^= flip
        _decompress_within(codec, bytes(stream), len(payload) + zeros)
        _decompress_within(codec, bytes(stream[: len(stream) - cut % len(stream)]), len(payload) + zeros)
