"""SVHN cropped digits from MATLAB v5 files (scipy.io): layout, label 10 -> 0, validation, DataModule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nestflex.data import SVHN, SVHN_CLASSES, SVHN_MEAN, SVHN_STD, load_svhn, svhn_available
from nestflex.data.svhn import find_svhn_dir
from nestflex.errors import DataError
from tests.data.formats import make_fake_svhn, svhn_arrays, write_mat


@pytest.fixture
def fake(tmp_path):
    return make_fake_svhn(tmp_path, subdir="svhn")


@pytest.mark.parametrize("subdir", ["", "svhn", "SVHN"])
def test_load_layouts_pixels_and_labels(tmp_path, subdir):
    fake = make_fake_svhn(tmp_path, n_train=20, n_test=11, subdir=subdir)
    assert svhn_available(tmp_path) and find_svhn_dir(tmp_path) == fake["dir"]
    images, targets = load_svhn(tmp_path, "train")
    x, y = fake["train"][:2]
    assert images.shape == (20, 3, 32, 32) and images.dtype == torch.uint8 and targets.dtype == torch.int64
    # X is (height, width, channel, sample)
    assert images[4, 1, 7, 30] == x[7, 30, 1, 4]
    assert torch.equal(images[9], torch.from_numpy(x[..., 9]).permute(2, 0, 1))
    assert targets.tolist() == [int(v) % 10 for v in y[:, 0]]  # 10 means digit 0
    assert targets[9] == 0 and y[9, 0] == 10 and set(targets.tolist()) == set(range(10))
    assert load_svhn(tmp_path, "test")[0].shape == (11, 3, 32, 32)


@pytest.mark.parametrize("y_shape", ["row", "flat", "double"])
def test_label_shapes_and_types_matlab_writes(tmp_path, y_shape):
    x, y = svhn_arrays(12, seed=0)
    y = {"row": y.reshape(1, -1), "flat": y.reshape(-1), "double": y.astype(np.float64)}[y_shape]
    write_mat(tmp_path / "train_32x32.mat", X=x, y=y)
    write_mat(tmp_path / "test_32x32.mat", X=x, y=y)
    assert load_svhn(tmp_path, "test")[1].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]


def test_dataset(fake):
    ds = SVHN(fake["root"], "test")
    image, label = ds[2]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == 3
    assert ds.classes == SVHN_CLASSES == tuple("0123456789") and len(ds) == 12 and ds.split == "test"
    assert len(SVHN_MEAN) == len(SVHN_STD) == 3


def test_missing_files_and_extra(fake, tmp_path):
    (fake["dir"] / "test_32x32.mat").unlink()
    assert not svhn_available(fake["root"])
    match = (rf"SVHN not found in {fake['root']}: {fake['dir']} lacks test_32x32\.mat \(expected train_32x32\.mat, "
             r"test_32x32\.mat .*\)\. HINT: put the SVHN \.mat files")
    with pytest.raises(DataError, match=match):
        load_svhn(fake["root"])
    with pytest.raises(DataError, match=r"SVHN directory .*void does not exist"):
        load_svhn(tmp_path / "void")
    make_fake_svhn(tmp_path / "full")
    with pytest.raises(DataError, match=r"SVHN file .*extra_32x32\.mat not found \(the `extra` split is optional\)"):
        load_svhn(tmp_path / "full", "extra")
    with pytest.raises(DataError, match=r"`split` must be one of \['train', 'test', 'extra'\], got 'val'"):
        load_svhn(tmp_path / "full", "val")


def _write_test(fake, **variables):
    path = write_mat(fake["dir"] / "test_32x32.mat", **variables)
    return str(path).replace(".", r"\.")


X, Y = svhn_arrays(6, seed=1)


@pytest.mark.parametrize(
    ("variables", "match"),
    [
        ({"X": X[:28, :28], "y": Y},
         r"`X` must be a uint8 array of shape \(32, 32, 3, N\) .*got uint8 \(28, 28, 3, 6\)"),
        ({"X": X[:, :, :1], "y": Y}, r"`X` must be a uint8 array .*got uint8 \(32, 32, 1, 6\)"),
        ({"X": X.astype(np.float32), "y": Y}, r"`X` must be a uint8 array .*got float32 \(32, 32, 3, 6\)"),
        ({"X": X[..., 0], "y": Y}, r"`X` must be a uint8 array .*got uint8 \(32, 32, 3\)\. HINT"),
        ({"X": X, "y": Y[:5]}, r"`y` must hold one label per image, shape \(6, 1\), got uint8 \(5, 1\)"),
        ({"X": X, "y": np.ones((2, 3), np.uint8)},
         r"`y` must hold one label per image, shape \(6, 1\), got uint8 \(2, 3\)"),
        ({"X": X, "y": Y + 10}, r"labels must lie in 1\.\.10 \(10 = digit 0.*\), got range 11\.\.16"),
        ({"X": X, "y": Y + 0.5}, r"`y` must hold integer labels, got dtype float64"),
        ({"X": X}, r"lacks variable\(s\) \['y'\]; found \['X'\]\. HINT: is it the full-numbers"),
    ],
)
def test_wrong_mat_content(fake, variables, match):
    path = _write_test(fake, **variables)
    with pytest.raises(DataError, match=rf"SVHN file {path}(: | )" + match):
        load_svhn(fake["root"], "test")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"not a MATLAB file " * 10, r"is corrupt or not a MATLAB file \(ValueError: Unknown mat file type"),
        (b"", r"is corrupt or not a MATLAB file \(MatReadError"),
        # a MATLAB v7.3 header: the file is HDF5, which loadmat refuses
        (b"MATLAB 7.3 MAT-file, HDF5 schema 1.00 .".ljust(116) + bytes(8) + b"\x00\x02IM" + b"\x89HDF\r\n\x1a\n",
         r"is a MATLAB v7\.3 \(HDF5\) file, which scipy cannot read .*HINT: use the original SVHN files"),
    ],
)
def test_unreadable_files(fake, content, match):
    path = fake["dir"] / "test_32x32.mat"
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"SVHN file {str(path).replace('.', '[.]')} " + match):
        load_svhn(fake["root"], "test")


def test_datamodule(fake):
    from nestflex.data import SVHNDataModule

    dm = SVHNDataModule(fake["root"], batch_size=8, val_size=0.2)
    assert dm.input_shape == (3, 32, 32) and dm.num_classes == 10 and dm.classes == SVHN_CLASSES
    assert dm.mean == SVHN_MEAN and dm.std == SVHN_STD and not dm.flip and dm.crop_padding == 2
    assert dm.name == "svhn" and not dm.synthetic
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and len(dm.val_dataset) == 6 and len(dm.test_dataset) == 12
    image, label = dm.test_dataset[0]
    expected = (torch.from_numpy(fake["test"][0][..., 0]).permute(2, 0, 1).float() / 255
                - torch.tensor(SVHN_MEAN).view(3, 1, 1)) / torch.tensor(SVHN_STD).view(3, 1, 1)
    assert torch.allclose(image, expected, atol=1e-6) and label == 1


def test_resolve_svhn(fake, tmp_path):
    from nestflex.data import SVHNDataModule, resolve_data

    dm, message = resolve_data("svhn", fake["root"], val_size=4, seed=2)
    assert isinstance(dm, SVHNDataModule) and dm.seed == 2 and message == f"data: SVHN found in {fake['dir']}"
    with pytest.raises(DataError, match=r"SVHN directory .*none does not exist \(expected train_32x32\.mat"):
        resolve_data("svhn", tmp_path / "none")
    with pytest.raises(DataError, match=r"`download=True` with kind 'svhn': nestflex never downloads SVHN"):
        resolve_data("svhn", fake["root"], download=True)
