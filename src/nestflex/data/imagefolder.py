"""Your own images from a folder, one subfolder per class: ``root/<class>/<image>``.

The layout is torchvision's ``ImageFolder``: every (non-hidden) subfolder of ``root`` is a class,
named by the folder, and classes are numbered in sorted name order; every file below a class
folder (subfolders included) whose extension is one of :data:`IMAGE_EXTENSIONS` (any case) is an
image of that class; other files (notes, ``.DS_Store``) and hidden files and folders are ignored.
Files are taken in sorted path order, so the same folder gives the same dataset on every machine.

Splits, decided by the folder:

* ``root/train/<class>/...`` and ``root/test/<class>/...``: the two subfolders are the splits.
  Classes come from ``train/``; ``test/`` may lack some but may not add any.
* anything else: ``root/<class>/...`` is split by a seed: in each class, a seeded permutation
  (``split_seed``, the same for every class, so adding images to one class leaves the others'
  split alone) sends ``round(n * test_fraction)`` images, at least one and never all, to the
  test split; a class of one image stays in train.

Images are decoded with Pillow, converted to one channel count (``channels``: 1 greyscale or 3
RGB; ``None`` takes it from the first image in sorted order, of ``train/`` in the split layout:
``L``/``LA``/``1`` -> 1, ``RGB``/``RGBA``/``P`` and other colour modes -> 3; alpha is dropped),
resized to ``image_size=(H, W)`` (bilinear) if given, and held in memory as uint8 ``(N, C, H, W)``.
Without ``image_size`` every image must have the first one's size. 16-bit and float images are
refused rather than silently clipped. Every problem (no class folder, an empty class, an
unreadable or corrupt file, a size that differs) raises :class:`~nestflex.errors.DataError`
naming the folder or file and the fix.

Pillow comes with torchvision (nestflex's ``train`` extra) and is imported when images are read,
so ``import nestflex.data`` does not need it.

Examples:
    >>> import tempfile, pathlib
    >>> from PIL import Image
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for c in ("cat", "dog"):
    ...     (root / c).mkdir()
    ...     for i in range(3):
    ...         Image.new("RGB", (24, 40), (i * 80, 0, 0)).save(root / c / f"{i}.png")
    >>> ds = ImageFolder(root, "train", test_fraction=0.34)
    >>> ds.classes, ds.images.shape, len(ImageFolder(root, "test", test_fraction=0.34))
    (('cat', 'dog'), torch.Size([4, 3, 40, 24]), 2)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from nestflex.data._dataset import ImageTensorDataset
from nestflex.errors import DataError

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageFolder",
    "ImageFolderIndex",
    "index_image_folder",
    "image_folder_shape",
    "load_image_folder",
]

#: File extensions read as images, compared case-insensitively.
IMAGE_EXTENSIONS: tuple[str, ...] = (".bmp", ".jpeg", ".jpg", ".png", ".webp")

# Pillow modes of 8-bit images and the channel count they give with `channels=None`.
_MODE_CHANNELS = {
    "1": 1, "L": 1, "LA": 1,
    "P": 3, "PA": 3, "RGB": 3, "RGBA": 3, "RGBX": 3, "RGBa": 3, "CMYK": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
}  # fmt: skip
_TARGET_MODE = {1: "L", 3: "RGB"}
_LAYOUT = "root/<class>/<image> or root/train/<class>/<image> + root/test/<class>/<image>"
_SPLITS = ("train", "test")


# ------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------


def _check_channels(channels: object) -> None:
    if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
        raise DataError(
            f"`channels` must be 1 (greyscale), 3 (RGB) or None (from the first image), got {channels!r}"
        )


def _check_image_size(image_size: object) -> tuple[int, int] | None:
    """``None``, an int ``n`` (-> ``(n, n)``) or ``(H, W)``; returns the pair."""
    if image_size is None:
        return None
    pair = (image_size, image_size) if isinstance(image_size, int) else image_size
    ok = isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise DataError(
            "`image_size` must be (H, W) with two integers >= 1, an integer (square) or None, "
            f"got {image_size!r}"
        )
    return int(pair[0]), int(pair[1])


def _check_fraction(test_fraction: object) -> None:
    number = isinstance(test_fraction, (int, float)) and not isinstance(test_fraction, bool)
    if not number or not 0 < test_fraction < 1:
        raise DataError(
            f"`test_fraction` must be a number in (0, 1), got {test_fraction!r}. HINT: it is the share of "
            "each class's images held out as the test split when the folder has no train/ and test/ "
            "subfolders"
        )


def _check_seed(split_seed: object) -> None:
    if isinstance(split_seed, bool) or not isinstance(split_seed, int) or split_seed < 0:
        raise DataError(f"`split_seed` must be an integer >= 0, got {split_seed!r}")


# ------------------------------------------------------------------------------------------------
# Index: classes and files, no decoding
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageFolderIndex:
    """The classes and files of an image folder, split; built by :func:`index_image_folder`.

    Attributes:
        root: the folder.
        split_folders: ``True`` when ``root/train`` and ``root/test`` are the splits, ``False``
            for one folder split by ``split_seed``.
        classes: class names, index = label.
        train: the training split's ``(path, label)`` pairs in sorted path order.
        test: the test split's ``(path, label)`` pairs in sorted path order.
        first: the image that decides ``channels=None`` and, without ``image_size``, the size.
        test_fraction: the seeded split's share of each class held out for test (``None`` with
            split folders).
        split_seed: the seeded split's seed (``None`` with split folders).
    """

    root: Path
    split_folders: bool
    classes: tuple[str, ...]
    train: tuple[tuple[Path, int], ...]
    test: tuple[tuple[Path, int], ...]
    first: Path
    test_fraction: float | None = None
    split_seed: int | None = None

    def samples(self, split: str) -> tuple[tuple[Path, int], ...]:
        """The ``(path, label)`` pairs of ``"train"`` or ``"test"``."""
        if split not in _SPLITS:
            raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
        return self.train if split == "train" else self.test

    def describe(self) -> str:
        """One line: classes, images per split and where the split comes from."""
        how = (
            "train/ and test/ subfolders" if self.split_folders
            else f"one folder split by seed {self.split_seed} ({self.test_fraction:g} of each class to test)"
        )
        return f"{len(self.classes)} classes, {len(self.train)} train / {len(self.test)} test images ({how})"


def _visible(name: str) -> bool:
    return not name.startswith(".")


def _class_dirs(directory: Path) -> tuple[str, ...]:
    classes = tuple(sorted(e.name for e in os.scandir(directory) if e.is_dir() and _visible(e.name)))
    if not classes:
        raise DataError(
            f"image folder {directory} has no class subfolders (expected {_LAYOUT}). "
            "HINT: put each class's images in a subfolder named after the class"
        )
    return classes


def _images_below(folder: Path) -> list[Path]:
    found = []
    # not following links below a class folder: a link cycle would never end
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if _visible(d))
        for name in sorted(filenames):
            if _visible(name) and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
                found.append(Path(dirpath) / name)
    if not found:
        raise DataError(
            f"class folder {folder} holds no image files ({', '.join(IMAGE_EXTENSIONS)}, any case). "
            "HINT: add its images, or remove the folder if it is not a class"
        )
    return found


def _seeded_split(files: list[Path], fraction: float, seed: int) -> tuple[list[Path], list[Path]]:
    n = len(files)
    if n < 2:
        return files, []
    n_test = min(max(round(n * fraction), 1), n - 1)
    # a fresh generator per class: one class's split does not depend on the other classes
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(perm[:n_test])
    return [f for i, f in enumerate(files) if i not in held], [f for i, f in enumerate(files) if i in held]


def index_image_folder(
    root: str | os.PathLike[str], test_fraction: float = 0.2, split_seed: int = 0
) -> ImageFolderIndex:
    """Find the classes and image files of ``root`` and split them (nothing is decoded).

    Args:
        root: the folder: ``root/<class>/<image>``, or ``root/train/...`` and ``root/test/...``.
        test_fraction: share of each class sent to the test split when there are no
            ``train/``/``test/`` subfolders (ignored when there are).
        split_seed: seed of that split.

    Returns:
        The :class:`ImageFolderIndex`.

    Raises:
        DataError: bad arguments; ``root`` missing or not a folder; only one of ``train/`` and
            ``test/``; no class folder; a class folder without images; a ``test/`` class that
            ``train/`` lacks; a seeded split that leaves the test split empty.

    Examples:
        >>> index_image_folder("/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        nestflex.errors.DataError: image folder /nonexistent does not exist ...
    """
    _check_fraction(test_fraction)
    _check_seed(split_seed)
    root = Path(root)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(
            f"image folder {root} {what} (expected {_LAYOUT}). HINT: pass the folder that holds the class "
            "subfolders (recipes: `--data imagefolder --data-dir DIR`)"
        )
    train_dir, test_dir = root / "train", root / "test"
    if train_dir.is_dir() and test_dir.is_dir():
        classes = _class_dirs(train_dir)
        extra = sorted(set(_class_dirs(test_dir)) - set(classes))
        if extra:
            raise DataError(
                f"image folder {test_dir} has class folder(s) {extra} that {train_dir} lacks; labels come "
                "from train/'s classes. HINT: add them to train/ or remove them from test/"
            )
        lookup = {c: i for i, c in enumerate(classes)}
        train = tuple((f, i) for i, c in enumerate(classes) for f in _images_below(train_dir / c))
        test = tuple(
            (f, lookup[c]) for c in _class_dirs(test_dir) for f in _images_below(test_dir / c)
        )
        return ImageFolderIndex(root, True, classes, train, test, first=train[0][0])
    if train_dir.is_dir() or test_dir.is_dir():
        have, lack = ("train", "test") if train_dir.is_dir() else ("test", "train")
        raise DataError(
            f"image folder {root} has a `{have}/` subfolder but no `{lack}/`: either both are the splits, or "
            f"every subfolder is a class. HINT: add `{lack}/`, or move the class folders of `{have}/` up "
            "into the root to have a seeded split"
        )
    classes = _class_dirs(root)
    train_list: list[tuple[Path, int]] = []
    test_list: list[tuple[Path, int]] = []
    first = None
    for label, name in enumerate(classes):
        files = _images_below(root / name)
        first = first or files[0]
        tr, te = _seeded_split(files, float(test_fraction), split_seed)
        train_list += [(f, label) for f in tr]
        test_list += [(f, label) for f in te]
    if not test_list:
        raise DataError(
            f"image folder {root}: every class has a single image, so the seeded split leaves no test image. "
            "HINT: add images, or give the splits yourself as train/ and test/ subfolders"
        )
    return ImageFolderIndex(root, False, classes, tuple(train_list), tuple(test_list), first=first,
                            test_fraction=float(test_fraction), split_seed=split_seed)


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow comes with torchvision
        raise DataError(
            "reading an image folder needs Pillow. HINT: pip install 'nestflex[train]' (or pillow)"
        ) from exc
    return Image


def _unreadable(path: Path, exc: BaseException) -> DataError:
    return DataError(
        f"image file {path} cannot be read as an image ({type(exc).__name__}: {exc}). HINT: replace or "
        "delete the file; nestflex reads PNG, JPEG, BMP and WebP files with Pillow"
    )


def _read_errors(image_module: Any) -> tuple[type[BaseException], ...]:
    # UnidentifiedImageError and "image file is truncated" are OSErrors; broken headers surface as
    # the others; DecompressionBombError guards against a small file that claims a huge image.
    return (OSError, ValueError, SyntaxError, EOFError, image_module.DecompressionBombError)


def _check_mode(path: Path, mode: str) -> None:
    if mode not in _MODE_CHANNELS:
        raise DataError(
            f"image {path} has Pillow mode {mode!r} (16-bit, 32-bit or float pixels), which nestflex does "
            "not read rather than clip it. HINT: convert the images to 8-bit greyscale or RGB"
        )


def _header(path: Path) -> tuple[str, tuple[int, int]]:
    """``(mode, (height, width))`` from the file's header."""
    image_module = _pil()
    try:
        with image_module.open(path) as img:
            return img.mode, (img.height, img.width)
    except _read_errors(image_module) as exc:
        raise _unreadable(path, exc) from exc


def image_folder_shape(
    index: ImageFolderIndex, channels: int | None = None, image_size: int | Sequence[int] | None = None
) -> tuple[int, int, int]:
    """The per-sample ``(C, H, W)`` the folder's images are read at (only the first image's header is read).

    Args:
        index: from :func:`index_image_folder`.
        channels: 1, 3 or ``None`` (from the first image's mode).
        image_size: ``(H, W)``, an int (square) or ``None`` (the first image's size).

    Raises:
        DataError: bad ``channels`` or ``image_size``; the first image unreadable or of a mode
            nestflex does not read.
    """
    _check_channels(channels)
    size = _check_image_size(image_size)
    mode, first_size = _header(index.first)
    _check_mode(index.first, mode)
    c = channels if channels is not None else _MODE_CHANNELS[mode]
    h, w = size if size is not None else first_size
    return c, h, w


def _decode(path: Path, image_module: Any, mode: str, size: tuple[int, int], resize: bool,
            first: Path) -> np.ndarray:
    try:
        with image_module.open(path) as img:
            _check_mode(path, img.mode)
            if not resize and (img.height, img.width) != size:
                raise DataError(
                    f"image {path} is {img.height}x{img.width} (HxW), but the first image, {first}, is "
                    f"{size[0]}x{size[1]}: without `image_size` every image must have one size. HINT: pass "
                    "`image_size=(H, W)` to resize them all"
                )
            if img.mode in ("P", "PA"):  # palette transparency is only converted cleanly through RGBA
                img = img.convert("RGBA")
            img = img.convert(mode)  # also decodes: corrupt data fails here
            if resize and (img.height, img.width) != size:
                img = img.resize((size[1], size[0]), image_module.Resampling.BILINEAR)
            return np.asarray(img, dtype=np.uint8)
    except DataError:  # ours, above (a ValueError too): not a decoding failure
        raise
    except _read_errors(image_module) as exc:
        raise _unreadable(path, exc) from exc


def load_image_folder(
    source: str | os.PathLike[str] | ImageFolderIndex,
    split: str = "train",
    channels: int | None = None,
    image_size: int | Sequence[int] | None = None,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple[Path, ...]]:
    """Decode one split of an image folder into tensors.

    Args:
        source: the folder, or an :class:`ImageFolderIndex` of it (then ``test_fraction`` and
            ``split_seed`` are the index's).
        split: ``"train"`` or ``"test"``.
        channels: 1, 3 or ``None`` (from the first image: ``L`` -> 1, ``RGB``/``RGBA``/``P`` -> 3).
        image_size: ``(H, W)`` (or an int for a square) to resize every image to; ``None``
            requires every image to have the first one's size.
        test_fraction: share of each class held out as ``test`` when there are no
            ``train/``/``test/`` subfolders (see :func:`index_image_folder`).
        split_seed: seed of that split.

    Returns:
        ``(images, targets, classes, files)``: uint8 ``(N, C, H, W)``, int64 ``(N,)``, class
        names, and the file of each sample.

    Raises:
        DataError: see :func:`index_image_folder` and :func:`image_folder_shape`; a file that is
            corrupt or unreadable; without ``image_size``, the first image of another size.
    """
    if split not in _SPLITS:
        raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
    if isinstance(source, ImageFolderIndex):
        index = source
    else:
        index = index_image_folder(source, test_fraction, split_seed)
    c, h, w = image_folder_shape(index, channels, image_size)
    samples = index.samples(split)
    image_module = _pil()
    out = np.empty((len(samples), h, w, c), dtype=np.uint8)
    for i, (path, _) in enumerate(samples):
        pixels = _decode(path, image_module, _TARGET_MODE[c], (h, w), image_size is not None, index.first)
        out[i] = pixels.reshape(h, w, c)
    images = torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
    targets = torch.tensor([label for _, label in samples], dtype=torch.int64)
    return images, targets, index.classes, tuple(path for path, _ in samples)


class ImageFolder(ImageTensorDataset):
    """An image folder as a torch ``Dataset`` of ``(image, label)``, decoded once, held as uint8.

    Args:
        source: the folder (``root/<class>/<image>``, or with ``train/`` and ``test/``), or its
            :class:`ImageFolderIndex`.
        split: ``"train"`` or ``"test"``.
        channels: 1, 3 or ``None`` (from the first image).
        image_size: ``(H, W)`` to resize to, or ``None`` (all images must share one size).
        transform: callable applied to each uint8 ``(C, H, W)`` image; ``None`` returns float32
            in [0, 1].
        test_fraction: share of each class held out as ``test`` in a folder without
            ``train/``/``test/``.
        split_seed: seed of that split.

    Attributes:
        files: the file of each sample, in order.
        root: the folder.

    Raises:
        DataError: see :func:`load_image_folder`.

    Examples:
        >>> ds = ImageFolder("photos", "train", channels=3, image_size=(64, 48))  # doctest: +SKIP
        >>> ds.images.shape[1:]  # doctest: +SKIP
        torch.Size([3, 64, 48])
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | ImageFolderIndex,
        split: str = "train",
        channels: int | None = None,
        image_size: int | Sequence[int] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ) -> None:
        images, targets, classes, files = load_image_folder(
            source, split, channels, image_size, test_fraction, split_seed
        )
        super().__init__(images, targets, classes=classes, transform=transform)
        self.split = split
        self.files = files
        self.root = source.root if isinstance(source, ImageFolderIndex) else Path(source)

