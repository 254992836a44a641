"""MNIST from IDX files: layouts, gzip, validation of damaged files, the DataModule and resolve_data."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from nestflex.data import MNIST, MNIST_CLASSES, MNIST_MEAN, MNIST_STD, load_mnist, mnist_available, read_idx
from nestflex.data.mnist import MNIST_FILES, find_mnist_dir
from nestflex.errors import DataError, NestflexError
from tests.data.mnist_files import idx_bytes, make_fake_mnist, write_idx

TRAIN_IMAGES, TRAIN_LABELS = MNIST_FILES["train"]


@pytest.fixture
def fake(tmp_path):
    return make_fake_mnist(tmp_path, n_train=120, n_test=40)


# ---- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("subdir", ["", "raw", "MNIST/raw"])
def test_load_every_layout_gzipped_or_not(tmp_path, gz, subdir):
    written = make_fake_mnist(tmp_path, n_train=30, n_test=20, gz=gz, subdir=subdir)
    assert mnist_available(tmp_path) and find_mnist_dir(tmp_path) == written["dir"]
    images, targets = load_mnist(tmp_path, "train")
    assert images.shape == (30, 1, 28, 28) and images.dtype == torch.uint8
    assert targets.dtype == torch.int64
    raw_images, raw_labels = written["train"][:2]
    assert torch.equal(images[:, 0], torch.from_numpy(raw_images)) and targets.tolist() == raw_labels.tolist()
    test_images, test_targets = load_mnist(tmp_path, "test")
    assert test_images.shape == (20, 1, 28, 28) and test_targets.tolist() == written["test"][1].tolist()


def test_gzip_detected_by_content_not_name(fake):
    # a gzipped file without the .gz suffix still reads
    path = fake["dir"] / f"{TRAIN_LABELS}.gz"
    path.rename(fake["dir"] / TRAIN_LABELS)
    assert load_mnist(fake["root"])[1].tolist() == fake["train"][1].tolist()


def test_read_idx_generic(tmp_path):
    path = write_idx(tmp_path / "x-idx2-ubyte", np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert read_idx(path).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert read_idx(path, ndim=2).shape == (2, 3)


def test_dataset(fake):
    ds = MNIST(fake["root"], "test")
    image, label = ds[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and 0 <= image.min() <= image.max() <= 1
    assert label == int(fake["test"][1][3]) and ds.classes == MNIST_CLASSES == tuple("0123456789")
    assert len(ds) == 40 and ds.split == "test"


# ---- damaged files ------------------------------------------------------------------------------


def _replace(fake, name: str, data: bytes, gz: bool = True) -> str:
    path = fake["dir"] / f"{name}.gz"
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return str(path)


def test_bad_magic(fake):
    data = bytearray(idx_bytes(fake["train"][0]))
    data[0] = 0x1A  # not an IDX file
    path = _replace(fake, TRAIN_IMAGES, bytes(data))
    with pytest.raises(DataError, match=rf"MNIST file {path} has magic number 0x1a000803, not an IDX file .*HINT"):
        load_mnist(fake["root"])


def test_wrong_type_code(fake):
    path = _replace(fake, TRAIN_IMAGES, idx_bytes(fake["train"][0], type_code=0x0D))
    with pytest.raises(DataError, match=rf"{path} has magic number 0x00000d03: IDX type 0x0d \(float32\), expected "
                                        r"0x08 \(unsigned byte\)"):
        load_mnist(fake["root"])


def test_images_and_labels_swapped(fake):
    labels, images = fake["train"][1], fake["train"][0]
    _replace(fake, TRAIN_IMAGES, idx_bytes(labels))
    path = _replace(fake, TRAIN_LABELS, idx_bytes(images))
    with pytest.raises(DataError, match=r"magic number 0x00000801: 1 dimension\(s\), expected 3 \(magic 0x00000803\)"
                                        r".*are the two swapped\?"):
        load_mnist(fake["root"])
    _replace(fake, TRAIN_IMAGES, idx_bytes(images))
    with pytest.raises(DataError, match=rf"{path} has magic number 0x00000803: 3 dimension\(s\), expected 1"):
        load_mnist(fake["root"])


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_body(fake, gz):
    data = idx_bytes(fake["train"][0])
    if not gz:
        (fake["dir"] / f"{TRAIN_IMAGES}.gz").unlink()
        path = fake["dir"] / TRAIN_IMAGES
        path.write_bytes(data[:-100])
    else:
        path = _replace(fake, TRAIN_IMAGES, data[:-100])
    with pytest.raises(DataError, match=rf"MNIST file {path} is truncated: its header announces shape \(120, 28, 28\),"
                                        r" i\.e\. 94,096 bytes with the header, but it holds 93,996\. HINT: copy"):
        load_mnist(fake["root"])


def test_trailing_bytes(fake):
    path = _replace(fake, TRAIN_LABELS, idx_bytes(fake["train"][1]) + b"\x00\x01")
    with pytest.raises(DataError, match=rf"{path} is longer than its header says: .*shape \(120,\), i\.e\. 128 bytes"):
        load_mnist(fake["root"])


@pytest.mark.parametrize(("data", "match"), [
    (b"", r"is 0 bytes long, too short for an IDX magic number"),
    (bytes([0, 0, 8, 3, 0, 0, 0]), r"is truncated inside its header: 7 bytes, .* needs 16"),
])
def test_truncated_header(fake, data, match):
    path = _replace(fake, TRAIN_IMAGES, data)
    with pytest.raises(DataError, match=rf"MNIST file {path} {match}"):
        load_mnist(fake["root"])


def test_truncated_gzip_stream(fake):
    path = fake["dir"] / f"{TRAIN_IMAGES}.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match=rf"MNIST file {path} is a corrupt or truncated gzip file .*HINT"):
        load_mnist(fake["root"])


def test_label_image_count_mismatch(fake):
    path = _replace(fake, TRAIN_LABELS, idx_bytes(fake["train"][1][:100]))
    with pytest.raises(DataError, match=rf"MNIST files .*{TRAIN_IMAGES}.gz and {path} disagree: 120 images but 100 "
                                        r"labels\. HINT: the two files come from different copies"):
        load_mnist(fake["root"])


def test_wrong_image_size(fake):
    _replace(fake, TRAIN_IMAGES, idx_bytes(np.zeros((120, 20, 20), np.uint8)))
    with pytest.raises(DataError, match=r"holds images of 20x20 pixels, expected 28x28\. HINT: is it EMNIST"):
        load_mnist(fake["root"])


def test_label_out_of_range(fake):
    labels = fake["train"][1].copy()
    labels[5] = 26
    _replace(fake, TRAIN_LABELS, idx_bytes(labels))
    with pytest.raises(DataError, match=r"labels must lie in 0\.\.9, got values up to 26"):
        load_mnist(fake["root"])


def test_missing_files_are_named(fake, tmp_path):
    (fake["dir"] / "t10k-labels-idx1-ubyte.gz").unlink()
    assert not mnist_available(fake["root"])
    with pytest.raises(DataError, match=rf"MNIST not found in {fake['root']}: {fake['dir']} lacks "
                                        r"t10k-labels-idx1-ubyte \(expected train-images-idx3-ubyte, .*\(each optionally \.gz\)\)\. "
                                        r"HINT: .*never downloads MNIST"):
        load_mnist(fake["root"], "train")
    with pytest.raises(DataError, match=r"MNIST directory .*nope does not exist"):
        load_mnist(tmp_path / "nope")


def test_bad_split_and_base_class(fake):
    with pytest.raises(DataError, match=r"`split` must be 'train' or 'test', got 'val'"):
        load_mnist(fake["root"], "val")
    with pytest.raises(NestflexError):
        load_mnist(fake["root"], "val")


# ---- DataModule and resolve_data ----------------------------------------------------------------


def test_datamodule_pads_to_32_and_never_flips(fake):
    from nestflex.data import MNISTDataModule

    dm = MNISTDataModule(fake["root"], batch_size=16, val_size=20)
    assert dm.input_shape == (1, 32, 32) and dm.mean == MNIST_MEAN and dm.std == MNIST_STD and not dm.flip
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 1, 32, 32) and len(dm.val_dataset) == 20 and len(dm.train_dataset) == 100
    image, label = dm.test_dataset[0]
    raw = torch.from_numpy(fake["test"][0][0]).float() / 255
    expected = (raw - MNIST_MEAN[0]) / MNIST_STD[0]
    assert image.shape == (1, 32, 32) and label == int(fake["test"][1][0])
    assert torch.allclose(image[0, 2:30, 2:30], expected)  # the digit, centred
    background = (0 - MNIST_MEAN[0]) / MNIST_STD[0]
    assert torch.allclose(image[0, :2], torch.full((2, 32), background))  # the zero border, normalised
    d = dm.describe()
    assert d["name"] == "mnist" and d["input_shape"] == [1, 32, 32] and d["data_dir"] == str(fake["root"])
    # training shifts by at most 2 pixels and never mirrors: every augmented digit is a shift of the original
    torch.manual_seed(0)
    padded = torch.nn.functional.pad(torch.from_numpy(fake["train"][0][int(dm.train_indices[0])]), (4, 4, 4, 4))
    aug, _ = dm.train_dataset[0]
    raw_aug = (aug[0] * MNIST_STD[0] + MNIST_MEAN[0]) * 255
    shifts = [(r, c) for r in range(5) for c in range(5)
              if torch.allclose(raw_aug, padded[r: r + 32, c: c + 32].float(), atol=1e-3)]
    assert shifts


def test_resolve_mnist(fake, tmp_path):
    from nestflex.data import MNISTDataModule, resolve_data

    dm, message = resolve_data("mnist", fake["root"], batch_size=8, val_size=10, train_size=5)
    assert isinstance(dm, MNISTDataModule) and dm.batch_size == 8 and not dm.synthetic
    assert message == f"data: MNIST found in {fake['dir']} (28x28 digits padded to 1x32x32)"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"MNIST not found in .*empty: .*HINT: put the four standard MNIST files"):
        resolve_data("mnist", tmp_path / "empty", val_size=10)
    with pytest.raises(DataError, match=r"`download=True` with kind 'mnist': nestflex never downloads MNIST"):
        resolve_data("mnist", fake["root"], download=True)
    # auto never switches the input to MNIST behind the user's back
    dm, message = resolve_data("auto", fake["root"], train_size=200, test_size=50, val_size=20)
    assert dm.synthetic and "using the synthetic dataset" in message
