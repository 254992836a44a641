"""CIFAR-100 from the python pickles: layout, fine/coarse labels, validation, the restricted unpickler."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch

from nestflex.data import (
    CIFAR100,
    CIFAR100_COARSE_CLASSES,
    CIFAR100_FINE_CLASSES,
    CIFAR100_MEAN,
    CIFAR100_STD,
    cifar100_available,
    cifar100_classes,
    load_cifar100,
)
from nestflex.data import cifar as cifar_mod
from nestflex.data.cifar100 import find_cifar100_dir
from nestflex.errors import DataError
from tests.data.formats import cifar100_batch, make_fake_cifar100, write_pickle


@pytest.fixture
def fake(tmp_path):
    return make_fake_cifar100(tmp_path)


def test_class_names():
    assert len(CIFAR100_FINE_CLASSES) == 100 == len(set(CIFAR100_FINE_CLASSES))
    assert len(CIFAR100_COARSE_CLASSES) == 20 == len(set(CIFAR100_COARSE_CLASSES))
    # the official meta files list both in alphabetical order
    assert list(CIFAR100_FINE_CLASSES) == sorted(CIFAR100_FINE_CLASSES)
    assert list(CIFAR100_COARSE_CLASSES) == sorted(CIFAR100_COARSE_CLASSES)
    assert cifar100_classes("coarse") == CIFAR100_COARSE_CLASSES and cifar100_classes() == CIFAR100_FINE_CLASSES
    assert len(CIFAR100_MEAN) == len(CIFAR100_STD) == 3


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("label_type", ["fine", "coarse"])
def test_load_fine_and_coarse(tmp_path, protocol, label_type):
    fake = make_fake_cifar100(tmp_path, protocol=protocol)
    images, targets, classes = load_cifar100(tmp_path, "train", label_type)
    batch = fake["train"]
    assert images.shape == (30, 3, 32, 32) and images.dtype == torch.uint8 and targets.dtype == torch.int64
    # rows: 1024 red, 1024 green, 1024 blue, each row-major 32x32
    assert torch.equal(images[3], torch.from_numpy(batch[b"data"][3].reshape(3, 32, 32)))
    assert images[0, 2, 5, 7] == batch[b"data"][0][2048 + 5 * 32 + 7]
    assert targets.tolist() == batch[f"{label_type}_labels".encode()]
    assert classes == cifar100_classes(label_type)  # from meta: its bytes names decoded
    test_images, test_targets, _ = load_cifar100(tmp_path, "test", label_type)
    assert test_images.shape == (12, 3, 32, 32)
    assert test_targets.tolist() == fake["test"][f"{label_type}_labels".encode()]


def test_str_keys_no_meta_no_subdir(tmp_path):
    batch = {k.decode(): v for k, v in cifar100_batch(8, seed=3).items()}
    write_pickle(tmp_path / "train", batch)
    write_pickle(tmp_path / "test", batch)
    assert find_cifar100_dir(tmp_path) == tmp_path and cifar100_available(tmp_path)
    _, targets, classes = load_cifar100(tmp_path, "test")
    assert targets.tolist() == batch["fine_labels"] and classes == CIFAR100_FINE_CLASSES  # standard names


def test_meta_names_are_used(fake):
    names = [f"class{i}" for i in range(20)]
    write_pickle(fake["dir"] / "meta", {"fine_label_names": list(CIFAR100_FINE_CLASSES), "coarse_label_names": names})
    assert load_cifar100(fake["root"], "test", "coarse")[2] == tuple(names)
    ds = CIFAR100(fake["root"], "test", "coarse")
    assert ds.classes == tuple(names) and ds.label_type == "coarse" and len(ds) == 12
    image, label = ds[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == fake["test"][b"coarse_labels"][0]


def test_missing_files(fake, tmp_path):
    (fake["dir"] / "test").unlink()
    assert not cifar100_available(fake["root"])
    match = (rf"CIFAR-100 not found in {fake['root']}: {fake['dir']} lacks test "
             r"\(expected cifar-100-python/train, test")
    with pytest.raises(DataError, match=match + r".*\)\. HINT: extract cifar-100-python\.tar\.gz"):
        load_cifar100(fake["root"])
    with pytest.raises(DataError, match=r"CIFAR-100 directory .*absent does not exist"):
        load_cifar100(tmp_path / "absent")


def test_bad_arguments(fake):
    with pytest.raises(DataError, match=r"`label_type` must be one of \['fine', 'coarse'\], got 'medium'\. HINT"):
        load_cifar100(fake["root"], "train", "medium")
    with pytest.raises(DataError, match=r"`split` must be 'train' or 'test', got 'val'"):
        load_cifar100(fake["root"], "val")


@pytest.mark.parametrize(
    ("change", "label_type", "match"),
    [
        ({b"fine_labels": [100] + [0] * 7}, "fine", r"fine_labels must lie in 0\.\.99, got range 0\.\.100"),
        ({b"coarse_labels": [20] + [0] * 7}, "coarse", r"coarse_labels must lie in 0\.\.19, got range 0\.\.20"),
        ({b"fine_labels": [0] * 7}, "fine", r"7 fine_labels for 8 images"),
        ({b"data": np.zeros((8, 1024), np.uint8)}, "fine", r"`data` must be a uint8 array of shape \(N, 3072\)"),
    ],
)
def test_wrong_content(fake, change, label_type, match):
    write_pickle(fake["dir"] / "test", {**cifar100_batch(8, seed=1), **change})
    with pytest.raises(DataError, match=rf"CIFAR-100 file {fake['dir'] / 'test'}: " + match):
        load_cifar100(fake["root"], "test", label_type)


def test_cifar10_batch_is_refused_with_a_hint(fake):
    write_pickle(fake["dir"] / "test", {"data": np.zeros((4, 3072), np.uint8), "labels": [0] * 4})
    with pytest.raises(DataError, match=r"test lacks key\(s\) \['fine_labels'\].*HINT: is it a CIFAR-10 or other"):
        load_cifar100(fake["root"], "test")


def test_bad_meta(fake):
    write_pickle(fake["dir"] / "meta", {b"fine_label_names": [b"a", b"b"]})
    with pytest.raises(DataError, match=r"meta: `fine_label_names` must be a list of 100 strings"):
        load_cifar100(fake["root"], "test")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_rejected(fake, tmp_path):
    marker = tmp_path / "pwned"
    write_pickle(fake["dir"] / "train", {**fake["train"], b"x": _Evil(marker)})
    match = (r"CIFAR-100 file .*train is corrupt or not a CIFAR-100 python batch "
             r".*'(posix|os|nt)\.system' is forbidden")
    with pytest.raises(DataError, match=match):
        load_cifar100(fake["root"])
    assert not marker.exists()


def test_codecs_encode_only_builds_latin1_bytes():
    # protocol 2 from Python 3 stores bytes as _codecs.encode(text, "latin1"): allowed, and only that
    encode = cifar_mod._NumpyOnlyUnpickler(io.BytesIO(b"")).find_class("_codecs", "encode")
    assert encode("\xff\x00", "latin1") == b"\xff\x00"
    with pytest.raises(pickle.UnpicklingError, match=r"only as encode\(str, 'latin1'\), got encoding 'rot13'"):
        encode("abc", "rot13")


def test_datamodule(fake):
    from nestflex.data import CIFAR100DataModule

    dm = CIFAR100DataModule(fake["root"], batch_size=8, val_size=6)
    assert dm.num_classes == 100 and dm.input_shape == (3, 32, 32) and dm.classes == CIFAR100_FINE_CLASSES
    assert dm.mean == CIFAR100_MEAN and dm.std == CIFAR100_STD and dm.name == "cifar100" and not dm.synthetic
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and len(dm.val_dataset) == 6 and len(dm.test_dataset) == 12
    assert dm.describe()["label_type"] == "fine"
    coarse = CIFAR100DataModule(fake["root"], label_type="coarse", val_size=6)
    assert coarse.num_classes == 20 and coarse.classes[0] == "aquatic_mammals"
    coarse.setup()
    assert int(coarse.test_dataset.targets.max()) < 20
    with pytest.raises(DataError, match=r"`label_type` must be one of"):
        CIFAR100DataModule(fake["root"], label_type="superclass")


def test_resolve_cifar100(fake, tmp_path):
    from nestflex.data import CIFAR100DataModule, resolve_data

    dm, message = resolve_data("cifar100", fake["root"], label_type="coarse", val_size=5)
    assert isinstance(dm, CIFAR100DataModule) and dm.label_type == "coarse" and dm.val_size == 5
    assert message == f"data: CIFAR-100 found in {fake['dir']} (coarse labels, 20 classes)"
    assert resolve_data("cifar100", fake["root"])[1].endswith("(fine labels, 100 classes)")
    match = r"CIFAR-100 directory .*none does not exist \(expected cifar-100-python/train"
    with pytest.raises(DataError, match=match):
        resolve_data("cifar100", tmp_path / "none")
    with pytest.raises(DataError, match=r"`download=True` with kind 'cifar100': nestflex never downloads CIFAR-100"):
        resolve_data("cifar100", fake["root"], download=True)
    match = r"DataModule argument\(s\) \['label_type'\] apply to kind 'cifar100' only, got kind 'svhn'\. HINT"
    with pytest.raises(DataError, match=match):
        resolve_data("svhn", fake["root"], label_type="fine")
