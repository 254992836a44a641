"""The split codec on the base install: frames and quantiser outputs of the torch implementation
(``tests/deploy/fixtures/codec_golden_v1.npz``) read and written from numpy alone, and ISQuant's
error bound on a real crossing tensor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nestflex.deploy.codec import decode, dequantize, encode, fake_quantize, fixed_quantize, isquant

GOLDEN = np.load(Path(__file__).resolve().parents[1] / "deploy" / "fixtures" / "codec_golden_v1.npz",
                 allow_pickle=False)
BLOB = GOLDEN["blob"].tobytes()
MANIFEST = json.loads(str(GOLDEN["manifest"]))
INPUTS = {k.removeprefix("in."): GOLDEN[k] for k in GOLDEN.files if k.startswith("in.")}
# compressors whose bytes the wheel fixes; zlib is the system's (tests/deploy/test_codec_golden.py)
EXACT_CODECS = ("raw", "blosc_lz4", "lz4")


def _stored(d: dict):
    raw = BLOB[d["off"]: d["off"] + d["len"]]
    if d["dtype"] == "frame":
        return raw
    dtype = np.uint16 if d["dtype"] == "bfloat16" else d["dtype"]
    return np.frombuffer(raw, dtype).reshape(d["shape"]), d["dtype"]


def _same_bits(got: np.ndarray, want: tuple[np.ndarray, str]) -> bool:
    arr, dtype = want
    return isinstance(got, np.ndarray) and got.dtype.name == dtype and got.shape == arr.shape \
        and got.tobytes() == arr.tobytes()


NUMPY_CASES = [c for c in MANIFEST["frames"] if not any(n.startswith("bf16") for n in c["inputs"])]


@pytest.mark.parametrize("case", NUMPY_CASES,
                         ids=lambda c: f"{'+'.join(c['inputs'])}-{c['bits']}-{c['codec']}-{c['per_sample']}")
def test_torch_written_frames_decode_and_numpy_encodes_them_again(case):
    golden = _stored(case["frame"])
    decoded = decode(golden)
    assert len(decoded) == len(case["decoded"])
    for y, d in zip(decoded, case["decoded"]):
        assert _same_bits(y, _stored(d))
    frame = encode([INPUTS[n] for n in case["inputs"]], case["bits"], case["codec"], per_sample=case["per_sample"])
    if case["codec"] in EXACT_CODECS:
        assert frame == golden
    else:
        assert [a.tobytes() for a in decode(frame)] == [a.tobytes() for a in decoded]


def test_quantisers_give_the_torch_implementations_bits():
    for c in MANIFEST["isquant"]:
        if c["input"].startswith("bf16"):
            continue
        qt = isquant(INPUTS[c["input"]], c["bits"], per_sample=c["per_sample"])
        for field in ("q", "lo", "scale"):
            assert _same_bits(getattr(qt, field), _stored(c[field])), (c["input"], c["bits"], field)
        assert _same_bits(dequantize(qt), _stored(c["dequantized"])), (c["input"], c["bits"])
    for c in MANIFEST["fake"]:
        if not c["input"].startswith("bf16"):
            assert _same_bits(fake_quantize(INPUTS[c["input"]], c["bits"]), _stored(c["out"])), c["input"]
    for c in MANIFEST["fixed"]:
        if not c["input"].startswith("bf16"):
            qt = fixed_quantize(INPUTS[c["input"]], c["bits"], *c["range"])
            assert _same_bits(dequantize(qt), _stored(c["dequantized"])), (c["input"], c["bits"])


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_isquant_error_on_a_crossing_tensor_is_within_half_a_step(case, bits):
    """DESIGN invariant 4 on the torch model's own activations: per element, at most
    (max - min) / (2^b - 1) / 2 of its sample's range."""
    name = case.meta["splits"][len(case.meta["splits"]) // 2]["name"]
    t = case.ref(f"split.{name}.crossing_0")
    frame = encode([t], bits, "blosc_lz4")
    (y,) = decode(frame)
    flat = t.reshape(t.shape[0], -1).astype(np.float64)
    bound = (flat.max(1) - flat.min(1)) / (2**bits - 1) / 2
    err = np.abs(y.reshape(t.shape[0], -1) - flat).max(1)
    assert np.all(err <= bound * (1 + 1e-5) + 1e-7), (err, bound)
    assert len(frame) < t.nbytes  # the frame is smaller than float32 even with its side information
