"""CIFAR-10 loading from python batches: layout, validation, restricted unpickling, download."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from nestflex.data import cifar as cifar_mod
from nestflex.data.cifar import (
    CIFAR10,
    CIFAR10_CLASSES,
    CIFAR10_DIRNAME,
    cifar10_available,
    download_cifar10,
    find_cifar10_dir,
    load_cifar10,
)
from nestflex.errors import DataError, NestflexError

N = 24  # images per fake batch (conftest.N_PER_BATCH)
_ZEROS = np.zeros((N, 3072), np.uint8)


# ---- loading ------------------------------------------------------------------------------------


def test_load_train_and_test_shapes_and_pixels(fake_cifar):
    images, targets, classes = load_cifar10(fake_cifar["root"], "train")
    assert images.shape == (5 * N, 3, 32, 32) and images.dtype == torch.uint8
    assert targets.shape == (5 * N,) and targets.dtype == torch.int64
    assert classes == CIFAR10_CLASSES
    data1, labels1 = fake_cifar["batches"]["data_batch_1"]
    # Row layout: 1024 red, 1024 green, 1024 blue, each row-major.
    assert torch.equal(images[0], torch.from_numpy(data1[0].reshape(3, 32, 32)))
    assert images[0, 1, 2, 5] == data1[0][1024 + 2 * 32 + 5]
    assert targets[:N].tolist() == labels1
    data5, labels5 = fake_cifar["batches"]["data_batch_5"]
    assert targets[-N:].tolist() == labels5
    test_images, test_targets, _ = load_cifar10(fake_cifar["root"], "test")
    assert test_images.shape == (N, 3, 32, 32)
    assert test_targets.tolist() == fake_cifar["batches"]["test_batch"][1]


def test_batches_directly_in_data_dir(tmp_path, cifar_factory):
    cifar_factory(tmp_path, subdir=False, meta=False)
    assert find_cifar10_dir(tmp_path) == tmp_path
    images, _, classes = load_cifar10(tmp_path, "test")
    assert len(images) == N and classes == CIFAR10_CLASSES  # no meta file: standard names


def test_available(tmp_path, fake_cifar):
    assert cifar10_available(fake_cifar["root"])
    assert cifar10_available(fake_cifar["dir"])
    assert not cifar10_available(tmp_path / "nowhere")
    (fake_cifar["dir"] / "data_batch_2").unlink()
    assert not cifar10_available(fake_cifar["root"])


def test_dataset_items(fake_cifar):
    ds = CIFAR10(fake_cifar["root"], "test")
    x, y = ds[3]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32)
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert torch.allclose(x * 255, ds.images[3].float())
    assert isinstance(y, int) and y == fake_cifar["batches"]["test_batch"][1][3]
    assert len(ds) == N and ds.classes == CIFAR10_CLASSES and ds.synthetic is False
    ds_t = CIFAR10(fake_cifar["root"], "test", transform=lambda im: im.float() * 0 + 7)
    assert float(ds_t[0][0].mean()) == 7.0


def test_legacy_numpy_core_module_name(tmp_path, cifar_factory):
    # The official files were pickled by numpy 1 and name numpy.core.multiarray; files written
    # by numpy 2 name numpy._core. Rewrite the global to the legacy spelling: it must still load.
    out = cifar_factory(tmp_path)
    data, labels = out["batches"]["test_batch"]
    raw = pickle.dumps({"data": data, "labels": labels}, protocol=3)
    assert b"numpy._core.multiarray" in raw or b"numpy.core.multiarray" in raw
    (out["dir"] / "test_batch").write_bytes(raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    images, targets, _ = load_cifar10(tmp_path, "test")
    assert torch.equal(images.flatten(1), torch.from_numpy(data)) and targets.tolist() == labels


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_pickle_protocols(tmp_path, cifar_factory, write_cifar_batch, protocol):
    out = cifar_factory(tmp_path)
    data, labels = out["batches"]["test_batch"]
    write_cifar_batch(out["dir"] / "test_batch", data, np.asarray(labels, dtype=np.int64), protocol=protocol)
    _, targets, _ = load_cifar10(tmp_path, "test")
    assert targets.tolist() == labels


# ---- errors -------------------------------------------------------------------------------------


def test_missing_directory(tmp_path):
    match = r"CIFAR-10 directory .*nowhere does not exist .*data_batch_1\.\.5.*HINT.*--data synthetic"
    with pytest.raises(DataError, match=match):
        load_cifar10(tmp_path / "nowhere")


def test_missing_file(fake_cifar):
    (fake_cifar["dir"] / "data_batch_3").unlink()
    (fake_cifar["dir"] / "test_batch").unlink()
    match = r"CIFAR-10 not found in .*lacks data_batch_3, test_batch.*HINT: pass `download=True`"
    with pytest.raises(DataError, match=match):
        CIFAR10(fake_cifar["root"], "train")


def test_empty_directory_names_expected_files(tmp_path):
    with pytest.raises(DataError, match=r"expected cifar-10-batches-py/data_batch_1\.\.5, test_batch"):
        load_cifar10(tmp_path, "test")


def test_bad_split(fake_cifar):
    with pytest.raises(DataError, match=r"`split` must be 'train' or 'test', got 'val'"):
        load_cifar10(fake_cifar["root"], "val")


def test_truncated_file(fake_cifar):
    path = fake_cifar["dir"] / "test_batch"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"test_batch is corrupt or not a CIFAR-10 python batch"):
        load_cifar10(fake_cifar["root"], "test")


def test_garbage_file(fake_cifar):
    (fake_cifar["dir"] / "data_batch_4").write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(DataError, match=r"data_batch_4 is corrupt"):
        load_cifar10(fake_cifar["root"], "train")


def test_not_a_dict(fake_cifar):
    (fake_cifar["dir"] / "test_batch").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(DataError, match=r"test_batch holds a list, expected a dict"):
        load_cifar10(fake_cifar["root"], "test")


def test_missing_key(fake_cifar):
    data, _ = fake_cifar["batches"]["test_batch"]
    (fake_cifar["dir"] / "test_batch").write_bytes(pickle.dumps({"data": data, "fine_labels": [0] * N}))
    with pytest.raises(DataError, match=r"test_batch lacks key\(s\) \['labels'\].*HINT"):
        load_cifar10(fake_cifar["root"], "test")


@pytest.mark.parametrize(
    ("data", "labels", "match"),
    [
        (
            np.zeros((N, 1000), np.uint8),
            [0] * N,
            r"`data` must be a uint8 array of shape \(N, 3072\), got uint8 \(24, 1000\)",
        ),
        (np.zeros((N, 3072), np.float32), [0] * N, r"`data` must be a uint8 array .*float32"),
        ([[0] * 3072] * N, [0] * N, r"`data` must be a uint8 array .*got list"),
        (_ZEROS, [0] * (N - 1), r"23 labels for 24 images"),
        (_ZEROS, [0] * (N - 1) + [10], r"labels must lie in 0\.\.9, got range 0\.\.10"),
        (_ZEROS, [-1] + [0] * (N - 1), r"labels must lie in 0\.\.9, got range -1\.\.0"),
        (_ZEROS, ["cat"] * N, r"`labels` must be a list of integers"),
    ],
)
def test_wrong_content(fake_cifar, write_cifar_batch, data, labels, match):
    write_cifar_batch(fake_cifar["dir"] / "test_batch", data, labels)
    with pytest.raises(DataError, match=r"test_batch: " + match):
        load_cifar10(fake_cifar["root"], "test")


def test_bad_meta(fake_cifar):
    (fake_cifar["dir"] / "batches.meta").write_bytes(pickle.dumps({"label_names": ["a", "b"]}))
    with pytest.raises(DataError, match=r"batches\.meta: `label_names` must be a list of 10 strings"):
        load_cifar10(fake_cifar["root"], "test")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_imports_os_system_is_rejected(fake_cifar, tmp_path):
    marker = tmp_path / "pwned"
    data, labels = fake_cifar["batches"]["test_batch"]
    payload = pickle.dumps({"data": data, "labels": labels, "x": _Evil(marker)})
    assert b"system" in payload
    (fake_cifar["dir"] / "test_batch").write_bytes(payload)
    match = r"test_batch is corrupt .*global '(posix|os|nt)\.system' is forbidden"
    with pytest.raises(DataError, match=match):
        load_cifar10(fake_cifar["root"], "test")
    assert not marker.exists()


@pytest.mark.parametrize(
    "target", [("builtins", "eval"), ("subprocess", "Popen"), ("numpy", "load"), ("torch", "load")]
)
def test_unpickler_allows_only_numpy_array_globals(target):
    unpickler = cifar_mod._NumpyOnlyUnpickler(io.BytesIO(b""))
    with pytest.raises(pickle.UnpicklingError, match="is forbidden"):
        unpickler.find_class(*target)


def test_data_error_is_catchable_as_base_and_valueerror(tmp_path):
    with pytest.raises(NestflexError):
        load_cifar10(tmp_path / "x")
    with pytest.raises(ValueError):
        load_cifar10(tmp_path / "x")


# ---- download (network replaced: no test touches the internet) ----------------------------------


def _fake_archive(tmp_path: Path, cifar_factory, evil_member: bool = False) -> Path:
    src = tmp_path / "src"
    cifar_factory(src)
    archive = tmp_path / "cifar.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / CIFAR10_DIRNAME, arcname=CIFAR10_DIRNAME)
        if evil_member:
            info = tarfile.TarInfo("../escaped.txt")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return archive


def _serve(monkeypatch, archive_bytes: bytes, set_md5: bool = True) -> list[str]:
    calls: list[str] = []

    def fake_fetch(url: str, dest: Path, timeout: float = 60.0) -> None:
        calls.append(url)
        Path(dest).write_bytes(archive_bytes)

    monkeypatch.setattr(cifar_mod, "_fetch", fake_fetch)
    if set_md5:
        monkeypatch.setattr(cifar_mod, "CIFAR10_MD5", hashlib.md5(archive_bytes).hexdigest())
    return calls


def test_download_md5_mismatch_raises_and_cleans_up(tmp_path, monkeypatch):
    calls = _serve(monkeypatch, b"not a tarball at all", set_md5=False)
    root = tmp_path / "data"
    match = r"has md5 [0-9a-f]{32}, expected c58f30108f718f92721af3b95e74349a; it was deleted"
    with pytest.raises(DataError, match=match):
        download_cifar10(root)
    assert calls == [cifar_mod.CIFAR10_URL]
    assert list(root.iterdir()) == []  # no temporary or partial files left behind
    assert not cifar10_available(root)


def test_download_extracts_atomically(tmp_path, monkeypatch, cifar_factory):
    archive = _fake_archive(tmp_path, cifar_factory)
    calls = _serve(monkeypatch, archive.read_bytes())
    root = tmp_path / "data"
    where = download_cifar10(root)
    assert where == root / CIFAR10_DIRNAME and cifar10_available(root)
    assert sorted(p.name for p in root.iterdir()) == [CIFAR10_DIRNAME]  # staging and archive gone
    assert len(load_cifar10(root, "train")[0]) == 5 * N
    assert download_cifar10(root) == where and len(calls) == 1  # present: no second fetch
    ds = CIFAR10(root, "test", download=True)
    assert len(ds) == N and len(calls) == 1


def test_download_rejects_unsafe_archive_member(tmp_path, monkeypatch, cifar_factory):
    archive = _fake_archive(tmp_path, cifar_factory, evil_member=True)
    _serve(monkeypatch, archive.read_bytes())
    root = tmp_path / "data"
    with pytest.raises(DataError, match=r"cannot extract the CIFAR-10 archive"):
        download_cifar10(root)
    assert not (tmp_path / "escaped.txt").exists() and not (root / "escaped.txt").exists()
    assert list(root.iterdir()) == []


def test_download_network_error(tmp_path, monkeypatch):
    def offline(url, dest, timeout=60.0):
        raise OSError("network is unreachable")

    monkeypatch.setattr(cifar_mod, "_fetch", offline)
    with pytest.raises(DataError, match=r"downloading CIFAR-10 from .* failed: network is unreachable.*HINT"):
        download_cifar10(tmp_path / "data")


def test_download_refuses_to_overwrite_incomplete_copy(fake_cifar, monkeypatch):
    (fake_cifar["dir"] / "data_batch_1").unlink()
    calls = _serve(monkeypatch, b"unused")
    with pytest.raises(DataError, match=r"exists but is incomplete.*HINT: delete it"):
        download_cifar10(fake_cifar["root"])
    assert calls == []


def test_nothing_is_downloaded_unless_asked(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("downloaded without download=True")

    monkeypatch.setattr(cifar_mod, "_fetch", forbidden)
    with pytest.raises(DataError, match="does not exist"):
        CIFAR10(tmp_path / "data", "train")
