"""Real SVHN (cropped digits, "format 2") from its MATLAB files; never downloaded.

The Street View House Numbers cropped-digit set (Netzer et al., 2011) is distributed as MATLAB v5
files: ``train_32x32.mat`` (73,257 images), ``test_32x32.mat`` (26,032) and the optional
``extra_32x32.mat`` (531,131). Each holds ``X``, uint8 of shape ``32 x 32 x 3 x N`` (height,
width, RGB, sample), and ``y``, ``N x 1`` labels in 1..10 where **10 means the digit 0**; it is
mapped to 0 here, as torchvision does, so label ``d`` is digit ``d``.

The files are read with :func:`scipy.io.loadmat` (scipy is in nestflex's ``train`` extra and
imported only here, when a file is read), only the ``X`` and ``y`` variables, and checked: a
4-d uint8 ``X`` of 32x32x3 images, one integer label per image, labels in 0..10. A MATLAB v7.3
(HDF5) file, a damaged file or a wrong shape raises :class:`~nestflex.errors.DataError` naming
the file, the value and the fix. Unlike the pickled CIFAR files, a MAT file cannot run code when
read: loadmat builds arrays only.

The files are looked for in ``data_dir``, ``data_dir/svhn`` and ``data_dir/SVHN``.

Examples:
    >>> from nestflex.data.svhn import svhn_available
    >>> svhn_available("/nonexistent")
    False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._locate import find_dir, require_dir
from nestflex.errors import DataError

__all__ = [
    "SVHN",
    "SVHN_CLASSES",
    "SVHN_MEAN",
    "SVHN_STD",
    "SVHN_FILES",
    "svhn_available",
    "find_svhn_dir",
    "require_svhn_dir",
    "load_svhn",
]

#: ``split -> file name``; ``extra`` is optional and read only when asked for.
SVHN_FILES: dict[str, str] = {
    "train": "train_32x32.mat",
    "test": "test_32x32.mat",
    "extra": "extra_32x32.mat",
}
SVHN_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
#: Per-channel mean/std of the 73,257 training images (``train_32x32.mat``), in [0, 1] units: the
#: published values, as MNIST's and CIFAR's constants are. Not recomputed here (the files are not
#: in this workplace); ``compute_mean_std(SVHN(dir).images)`` recomputes them.
SVHN_MEAN: tuple[float, float, float] = (0.4377, 0.4438, 0.4728)
SVHN_STD: tuple[float, float, float] = (0.1980, 0.2010, 0.1970)

_SHAPE = (32, 32, 3)
_REQUIRED = (SVHN_FILES["train"], SVHN_FILES["test"])
_SUBDIRS = ("", "svhn", "SVHN")
_EXPECTED = f"{_REQUIRED[0]}, {_REQUIRED[1]} (the cropped-digit format-2 files)"
_HINT = (
    "HINT: put the SVHN .mat files in that directory, its `svhn/` or its `SVHN/`; nestflex never "
    "downloads SVHN"
)


def _candidates(data_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(data_dir)
    return [root / sub if sub else root for sub in _SUBDIRS]


def _present(directory: Path) -> set[str]:
    return {f for f in _REQUIRED if (directory / f).is_file()}


def find_svhn_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding ``train_32x32.mat`` and ``test_32x32.mat``: ``data_dir``,
    ``data_dir/svhn`` or ``data_dir/SVHN``; ``None`` when none holds both. Only presence is checked."""
    return find_dir(_candidates(data_dir), _present, _REQUIRED)


def svhn_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether SVHN's train and test files are in ``data_dir`` (or its ``svhn/`` or ``SVHN/``).

    Args:
        data_dir: the directory to look in (need not exist).

    Examples:
        >>> svhn_available("/nonexistent")
        False
    """
    return find_svhn_dir(data_dir) is not None


def require_svhn_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_svhn_dir`, but raise when SVHN is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and where they may go.
    """
    return require_dir(Path(data_dir), _candidates(data_dir), _present, _REQUIRED, what="SVHN",
                       expected=_EXPECTED, hint=_HINT)


