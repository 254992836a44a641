"""Corrupt, tampered, missing or future bundles are refused with one clear message."""

import json
import shutil

import pytest

import nestflex.deploy as nd
from nestflex.deploy.bundle import manifest_digest
from tests.export.bundles import write_bundle


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    info, _, _ = write_bundle(tmp_path_factory.mktemp("load"), onnx=False)
    return info["bundle"]


@pytest.fixture
def bundle(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "copy.nfx")


def _rewrite(root, edit, redigest=True):
    path = root / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    if redigest:
        m["integrity"]["manifest_sha256"] = manifest_digest(m)
    path.write_text(json.dumps(m))


def test_a_good_bundle_loads(bundle):
    b = nd.load(bundle)
    assert b.num_levels == 3 and len(b.exits["names"]) == 3 and "levels=3, exits=3" in repr(b)
    assert {"level", "accuracy", "params", "macs", "memory_mb", "latency_ms"} <= set(b.levels[0])
    assert b.manifest["levels"] is b.levels


def test_a_flipped_byte_in_the_weights_is_refused(bundle):
    path = bundle / "weights.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(nd.BundleError, match=r"is corrupt or was tampered with: file 'weights.safetensors' fails its "
                                             r"sha256 checksum.*HINT: copy the bundle again"):
        nd.load(bundle)


def test_an_edited_manifest_is_refused(bundle):
    _rewrite(bundle, lambda m: m["exits"].update(thresholds=[0.1, 0.1]), redigest=False)
    with pytest.raises(nd.BundleError, match=r"manifest.json was modified after export \(its digest does not match"):
        nd.load(bundle)


def test_a_missing_file_is_refused(bundle):
    (bundle / "profiles" / "exit_calibration.json").unlink(missing_ok=True)
    (bundle / "weights.safetensors").unlink()
    with pytest.raises(nd.BundleError, match=r"file 'weights.safetensors' is missing"):
        nd.load(bundle)
    shutil.rmtree(bundle)
    with pytest.raises(nd.BundleError, match=r"copy.nfx' does not exist. HINT: write one with"):
        nd.load(bundle)


def test_a_future_schema_version_is_refused(bundle):
    _rewrite(bundle, lambda m: m.update(schema_version=nd.SCHEMA_VERSION + 1))
    with pytest.raises(nd.BundleError, match=rf"has schema_version {nd.SCHEMA_VERSION + 1}, written by nestflex .*; "
                                             rf"this runtime \(nestflex .*\) reads schema_version <= 1. HINT: upgrade"):
        nd.load(bundle)


def test_another_major_producer_version_is_refused(bundle):
    _rewrite(bundle, lambda m: m["producer"].update(version="7.0.0"))
    with pytest.raises(nd.BundleError, match=r"written by nestflex 7.0.0, a different major version"):
        nd.load(bundle)


def test_a_manifest_that_does_not_match_the_weights_is_refused(bundle):
    def shrink(m):
        name = next(iter(m["weights"]["tensors"]))
        m["weights"]["tensors"][name]["shape"][0] += 1

    _rewrite(bundle, shrink)
    with pytest.raises(nd.BundleError, match=r"the manifest does not match the weights: tensor 'backbone\..*' is "
                                             r"float32\[.*\] in weights.safetensors, the manifest says"):
        nd.load(bundle)


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


@pytest.fixture(scope="module")
def flex_pristine(tmp_path_factory):
    from tests.export.bundles import write_flex_bundle

    info, *_ = write_flex_bundle(tmp_path_factory.mktemp("load_flex"), onnx=False)
    return info["bundle"]


@pytest.fixture
def flex_bundle(flex_pristine, tmp_path):
    return shutil.copytree(flex_pristine, tmp_path / "flex.nfx")


def test_a_flipped_filter_index_of_a_flex_exit_is_refused(flex_bundle):
    path = flex_bundle / "weights.safetensors"
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start, _ = json.loads(data[8 : 8 + n])["flex_exits.0.index"]["data_offsets"]
    data[8 + n + start] ^= 0x01  # another filter feeds the exit: wrong answers, same shapes
    path.write_bytes(bytes(data))
    with pytest.raises(nd.BundleError, match=r"file 'weights.safetensors' fails its sha256 checksum"):
        nd.load(flex_bundle)


def test_an_inconsistent_exit_set_is_refused_in_one_message(flex_bundle):
    def break_both(m):
        m["flex_exits"]["thresholds"] = [0.5]
        m["exits"]["backbone"] = "own"  # without its program

    _rewrite(flex_bundle, break_both)
    with pytest.raises(nd.BundleError, match=r"the exits in manifest.json are inconsistent: `exits.backbone` is 'own': "
                                             r"expected 'shared', or 'own' with a `program`; `flex_exits` has 2 early "
                                             r"exits but \{'taps': 2, 'heads': 2, 'thresholds': 1\}. HINT: the manifest"):
        nd.load(flex_bundle)


def test_a_bundle_from_before_flex_exits_still_loads_and_runs(flex_bundle):
    # schema 1 bundles written before the `flex_exits` set and the `kind` key: the change is additive
    def older(m):
        del m["flex_exits"], m["exits"]["kind"]

    _rewrite(flex_bundle, older)
    b = nd.load(flex_bundle)
    assert list(b.exit_sets) == ["exits"] and b.flex_exits is None
    assert b.progressive()(__import__("torch").randn(2, 3, 32, 32)).logits.shape == (2, 10)
