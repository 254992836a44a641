"""The codec against frames and quantiser outputs written by its earlier torch implementation.

``fixtures/codec_golden_v1.npz`` was written by ``fixtures/make_codec_golden.py`` with the torch
codec (see ``fixtures/README.md``). Today's numpy codec must read those frames to the same bits
and write the same bytes, from numpy arrays and from torch tensors alike.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nestflex.deploy.codec import decode, dequantize, encode, fake_quantize, fixed_quantize, isquant
from nestflex.deploy.codec.frame import _parse

GOLDEN = np.load(Path(__file__).parent / "fixtures" / "codec_golden_v1.npz", allow_pickle=False)
BLOB = GOLDEN["blob"].tobytes()
MANIFEST = json.loads(str(GOLDEN["manifest"]))
INPUTS = {k.removeprefix("in."): GOLDEN[k] for k in GOLDEN.files if k.startswith("in.")}
# Compressors whose output is fixed by the wheel that bundles them; zlib is the system's (zlib-ng
# on some distributions compresses differently), so zlib frames are compared decompressed.
EXACT_CODECS = ("raw", "blosc_lz4", "lz4")


def _stored(d: dict):
    raw = BLOB[d["off"] : d["off"] + d["len"]]
    if d["dtype"] == "frame":
        return raw
    dtype = np.uint16 if d["dtype"] == "bfloat16" else d["dtype"]
    return np.frombuffer(raw, dtype).reshape(d["shape"]), d["dtype"]


def _torch_input(name: str) -> torch.Tensor:
    t = torch.from_numpy(INPUTS[name].copy())
    return t.bfloat16() if name.startswith("bf16") else t


def _bits_equal(got, want: tuple[np.ndarray, str]) -> bool:
    arr, dtype = want
    if isinstance(got, torch.Tensor):
        name = str(got.dtype).removeprefix("torch.")
        got = got.view(torch.int16).numpy().view(np.uint16) if got.dtype == torch.bfloat16 else got.numpy()
    else:
        name = got.dtype.name
    return name == dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes()


def _decompressed(frame: bytes) -> list:
    """Everything a frame says except how its payloads were compressed (and so its CRC)."""
    return [(dataclasses.replace(e.info, compressed_bytes=0), e.lo.tobytes(), e.scale.tobytes(),
             e.codec.decompress(e.payload, e.info.raw_bytes)) for e in _parse(frame, 1 << 20, 16)]


def _case_id(case: dict) -> str:
    return f"{'+'.join(case['inputs'])}-{case['bits']}-{case['codec']}-{'ps' if case['per_sample'] else 'tw'}"


@pytest.mark.parametrize("case", MANIFEST["frames"], ids=_case_id)
def test_old_frames_decode_to_the_same_bits_and_new_frames_are_the_same_bytes(case):
    golden = _stored(case["frame"])
    decoded = decode(golden)
    assert len(decoded) == len(case["decoded"])
    for y, d in zip(decoded, case["decoded"]):
        want, dtype = _stored(d)
        assert isinstance(y, np.ndarray)
        if dtype == "bfloat16":  # numpy has no bfloat16: the float32 of the same value
            assert y.dtype == np.float32 and np.array_equal(y.view(np.uint32), want.astype(np.uint32) << 16)
        else:
            assert _bits_equal(y, (want, dtype))
    senders = {"torch": [_torch_input(n) for n in case["inputs"]]}
    if not any(n.startswith("bf16") for n in case["inputs"]):  # numpy cannot hold bfloat16
        senders["numpy"] = [INPUTS[n] for n in case["inputs"]]
    for sender, tensors in senders.items():
        frame = encode(tensors, case["bits"], case["codec"], per_sample=case["per_sample"])
        assert _decompressed(frame) == _decompressed(golden), sender
        if case["codec"] in EXACT_CODECS:
            assert frame == golden, sender


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch", "numpy"])
def test_quantiser_outputs_are_the_same_bits(as_numpy):
    def x_of(name):
        return INPUTS[name] if as_numpy else _torch_input(name)

    array = np.ndarray if as_numpy else torch.Tensor
    for c in MANIFEST["isquant"]:
        qt = isquant(x_of(c["input"]), c["bits"], per_sample=c["per_sample"])
        for field in ("q", "lo", "scale"):
            v = getattr(qt, field)
            assert isinstance(v, array) and _bits_equal(v, _stored(c[field])), (c["input"], c["bits"], field)
        assert _bits_equal(dequantize(qt), _stored(c["dequantized"])), (c["input"], c["bits"])
    for c in MANIFEST["fake"]:
        if as_numpy and c["input"].startswith("bf16"):
            continue
        assert _bits_equal(fake_quantize(x_of(c["input"]), c["bits"]), _stored(c["out"])), c["input"]
    for c in MANIFEST["fixed"]:
        qt = fixed_quantize(x_of(c["input"]), c["bits"], *c["range"])
        for field in ("q", "lo", "scale"):
            assert _bits_equal(getattr(qt, field), _stored(c[field])), (c["input"], c["bits"], field)
        assert _bits_equal(dequantize(qt), _stored(c["dequantized"])), (c["input"], c["bits"])


def test_the_golden_file_covers_every_bitwidth_and_codec():
    frames = MANIFEST["frames"]
    assert {c["bits"] for c in frames} == {None, *range(1, 17)}
    assert {c["codec"] for c in frames} == {"raw", "blosc_lz4", "lz4", "zlib"}
    assert {c["per_sample"] for c in frames} == {True, False}
    assert {n for c in frames for n in c["inputs"]} == set(INPUTS)
