"""Real MNIST from the four standard IDX files, gzipped or not; never downloaded.

MNIST is distributed as four files in LeCun's IDX format: ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, usually
gzipped (``.gz``). An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the values in row-major order. This module
reads them with :func:`read_idx`, which checks the magic number, the type (unsigned bytes), the
dimensions and that the file holds exactly the bytes its header announces, and then checks the
pair: 28x28 images, as many labels as images, labels in 0..9. Every problem raises
:class:`~nestflex.errors.DataError` naming the file, the value found and what to do.

The files are looked for in ``data_dir``, ``data_dir/raw`` and ``data_dir/MNIST/raw`` (the
torchvision layout), each name with or without ``.gz``. Nothing is ever downloaded: put the files
there yourself.

Images keep their native 1x28x28 here; :class:`~nestflex.data.MNISTDataModule` pads them to
1x32x32 in its transforms (docs/data.md says why).

Example:
    >>> from nestflex.data.mnist import mnist_available
    >>> mnist_available("/nonexistent")
    False
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._locate import find_dir, require_dir
from nestflex.errors import DataError

__all__ = [
    "MNIST",
    "MNIST_CLASSES",
    "MNIST_MEAN",
    "MNIST_STD",
    "MNIST_FILES",
    "IDX_UBYTE",
    "read_idx",
    "mnist_available",
    "find_mnist_dir",
    "require_mnist_dir",
    "load_mnist",
]

#: ``split -> (images file, labels file)``, without ``.gz``.
MNIST_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
#: Mean/std of the 60,000 training images at their native 28x28, in [0, 1] units (the values
#: every MNIST example uses). The 2-pixel zero border added by the datamodule is not counted, so
#: background pixels, inside or outside the border, normalise to the same value.
MNIST_MEAN: tuple[float] = (0.1307,)
MNIST_STD: tuple[float] = (0.3081,)
#: IDX type code of unsigned bytes, the only type MNIST uses.
IDX_UBYTE = 0x08
_IDX_TYPES = {0x08: "unsigned byte", 0x09: "signed byte", 0x0B: "int16", 0x0C: "int32", 0x0D: "float32",
              0x0E: "float64"}
_SIZE = 28
_SUBDIRS = ("", "raw", "MNIST/raw")
_EXPECTED = ", ".join(f for pair in MNIST_FILES.values() for f in pair) + " (each optionally .gz)"
_HINT = (
    "HINT: put the four standard MNIST files (gzipped or not) in that directory, its `raw/` or its "
    "`MNIST/raw/`; nestflex never downloads MNIST"
)
_GZIP_MAGIC = b"\x1f\x8b"


# ------------------------------------------------------------------------------------------------
# IDX
# ------------------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read MNIST file {path}: {exc}") from exc
    if not raw.startswith(_GZIP_MAGIC):  # decided by content, not by name: a renamed file still reads
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"MNIST file {path} is a corrupt or truncated gzip file ({type(exc).__name__}: {exc}). "
            f"HINT: copy it again, or gunzip a good copy next to it"
        ) from exc


def read_idx(path: str | os.PathLike[str], ndim: int | None = None) -> np.ndarray:
    """Read one IDX file of unsigned bytes (gzipped or not) into a uint8 array.

    Args:
        path: the file.
        ndim: the number of dimensions the file must have (``None``: any).

    Returns:
        A uint8 array with the shape the header announces.

    Raises:
        DataError: unreadable file or gzip stream; a header shorter than its magic number and
            dimensions; a magic number whose first two bytes are not zero, whose type is not
            unsigned byte (0x08) or whose dimension count differs from ``ndim``; a body shorter
            or longer than the dimensions announce. The message names the file and the value.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x-idx1-ubyte"
        >>> _ = p.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(p, ndim=1).tolist()
        [7, 8, 9]
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(
            f"MNIST file {path} is {len(raw)} bytes long, too short for an IDX magic number (4 bytes). "
            "HINT: the file is empty or truncated; copy it again"
        )
    zero, code, dims = raw[:2], raw[2], raw[3]
    magic = int.from_bytes(raw[:4], "big")
    if zero != b"\x00\x00":
        raise DataError(
            f"MNIST file {path} has magic number 0x{magic:08x}, not an IDX file (its first two bytes must be 0). "
            "HINT: is it an image or archive of another format? Use the standard MNIST IDX files"
        )
    if code != IDX_UBYTE:
        kind = _IDX_TYPES.get(code, "unknown")
        raise DataError(
            f"MNIST file {path} has magic number 0x{magic:08x}: IDX type 0x{code:02x} ({kind}), expected "
            f"0x{IDX_UBYTE:02x} (unsigned byte). HINT: MNIST images and labels are unsigned bytes; "
            "is this another dataset's file?"
        )
    if ndim is not None and dims != ndim:
        raise DataError(
            f"MNIST file {path} has magic number 0x{magic:08x}: {dims} dimension(s), expected {ndim} "
            f"(magic 0x{0x800 | ndim:08x}). HINT: an images file has 3 (idx3), a labels file 1 (idx1); "
            "are the two swapped?"
        )
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(
            f"MNIST file {path} is truncated inside its header: {len(raw)} bytes, the header of a "
            f"{dims}-dimensional IDX file needs {header}. HINT: copy the file again"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    expected = header + math.prod(shape)
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(
            f"MNIST file {path} is {what}: its header announces shape {shape}, i.e. {expected:,} bytes "
            f"with the header, but it holds {len(raw):,}. HINT: copy the file again (decompressed size "
            "if gzipped)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


# ------------------------------------------------------------------------------------------------
# Locating and loading
# ------------------------------------------------------------------------------------------------


def _find_file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _files_in(directory: Path) -> dict[str, Path]:
    found = {}
    for pair in MNIST_FILES.values():
        for name in pair:
            path = _find_file(directory, name)
            if path is not None:
                found[name] = path
    return found


_REQUIRED = tuple(n for pair in MNIST_FILES.values() for n in pair)


def _candidates(data_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(data_dir)
    return [root / sub if sub else root for sub in _SUBDIRS]


def _present(directory: Path) -> set[str]:
    return set(_files_in(directory))


def find_mnist_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding all four MNIST files: ``data_dir``, ``data_dir/raw`` or ``data_dir/MNIST/raw``.

    Returns ``None`` when none of them holds all four (each may be gzipped). Only presence is
    checked; contents are validated when loaded.
    """
    return find_dir(_candidates(data_dir), _present, _REQUIRED)


def mnist_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether the four MNIST files are in ``data_dir`` (or its ``raw/`` or ``MNIST/raw/``).

    Example:
        >>> mnist_available("/nonexistent")
        False
    """
    return find_mnist_dir(data_dir) is not None


def require_mnist_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_mnist_dir`, but raise when MNIST is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and where they may go.
    """
    return require_dir(Path(data_dir), _candidates(data_dir), _present, _REQUIRED, what="MNIST",
                       expected=_EXPECTED, hint=_HINT)


def load_mnist(data_dir: str | os.PathLike[str], split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Load one MNIST split as tensors.

    Args:
        data_dir: directory holding the IDX files (or their ``raw/`` or ``MNIST/raw/``).
        split: ``"train"`` (60,000 images in the standard files) or ``"test"`` (10,000).

    Returns:
        ``(images, targets)``: uint8 ``(N, 1, 28, 28)`` and int64 ``(N,)``.

    Raises:
        DataError: unknown split; files missing; a file that is not a valid IDX file (see
            :func:`read_idx`); images that are not 28x28; a label count that differs from the
            image count; labels outside 0..9.
    """
    if split not in MNIST_FILES:
        raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
    directory = require_mnist_dir(data_dir)
    image_path, label_path = (_find_file(directory, n) for n in MNIST_FILES[split])
    images = read_idx(image_path, ndim=3)
    labels = read_idx(label_path, ndim=1)
    if images.shape[1:] != (_SIZE, _SIZE):
        raise DataError(
            f"MNIST file {image_path} holds images of {images.shape[1]}x{images.shape[2]} pixels, expected "
            f"{_SIZE}x{_SIZE}. HINT: is it EMNIST or another IDX dataset? Only standard MNIST is supported"
        )
    if len(labels) != len(images):
        raise DataError(
            f"MNIST files {image_path} and {label_path} disagree: {len(images):,} images but {len(labels):,} "
            f"labels. HINT: the two files come from different copies or splits; copy both again"
        )
    if len(labels) and labels.max() >= len(MNIST_CLASSES):
        raise DataError(
            f"MNIST file {label_path}: labels must lie in 0..9, got values up to {int(labels.max())}. "
            "HINT: is it an EMNIST letters file?"
        )
    return (
        torch.from_numpy(images.copy()).unsqueeze(1),
        torch.from_numpy(labels.astype(np.int64)),
    )


# ------------------------------------------------------------------------------------------------
# Dataset
# ------------------------------------------------------------------------------------------------


class MNIST(ImageTensorDataset):
    """MNIST as a torch ``Dataset`` of ``(image, label)``, held in memory as uint8 ``(1, 28, 28)``.

    Args:
        data_dir: directory holding the four IDX files (or their ``raw/`` or ``MNIST/raw/``).
        split: ``"train"`` or ``"test"``.
        transform: callable applied to each uint8 ``(1, 28, 28)`` image; ``None`` returns
            float32 in [0, 1].

    Raises:
        DataError: see :func:`load_mnist`.

    Example:
        >>> ds = MNIST("../shared/data/mnist", split="test")  # doctest: +SKIP
        >>> ds.images.shape  # doctest: +SKIP
        torch.Size([10000, 1, 28, 28])
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        images, targets = load_mnist(data_dir, split)
        super().__init__(images, targets, classes=MNIST_CLASSES, transform=transform)
        self.split = split
