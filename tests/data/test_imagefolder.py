"""Image folders: layout, seeded split, channels and sizes, decoding errors, the DataModule, resolve_data."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from nestflex.data import (
    ImageFolder,
    compute_mean_std,
    image_folder_shape,
    index_image_folder,
    load_image_folder,
)
from nestflex.data import imagefolder as folder_mod
from nestflex.errors import DataError
from tests.data.formats import make_image_folder, write_image

H, W = 40, 24  # non-square on purpose: (H, W) must never be swapped


def _pixels(seed: int, shape=(H, W, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


# ---- layout and split ---------------------------------------------------------------------------


def test_single_folder_seeded_split_pixels_and_labels(tmp_path):
    written = make_image_folder(tmp_path, {"dog": 5, "cat": 4})
    index = index_image_folder(tmp_path)
    assert index.classes == ("cat", "dog") and not index.split_folders  # sorted by name, not creation
    assert index.first == tmp_path / "cat" / "img_00.png"
    # per class round(n * 0.2), at least one: cat 4 -> 1, dog 5 -> 1
    assert len(index.train) == 7 and len(index.test) == 2
    assert sorted(label for _, label in index.test) == [0, 1]
    assert index.describe() == ("2 classes, 7 train / 2 test images "
                                "(one folder split by seed 0 (0.2 of each class to test))")
    pixels = {path: px for files in written.values() for path, px in files}
    train = ImageFolder(tmp_path, "train")
    test = ImageFolder(tmp_path, "test")
    assert train.images.shape == (7, 3, H, W) and train.images.dtype == torch.uint8
    assert train.classes == ("cat", "dog")
    assert set(train.files).isdisjoint(test.files) and set(train.files) | set(test.files) == set(pixels)
    assert list(train.files) == sorted(train.files)  # sorted path order
    for ds in (train, test):
        for image, target, path in zip(ds.images, ds.targets, ds.files):
            assert torch.equal(image, torch.from_numpy(pixels[path]).permute(2, 0, 1))  # PNG: exact
            assert ds.classes[int(target)] == path.parent.name
    image, label = train[0]
    assert image.dtype == torch.float32 and image.shape == (3, H, W) and label == 0 and train.root == tmp_path


def test_split_is_seeded_and_per_class(tmp_path):
    make_image_folder(tmp_path, {"a": 10, "b": 10})
    first = index_image_folder(tmp_path, test_fraction=0.3)
    assert first == index_image_folder(tmp_path, test_fraction=0.3)  # deterministic
    other = index_image_folder(tmp_path, test_fraction=0.3, split_seed=1)
    assert other.test != first.test and len(other.test) == len(first.test) == 6
    # one class's new image leaves the other class's split alone
    write_image(tmp_path / "b" / "img_99.png", _pixels(99))
    grown = index_image_folder(tmp_path, test_fraction=0.3)
    assert [s for s in grown.test if s[1] == 0] == [s for s in first.test if s[1] == 0]


def test_train_test_subfolders(tmp_path):
    make_image_folder(tmp_path / "train", {"b": 3, "a": 2, "c": 2})
    make_image_folder(tmp_path / "test", {"c": 2, "a": 1}, seed=1)  # test may lack a class
    index = index_image_folder(tmp_path, test_fraction=0.5)  # the fraction does not apply
    assert index.split_folders and index.classes == ("a", "b", "c") and len(index.train) == 7
    assert [label for _, label in index.test] == [0, 2, 2]  # labels are train/'s
    assert index.describe() == "3 classes, 7 train / 3 test images (train/ and test/ subfolders)"
    images, targets, classes, files = load_image_folder(tmp_path, "test")
    assert images.shape == (3, 3, H, W) and targets.tolist() == [0, 2, 2] and files[0].parent.parent.name == "test"


def test_test_subfolder_with_an_unknown_class(tmp_path):
    make_image_folder(tmp_path / "train", {"a": 2})
    make_image_folder(tmp_path / "test", {"a": 1, "zebra": 1})
    match = rf"image folder {tmp_path / 'test'} has class folder\(s\) \['zebra'\] that {tmp_path / 'train'} lacks"
    with pytest.raises(DataError, match=match):
        index_image_folder(tmp_path)


def test_only_one_split_subfolder(tmp_path):
    make_image_folder(tmp_path / "train", {"a": 2})
    match = rf"image folder {tmp_path} has a `train/` subfolder but no `test/`.*HINT: add"
    with pytest.raises(DataError, match=match):
        index_image_folder(tmp_path)


def test_extensions_case_hidden_and_other_files(tmp_path):
    write_image(tmp_path / "a" / "x.JPG", _pixels(0), fmt="JPEG")
    write_image(tmp_path / "a" / "y.jpeg", _pixels(1), fmt="JPEG")
    write_image(tmp_path / "a" / "deeper" / "z.bmp", _pixels(2))
    write_image(tmp_path / "b" / "w.WebP", _pixels(3), fmt="WEBP")
    write_image(tmp_path / "b" / "v.png", _pixels(4))
    (tmp_path / "a" / "notes.txt").write_text("not an image")
    (tmp_path / "a" / ".hidden.png").write_bytes(b"garbage, never read")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "k.png").write_bytes(b"garbage, never read")
    index = index_image_folder(tmp_path, test_fraction=0.4)
    assert index.classes == ("a", "b")
    names = sorted(p.name for p, _ in index.train + index.test)
    assert names == ["v.png", "w.WebP", "x.JPG", "y.jpeg", "z.bmp"]
    images, _, _, _ = load_image_folder(index, "train")
    assert images.shape == (3, 3, H, W)


# ---- channels and sizes -------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "channels"), [("L", 1), ("1", 1), ("LA", 1), ("RGB", 3), ("RGBA", 3), ("P", 3)])
def test_channels_from_the_first_image(tmp_path, mode, channels):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(_pixels(i)).convert(mode).save(tmp_path / cls / f"{i}.png")
    index = index_image_folder(tmp_path, test_fraction=0.5)
    assert image_folder_shape(index) == (channels, H, W)
    assert ImageFolder(index, "train").images.shape == (2, channels, H, W)


def test_greyscale_and_forced_channels(tmp_path):
    written = make_image_folder(tmp_path, {"a": 2, "b": 2}, shape=(H, W))  # mode L
    grey = ImageFolder(tmp_path, "train", test_fraction=0.5)
    assert grey.images.shape == (2, 1, H, W)
    pixels = dict(written["a"] + written["b"])
    assert torch.equal(grey.images[0, 0], torch.from_numpy(pixels[grey.files[0]]))
    rgb = ImageFolder(tmp_path, "train", channels=3, test_fraction=0.5)
    assert rgb.images.shape == (2, 3, H, W) and torch.equal(rgb.images[:, 0], rgb.images[:, 2])
    # colour images read as greyscale: Pillow's luminance
    write_image(tmp_path / "c" / "0.png", _pixels(5))
    write_image(tmp_path / "c" / "1.png", _pixels(6))
    lum = ImageFolder(tmp_path, "test", channels=1, test_fraction=0.5)
    path = [p for p in lum.files if p.parent.name == "c"][0]
    expected = np.array(Image.open(path).convert("L"))
    assert torch.equal(lum.images[list(lum.files).index(path), 0], torch.from_numpy(expected))


def test_mismatched_sizes_need_image_size(tmp_path):
    make_image_folder(tmp_path, {"a": 2, "b": 2})
    odd = write_image(tmp_path / "b" / "img_01.png", _pixels(7, (32, 32, 3)))
    match = (rf"image {odd} is 32x32 \(HxW\), but the first image, {tmp_path / 'a' / 'img_00.png'}, is 40x24: "
             r"without `image_size` every image must have one size\. HINT: pass `image_size=\(H, W\)`")
    with pytest.raises(DataError, match=match):
        for split in ("train", "test"):
            load_image_folder(tmp_path, split, test_fraction=0.5)
    index = index_image_folder(tmp_path, test_fraction=0.5)
    images = torch.cat([load_image_folder(index, s, image_size=(H, W))[0] for s in ("train", "test")])
    assert images.shape == (4, 3, H, W)
    assert load_image_folder(index, "test", image_size=16)[0].shape == (2, 3, 16, 16)
    assert image_folder_shape(index, 1, (20, 12)) == (1, 20, 12)


# ---- bad files and arguments ---------------------------------------------------------------------


def _truncated_png(path):
    write_image(path, _pixels(8))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: p.write_bytes(b"\x00 not an image at all"), r"UnidentifiedImageError"),
        (_truncated_png, r"(OSError|SyntaxError|ValueError|EOFError)"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + zlib.compress(b"x")), r""),
    ],
)
def test_corrupt_image_names_the_file(tmp_path, damage, match):
    make_image_folder(tmp_path, {"a": 3, "b": 3})
    bad = tmp_path / "b" / "img_02.png"
    damage(bad)
    with pytest.raises(DataError, match=rf"image file {bad} cannot be read as an image \({match}.*HINT: replace"):
        for split in ("train", "test"):
            load_image_folder(tmp_path, split, test_fraction=0.34)


def test_corrupt_first_image_fails_the_shape_probe(tmp_path):
    make_image_folder(tmp_path, {"a": 2, "b": 2})
    (tmp_path / "a" / "img_00.png").write_bytes(b"nope")
    with pytest.raises(DataError, match=r"image file .*img_00\.png cannot be read as an image"):
        image_folder_shape(index_image_folder(tmp_path))


def test_16_bit_images_are_refused(tmp_path):
    make_image_folder(tmp_path, {"a": 2, "b": 2})
    path = tmp_path / "a" / "img_00.png"
    Image.fromarray(np.full((H, W), 40000, np.uint16)).save(path)
    match = rf"image {path} has Pillow mode 'I;16' \(16-bit.*HINT: convert the images to 8-bit"
    with pytest.raises(DataError, match=match):
        image_folder_shape(index_image_folder(tmp_path))


def test_folder_errors(tmp_path):
    match = rf"image folder {tmp_path / 'none'} does not exist \(expected root/<class>/<image>"
    with pytest.raises(DataError, match=match):
        index_image_folder(tmp_path / "none")
    (tmp_path / "file.png").write_bytes(b"x")
    with pytest.raises(DataError, match=r"image folder .*file\.png is not a folder"):
        index_image_folder(tmp_path / "file.png")
    with pytest.raises(DataError, match=rf"image folder {tmp_path} has no class subfolders .*HINT: put each class"):
        index_image_folder(tmp_path)
    make_image_folder(tmp_path, {"a": 2})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "readme.txt").write_text("x")
    with pytest.raises(DataError, match=rf"class folder {tmp_path / 'b'} holds no image files \(\.bmp, .*HINT"):
        index_image_folder(tmp_path)


def test_single_images_leave_no_test_split(tmp_path):
    make_image_folder(tmp_path, {"a": 1, "b": 1})
    with pytest.raises(DataError, match=r"every class has a single image, so the seeded split leaves no test image"):
        index_image_folder(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"channels": 2}, r"`channels` must be 1 \(greyscale\), 3 \(RGB\) or None .*got 2"),
        ({"channels": True}, r"`channels` must be 1"),
        ({"image_size": (0, 3)}, r"`image_size` must be \(H, W\) with two integers >= 1.*got \(0, 3\)"),
        ({"image_size": "32"}, r"`image_size` must be .*got '32'"),
        ({"image_size": (32, 32, 3)}, r"`image_size` must be .*got \(32, 32, 3\)"),
        ({"test_fraction": 1.0}, r"`test_fraction` must be a number in \(0, 1\), got 1\.0\. HINT"),
        ({"split_seed": -1}, r"`split_seed` must be an integer >= 0, got -1"),
        ({"split": "val"}, r"`split` must be 'train' or 'test', got 'val'"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    make_image_folder(tmp_path, {"a": 2, "b": 2})
    with pytest.raises(DataError, match=match):
        load_image_folder(tmp_path, **kwargs)


# ---- DataModule ---------------------------------------------------------------------------------


def test_datamodule_shape_before_setup_without_decoding(tmp_path, monkeypatch):
    from nestflex.data import ImageFolderDataModule

    make_image_folder(tmp_path, {"b": 12, "a": 12})
    dm = ImageFolderDataModule(tmp_path, batch_size=4)
    monkeypatch.setattr(folder_mod, "_decode", lambda *a: pytest.fail("decoded before setup"))
    assert dm.input_shape == (3, H, W) and dm.classes == ("a", "b") and dm.num_classes == 2
    assert dm.mean is None and dm.std is None and dm.name == "imagefolder" and not dm.synthetic
    monkeypatch.undo()
    dm.setup()
    # 24 images: round(12 * 0.2) = 2 per class to test, 20 train of which 10% (2) are held out
    assert len(dm.test_dataset) == 4 and len(dm.val_dataset) == 2 and len(dm.train_dataset) == 18
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, H, W) and x.dtype == torch.float32
    # mean/std computed over the whole training split (the hold-out included), not the test split
    assert (dm.mean, dm.std) == compute_mean_std(dm.train_dataset.dataset.images) and len(dm.mean) == 3
    d = dm.describe()
    assert d["input_shape"] == [3, H, W] and d["classes"] == ["a", "b"] and d["split_folders"] is False
    assert d["test_fraction"] == 0.2 and d["split_seed"] == 0 and len(d["mean"]) == 3


def test_datamodule_greyscale_resize_and_given_normalisation(tmp_path):
    from nestflex.data import ImageFolderDataModule

    make_image_folder(tmp_path, {"a": 5, "b": 5}, shape=(H, W))
    dm = ImageFolderDataModule(tmp_path, batch_size=2, val_size=2, image_size=(16, 20), mean=(0.5,), std=(0.25,),
                               flip=False, crop_padding=0)
    assert dm.input_shape == (1, 16, 20) and not dm.flip and dm.crop_padding == 0
    dm.setup()
    image, _ = dm.test_dataset[0]
    raw = dm.test_dataset.images[0].float() / 255
    assert image.shape == (1, 16, 20) and torch.allclose(image, (raw - 0.5) / 0.25)
    rgb = ImageFolderDataModule(tmp_path, channels=3, val_size=2)
    assert rgb.input_shape == (3, H, W)
    wrong = ImageFolderDataModule(tmp_path, val_size=2, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2))
    match = r"`mean` and `std` have 3 value\(s\), but the images of .* are read with 1 channel"
    with pytest.raises(DataError, match=match):
        wrong.setup()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mean": (0.5,)}, r"`mean` and `std` must be given together or both left None"),
        ({"channels": 1, "mean": (0.5, 0.5), "std": (0.2, 0.2)},
         r"`mean` and `std` need one value per channel \(1\)"),
        ({"mean": (0.5,), "std": (0.0,)}, r"`std` must be > 0 for every channel"),
        ({"flip": "yes"}, r"`flip` must be True or False, got 'yes'"),
        ({"crop_padding": -1}, r"`crop_padding` must be an integer >= 0, got -1"),
        ({"channels": 4}, r"`channels` must be 1"),
        ({"val_size": 0}, r"`val_size` must be a count >= 1 or a fraction"),
    ],
)
def test_datamodule_bad_arguments(tmp_path, kwargs, match):
    from nestflex.data import ImageFolderDataModule

    with pytest.raises(DataError, match=match):
        ImageFolderDataModule(tmp_path, **kwargs)


def test_datamodule_feeds_the_bundle_exporter(tmp_path):
    from torch import nn

    from nestflex.data import ImageFolderDataModule
    from nestflex.export.callback import bundle_arguments

    make_image_folder(tmp_path / "train", {"a": 4, "b": 4})
    make_image_folder(tmp_path / "test", {"a": 1, "b": 1}, seed=1)
    dm = ImageFolderDataModule(tmp_path, val_size=2)
    dm.setup()
    holder = nn.Module()
    holder.model = nn.Conv2d(3, 2, 3)
    kwargs = bundle_arguments(holder, dm)
    assert kwargs["input_shape"] == (3, H, W) and kwargs["classes"] == ["a", "b"]
    assert kwargs["mean"] == list(dm.mean) and kwargs["std"] == list(dm.std)


def test_resolve_imagefolder(tmp_path):
    from nestflex.data import ImageFolderDataModule, resolve_data

    make_image_folder(tmp_path, {"cat": 5, "dog": 5})
    dm, message = resolve_data("imagefolder", tmp_path, batch_size=4, channels=1, image_size=(20, 12), flip=False,
                               test_fraction=0.4, split_seed=3, train_size=9)
    assert isinstance(dm, ImageFolderDataModule) and dm.input_shape == (1, 20, 12) and dm.batch_size == 4
    assert not dm.flip and dm.split_seed == 3 and dm.val_size == 0.1
    assert message == (f"data: image folder {tmp_path}: 2 classes, 6 train / 4 test images (one folder split by "
                       "seed 3 (0.4 of each class to test)), samples 1x20x12")
    with pytest.raises(DataError, match=r"image folder .*missing does not exist \(expected root/<class>/<image>"):
        resolve_data("imagefolder", tmp_path / "missing")
    match = r"`download=True` with kind 'imagefolder': nestflex never downloads an image"
    with pytest.raises(DataError, match=match):
        resolve_data("imagefolder", tmp_path, download=True)
    match = (r"DataModule argument\(s\) \['channels', 'image_size'\] apply to kind 'imagefolder' only, got kind "
             r"'mnist'")
    with pytest.raises(DataError, match=match):
        resolve_data("mnist", tmp_path, channels=1, image_size=28)
