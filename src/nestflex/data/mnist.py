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

Fashion-MNIST (:mod:`nestflex.data.fashion_mnist`) uses the same format and file names; it is
read by the same code (:func:`read_idx` and the private ``_IdxDataset`` description), with its
own folders, class names and messages.

Images keep their native 1x28x28 here; :class:`~nestflex.data.MNISTDataModule` pads them to
1x32x32 in its transforms (docs/data.md says why).

Examples:
    >>> from nestflex.data.mnist import mnist_available
    >>> mnist_available("/nonexistent")
    False
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from dataclasses import dataclass
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


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {what} file {path}: {exc}") from exc
    if not raw.startswith(_GZIP_MAGIC):  # decided by content, not by name: a renamed file still reads
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"{what} file {path} is a corrupt or truncated gzip file ({type(exc).__name__}: {exc}). "
            f"HINT: copy it again, or gunzip a good copy next to it"
        ) from exc


def read_idx(path: str | os.PathLike[str], ndim: int | None = None, *, what: str = "MNIST") -> np.ndarray:
    """Read one IDX file of unsigned bytes (gzipped or not) into a uint8 array.

    Args:
        path: the file.
        ndim: the number of dimensions the file must have (``None``: any).
        what: the dataset's name, for the messages (``"MNIST"``, ``"Fashion-MNIST"``).

    Returns:
        A uint8 array with the shape the header announces.

    Raises:
        DataError: unreadable file or gzip stream; a header shorter than its magic number and
            dimensions; a magic number whose first two bytes are not zero, whose type is not
            unsigned byte (0x08) or whose dimension count differs from ``ndim``; a body shorter
            or longer than the dimensions announce. The message names the file and the value.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x-idx1-ubyte"
        >>> _ = p.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(p, ndim=1).tolist()
        [7, 8, 9]
    """
    path = Path(path)
    raw = _read_bytes(path, what)
    if len(raw) < 4:
        raise DataError(
            f"{what} file {path} is {len(raw)} bytes long, too short for an IDX magic number (4 bytes). "
            "HINT: the file is empty or truncated; copy it again"
        )
    zero, code, dims = raw[:2], raw[2], raw[3]
    magic = int.from_bytes(raw[:4], "big")
    if zero != b"\x00\x00":
        raise DataError(
            f"{what} file {path} has magic number 0x{magic:08x}, not an IDX file (its first two bytes "
            "must be 0). HINT: is it an image or archive of another format? "
            f"Use the standard {what} IDX files"
        )
    if code != IDX_UBYTE:
        kind = _IDX_TYPES.get(code, "unknown")
        raise DataError(
            f"{what} file {path} has magic number 0x{magic:08x}: IDX type 0x{code:02x} ({kind}), expected "
            f"0x{IDX_UBYTE:02x} (unsigned byte). HINT: {what} images and labels are unsigned bytes; "
            "is this another dataset's file?"
        )
    if ndim is not None and dims != ndim:
        raise DataError(
            f"{what} file {path} has magic number 0x{magic:08x}: {dims} dimension(s), expected {ndim} "
            f"(magic 0x{0x800 | ndim:08x}). HINT: an images file has 3 (idx3), a labels file 1 (idx1); "
            "are the two swapped?"
        )
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(
            f"{what} file {path} is truncated inside its header: {len(raw)} bytes, the header of a "
            f"{dims}-dimensional IDX file needs {header}. HINT: copy the file again"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    expected = header + math.prod(shape)
    if len(raw) != expected:
        problem = "truncated" if len(raw) < expected else "longer than its header says"
        raise DataError(
            f"{what} file {path} is {problem}: its header announces shape {shape}, i.e. {expected:,} bytes "
            f"with the header, but it holds {len(raw):,}. HINT: copy the file again (decompressed size "
            "if gzipped)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


# ------------------------------------------------------------------------------------------------
# Locating and loading
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _IdxDataset:
    """What tells MNIST and Fashion-MNIST apart: everything but the IDX files' names and format."""

    what: str  # the name in messages
    subdirs: tuple[str, ...]  # relative to data_dir, "" = data_dir itself
    classes: tuple[str, ...]
    hint: str  # how to get the files
    size_hint: str  # what a file of other-sized images probably is

    def candidates(self, data_dir: str | os.PathLike[str]) -> list[Path]:
        root = Path(data_dir)
        return [root / sub if sub else root for sub in self.subdirs]


_MNIST = _IdxDataset(
    what="MNIST",
    subdirs=_SUBDIRS,
    classes=MNIST_CLASSES,
    hint=_HINT,
    size_hint="is it EMNIST or another IDX dataset? Only standard MNIST is supported",
)


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


def _present(directory: Path) -> set[str]:
    return set(_files_in(directory))


def _find_idx_dir(spec: _IdxDataset, data_dir: str | os.PathLike[str]) -> Path | None:
    return find_dir(spec.candidates(data_dir), _present, _REQUIRED)


def _require_idx_dir(spec: _IdxDataset, data_dir: str | os.PathLike[str]) -> Path:
    return require_dir(Path(data_dir), spec.candidates(data_dir), _present, _REQUIRED, what=spec.what,
                       expected=_EXPECTED, hint=spec.hint)


def _load_idx_split(
    spec: _IdxDataset, data_dir: str | os.PathLike[str], split: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one loader behind :func:`load_mnist` and :func:`~nestflex.data.load_fashion_mnist`."""
    if split not in MNIST_FILES:
        raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
    directory = _require_idx_dir(spec, data_dir)
    image_path, label_path = (_find_file(directory, n) for n in MNIST_FILES[split])
    images = read_idx(image_path, ndim=3, what=spec.what)
    labels = read_idx(label_path, ndim=1, what=spec.what)
    if images.shape[1:] != (_SIZE, _SIZE):
        raise DataError(
            f"{spec.what} file {image_path} holds images of {images.shape[1]}x{images.shape[2]} pixels, "
            f"expected {_SIZE}x{_SIZE}. HINT: {spec.size_hint}"
        )
    if len(labels) != len(images):
        raise DataError(
            f"{spec.what} files {image_path} and {label_path} disagree: {len(images):,} images but "
            f"{len(labels):,} labels. HINT: the two files come from different copies or splits; copy both "
            "again"
        )
    if len(labels) and labels.max() >= len(spec.classes):
        raise DataError(
            f"{spec.what} file {label_path}: labels must lie in 0..{len(spec.classes) - 1}, got values up to "
            f"{int(labels.max())}. HINT: is it an EMNIST letters file?"
        )
    return (
        torch.from_numpy(images.copy()).unsqueeze(1),
        torch.from_numpy(labels.astype(np.int64)),
    )


def find_mnist_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding all four MNIST files: ``data_dir``, ``data_dir/raw`` or ``data_dir/MNIST/raw``.

    Returns ``None`` when none of them holds all four (each may be gzipped). Only presence is
    checked; contents are validated when loaded.
    """
    return _find_idx_dir(_MNIST, data_dir)


def mnist_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether the four MNIST files are in ``data_dir`` (or its ``raw/`` or ``MNIST/raw/``).

    Args:
        data_dir: the directory to look in (need not exist).

    Examples:
        >>> mnist_available("/nonexistent")
        False
    """
    return find_mnist_dir(data_dir) is not None


def require_mnist_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_mnist_dir`, but raise when MNIST is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and where they may go.
    """
    return _require_idx_dir(_MNIST, data_dir)


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
    return _load_idx_split(_MNIST, data_dir, split)


# ------------------------------------------------------------------------------------------------
# Dataset
# ------------------------------------------------------------------------------------------------


class _IdxImages(ImageTensorDataset):
    """An IDX dataset (MNIST, Fashion-MNIST) in memory; subclasses name their :class:`_IdxDataset`."""

    _spec: _IdxDataset

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        images, targets = _load_idx_split(self._spec, data_dir, split)
        super().__init__(images, targets, classes=self._spec.classes, transform=transform)
        self.split = split


class MNIST(_IdxImages):
    """MNIST as a torch ``Dataset`` of ``(image, label)``, held in memory as uint8 ``(1, 28, 28)``.

    Args:
        data_dir: directory holding the four IDX files (or their ``raw/`` or ``MNIST/raw/``).
        split: ``"train"`` or ``"test"``.
        transform: callable applied to each uint8 ``(1, 28, 28)`` image; ``None`` returns
            float32 in [0, 1].

    Raises:
        DataError: see :func:`load_mnist`.

    Examples:
        >>> ds = MNIST("../shared/data/mnist", split="test")  # doctest: +SKIP
        >>> ds.images.shape  # doctest: +SKIP
        torch.Size([10000, 1, 28, 28])
    """

    _spec = _MNIST
