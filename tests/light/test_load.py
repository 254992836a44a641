"""`nestflex.deploy.load` and its validation on the base install, and what it reads matches what the
training side wrote (``make_bundles.py``'s description)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import nestflex.deploy as nd
from tests.light.conftest import ATOL

FIXTURES = Path(__file__).resolve().parents[1] / "deploy" / "fixtures"


def test_the_bundle_reads_as_written(case):
    b = case.bundle
    meta = case.meta
    assert b.num_levels == meta["levels"]
    assert list(b.input_spec["shape"]) == meta["input_shape"]
    assert sorted(b.exit_sets) == sorted(meta["exit_sets"])
    for key, ex in meta["exit_sets"].items():
        got = b.exit_sets[key]
        assert list(got["names"]) == ex["names"]
        assert (list(got["thresholds"]), got["confidence"], got["fallback"], got["backbone"]) == (
            ex["thresholds"], ex["confidence"], ex["fallback"], ex["backbone"])
    assert [s["name"] for s in b.splits] == [s["name"] for s in meta["splits"]]
    assert [r["accuracy"] for r in b.levels] == pytest.approx([0.80, 0.81, 0.82])
    samples = b.samples()
    assert (samples is not None) == meta["samples"]
    if samples is not None:
        x, y = samples
        assert isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == (16, *meta["input_shape"])
        assert isinstance(y, np.ndarray) and y.dtype == np.int64 and y.shape == (16,)
    assert any(rel.endswith(".onnx") for rel in b.manifest["files"]) == meta["onnx"]


@pytest.fixture
def copy(case, tmp_path) -> Path:
    return Path(shutil.copytree(case.path, tmp_path / "copy.nfx"))


def _rewrite(bundle: Path, edit, redigest: bool = True) -> None:
    """Edit the manifest; with ``redigest``, as the exporter would have written it (digest updated)."""
    path = bundle / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    if redigest:
        m["integrity"]["manifest_sha256"] = ""
        body = json.dumps(m, indent=2, sort_keys=True).encode()
        m["integrity"]["manifest_sha256"] = hashlib.sha256(body).hexdigest()
    path.write_text(json.dumps(m, indent=2, sort_keys=True))


def test_a_flipped_byte_in_the_weights_is_refused(copy):
    path = copy / "weights.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(nd.BundleError, match=r"is corrupt or was tampered with: file 'weights.safetensors' fails its "
                                             r"sha256 checksum.*HINT: copy the bundle again"):
        nd.load(copy)


def test_an_edited_manifest_is_refused(copy):
    _rewrite(copy, lambda m: m["exit_sets"][0].update(thresholds=[0.1, 0.1]), redigest=False)
    with pytest.raises(nd.BundleError, match=r"manifest.json was modified after export \(its digest does not match"):
        nd.load(copy)


def test_a_missing_file_and_a_missing_bundle_are_refused(copy):
    (copy / "weights.safetensors").unlink()
    with pytest.raises(nd.BundleError, match=r"file 'weights.safetensors' is missing"):
        nd.load(copy)
    shutil.rmtree(copy)
    with pytest.raises(nd.BundleError, match=r"copy.nfx' does not exist. HINT: write one with"):
        nd.load(copy)


def test_not_a_bundle_is_explained(tmp_path):
    (tmp_path / "file.nfx").write_text("x")
    with pytest.raises(nd.BundleError, match=r"file.nfx' is a file, not a bundle directory"):
        nd.load(tmp_path / "file.nfx")
    (tmp_path / "empty.nfx").mkdir()
    with pytest.raises(nd.BundleError, match=r"empty.nfx' has no manifest.json"):
        nd.load(tmp_path / "empty.nfx")
    (tmp_path / "empty.nfx" / "manifest.json").write_text("{not json")
    with pytest.raises(nd.BundleError, match=r"manifest.json is not valid JSON"):
        nd.load(tmp_path / "empty.nfx")


def test_a_schema_1_bundle_loads_and_runs_as_its_training_model(tmp_path):
    """The fixture written by the exporter of commit 45c4ded (tests/deploy/fixtures/README.md):
    upgraded on read, every level and exit of both sets equal to the training model it came from."""
    from safetensors.numpy import load_file

    bundle = nd.load(shutil.copytree(FIXTURES / "bundle_v1.nfx", tmp_path / "v1.nfx"))  # no tuned plan beside it
    ref = load_file(str(FIXTURES / "bundle_v1_reference.safetensors"))
    x = ref["x"]
    rt = nd.CapacityRuntime(bundle, level=0)
    for k in range(bundle.num_levels):
        rt.set_level(k)
        np.testing.assert_allclose(rt(x), ref[f"level_{k}"], rtol=0, atol=ATOL, err_msg=f"level {k}")
    for key in ("exits", "flex_exits"):
        prog = nd.ProgressiveRuntime(bundle, exit_set=key)
        for k, got in enumerate(prog.all_exits(x)):
            np.testing.assert_allclose(got, ref[f"{key}_{k}"], rtol=0, atol=ATOL, err_msg=f"{key} exit {k}")