def _loadmat(path: Path) -> dict:
    try:
        from scipy.io import loadmat
    except ImportError as exc:
        raise DataError(
            f"reading SVHN file {path} needs scipy, which is not installed. "
            "HINT: pip install 'nestflex[train]' (or scipy)"
        ) from exc
    try:
        return loadmat(path, variable_names=("X", "y"))
    except NotImplementedError as exc:  # scipy's answer to MATLAB v7.3, which is HDF5
        raise DataError(
            f"SVHN file {path} is a MATLAB v7.3 (HDF5) file, which scipy cannot read ({exc}). "
            "HINT: use the original SVHN files (MATLAB v5), or re-save it with `save(..., '-v7')`"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any failure to parse means "not a valid MAT file"
        raise DataError(
            f"SVHN file {path} is corrupt or not a MATLAB file ({type(exc).__name__}: {exc}). "
            "HINT: copy it again"
        ) from exc


def _labels(y: object, n: int, path: Path) -> np.ndarray:
    if not isinstance(y, np.ndarray) or y.size != n or (y.ndim == 2 and 1 not in y.shape) or y.ndim > 2:
        desc = f"{y.dtype} {y.shape}" if isinstance(y, np.ndarray) else type(y).__name__
        raise DataError(
            f"SVHN file {path}: `y` must hold one label per image, shape ({n}, 1), got {desc}. "
            "HINT: X and y come from different files?"
        )
    labels = y.reshape(-1)
    if np.issubdtype(labels.dtype, np.floating) and np.all(np.mod(labels, 1) == 0):
        labels = labels.astype(np.int64)  # MATLAB stores numbers as doubles unless told otherwise
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"SVHN file {path}: `y` must hold integer labels, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if n and (labels.min() < 0 or labels.max() > 10):
        raise DataError(
            f"SVHN file {path}: labels must lie in 1..10 (10 = digit 0; a 0 is read as 0 too), got range "
            f"{labels.min()}..{labels.max()}"
        )
    labels[labels == 10] = 0
    return labels


def load_svhn(data_dir: str | os.PathLike[str], split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """Load one SVHN split as tensors.

    Args:
        data_dir: directory holding the ``.mat`` files (or its ``svhn/`` or ``SVHN/``).
        split: ``"train"``, ``"test"`` or ``"extra"`` (``extra_32x32.mat``, needed only for it).

    Returns:
        ``(images, targets)``: uint8 ``(N, 3, 32, 32)`` and int64 ``(N,)``, label ``d`` = digit ``d``.

    Raises:
        DataError: unknown split; files missing; scipy missing; a file that is corrupt, MATLAB
            v7.3, lacks ``X`` or ``y``, or whose ``X`` is not uint8 ``32 x 32 x 3 x N`` or whose
            ``y`` is not ``N`` integer labels in 1..10.
    """
    if split not in SVHN_FILES:
        raise DataError(f"`split` must be one of {list(SVHN_FILES)}, got {split!r}")
    directory = require_svhn_dir(data_dir)
    path = directory / SVHN_FILES[split]
    if not path.is_file():  # only "extra" gets here: the other two were just found
        raise DataError(f"SVHN file {path} not found (the `extra` split is optional). {_HINT}")
    mat = _loadmat(path)
    missing = [k for k in ("X", "y") if k not in mat]
    if missing:
        found = sorted(k for k in mat if not k.startswith("__"))
        raise DataError(
            f"SVHN file {path} lacks variable(s) {missing}; found {found}. HINT: is it the full-numbers "
            "(format 1) set or another dataset? Only the cropped digits `*_32x32.mat` are supported"
        )
    x = mat["X"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != _SHAPE:
        desc = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise DataError(
            f"SVHN file {path}: `X` must be a uint8 array of shape (32, 32, 3, N) (height, width, RGB, "
            f"sample), got {desc}. HINT: only the cropped-digit files `*_32x32.mat` are supported"
        )
    labels = _labels(mat["y"], x.shape[3], path)
    images = np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)))  # (H, W, C, N) -> (N, C, H, W)
    return torch.from_numpy(images), torch.from_numpy(labels)


class SVHN(ImageTensorDataset):
    """SVHN cropped digits as a torch ``Dataset`` of ``(image, label)``, in memory as uint8 ``(3, 32, 32)``.

    Args:
        data_dir: directory holding ``train_32x32.mat`` and ``test_32x32.mat`` (or its ``svhn/``
            or ``SVHN/``).
        split: ``"train"``, ``"test"`` or ``"extra"``.
        transform: callable applied to each uint8 ``(3, 32, 32)`` image; ``None`` returns
            float32 in [0, 1].

    Raises:
        DataError: see :func:`load_svhn`.

    Examples:
        >>> ds = SVHN("./data/svhn", split="test")  # doctest: +SKIP
        >>> ds.images.shape  # doctest: +SKIP
        torch.Size([26032, 3, 32, 32])
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        images, targets = load_svhn(data_dir, split)
        super().__init__(images, targets, classes=SVHN_CLASSES, transform=transform)
        self.split = split
