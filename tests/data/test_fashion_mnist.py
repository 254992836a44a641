"""Fashion-MNIST from IDX files: MNIST's reader with its own folders, classes, constants and messages."""

from __future__ import annotations

import gzip

import pytest
import torch

from nestflex.data import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    FashionMNIST,
    fashion_mnist_available,
    load_fashion_mnist,
)
from nestflex.data.fashion_mnist import find_fashion_mnist_dir
from nestflex.data.mnist import MNIST_FILES
from nestflex.errors import DataError
from tests.data.mnist_files import idx_bytes, make_fake_mnist

TRAIN_IMAGES = MNIST_FILES["train"][0]


@pytest.fixture
def fake(tmp_path):
    return make_fake_mnist(tmp_path, n_train=40, n_test=20, subdir="FashionMNIST/raw")


@pytest.mark.parametrize(("subdir", "gz"), [("", False), ("raw", True), ("FashionMNIST/raw", True)])
def test_load_every_layout(tmp_path, subdir, gz):
    written = make_fake_mnist(tmp_path, n_train=30, n_test=20, gz=gz, subdir=subdir)
    assert fashion_mnist_available(tmp_path) and find_fashion_mnist_dir(tmp_path) == written["dir"]
    images, targets = load_fashion_mnist(tmp_path, "train")
    assert images.shape == (30, 1, 28, 28) and images.dtype == torch.uint8 and targets.dtype == torch.int64
    assert torch.equal(images[:, 0], torch.from_numpy(written["train"][0]))
    assert targets.tolist() == written["train"][1].tolist()
    assert load_fashion_mnist(tmp_path, "test")[1].tolist() == written["test"][1].tolist()


def test_dataset_and_constants(fake):
    ds = FashionMNIST(fake["root"], "test")
    image, label = ds[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and label == int(fake["test"][1][0])
    assert ds.classes == FASHION_MNIST_CLASSES and len(ds) == 20 and ds.split == "test"
    assert FASHION_MNIST_CLASSES[0] == "T-shirt/top" and FASHION_MNIST_CLASSES[9] == "Ankle boot"
    assert len(set(FASHION_MNIST_CLASSES)) == 10
    assert FASHION_MNIST_MEAN == (0.2860,) and FASHION_MNIST_STD == (0.3530,)


def test_mnist_folder_is_not_fashion(tmp_path):
    # same file names: only the folder tells the datasets apart, so MNIST's own folder is not searched
    make_fake_mnist(tmp_path, n_train=10, n_test=10, subdir="MNIST/raw")
    assert not fashion_mnist_available(tmp_path)
    match = (rf"Fashion-MNIST not found in {tmp_path}: .* lacks train-images-idx3-ubyte, .*t10k-labels-idx1-ubyte "
             r"\(expected .*\)\. HINT: put the four standard Fashion-MNIST files .*`FashionMNIST/raw/`")
    with pytest.raises(DataError, match=match):
        load_fashion_mnist(tmp_path)


def test_messages_name_fashion_mnist(fake):
    data = bytearray(idx_bytes(fake["train"][0]))
    data[0] = 0x1A
    path = fake["dir"] / f"{TRAIN_IMAGES}.gz"
    path.write_bytes(gzip.compress(bytes(data), mtime=0))
    match = rf"Fashion-MNIST file {path} has magic number 0x1a000803, not an IDX file .*standard Fashion-MNIST IDX"
    with pytest.raises(DataError, match=match):
        load_fashion_mnist(fake["root"])
    with pytest.raises(DataError, match=r"`split` must be 'train' or 'test', got 'val'"):
        load_fashion_mnist(fake["root"], "val")


def test_datamodule_pads_like_mnist_and_flips(fake):
    from nestflex.data import FashionMNISTDataModule

    dm = FashionMNISTDataModule(fake["root"], batch_size=8, val_size=10)
    assert dm.input_shape == (1, 32, 32) and dm.num_classes == 10 and dm.classes == FASHION_MNIST_CLASSES
    assert dm.mean == FASHION_MNIST_MEAN and dm.std == FASHION_MNIST_STD and dm.flip and dm.border == 2
    assert dm.name == "fashion_mnist" and not dm.synthetic
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 1, 32, 32) and len(dm.val_dataset) == 10 and len(dm.train_dataset) == 30
    image, _ = dm.test_dataset[0]
    expected = (torch.from_numpy(fake["test"][0][0]).float() / 255 - FASHION_MNIST_MEAN[0]) / FASHION_MNIST_STD[0]
    assert torch.allclose(image[0, 2:30, 2:30], expected)
    assert dm.describe()["data_dir"] == str(fake["root"])


def test_resolve_fashion_mnist(fake, tmp_path):
    from nestflex.data import FashionMNISTDataModule, resolve_data

    dm, message = resolve_data("fashion_mnist", fake["root"], batch_size=4, val_size=5, train_size=7)
    assert isinstance(dm, FashionMNISTDataModule) and dm.batch_size == 4 and dm.val_size == 5
    assert message == f"data: Fashion-MNIST found in {fake['dir']} (28x28 images padded to 1x32x32)"
    with pytest.raises(DataError, match=r"Fashion-MNIST directory .*nope does not exist \(expected train-images"):
        resolve_data("fashion_mnist", tmp_path / "nope")
    match = r"`download=True` with kind 'fashion_mnist': nestflex never downloads Fashion-MNIST\. HINT: put the four"
    with pytest.raises(DataError, match=match):
        resolve_data("fashion_mnist", fake["root"], download=True)
