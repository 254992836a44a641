"""Real Fashion-MNIST from its four IDX files, gzipped or not; never downloaded.

Fashion-MNIST (Xiao, Rasul, Vollgraf, 2017) is a drop-in replacement for MNIST: 60,000 training
and 10,000 test greyscale 28x28 images of ten kinds of clothing, in the same IDX format and under
the same file names (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally ``.gz``). So it is read by
the MNIST code (:func:`~nestflex.data.mnist.read_idx` and the same checks: magic number, type,
dimensions, exact length, 28x28, as many labels as images, labels in 0..9); only the folders
searched, the class names, the normalisation constants and the messages differ.

The files are looked for in ``data_dir``, ``data_dir/raw`` and ``data_dir/FashionMNIST/raw`` (the
torchvision layout). Because the names are MNIST's, the folder is what says which dataset it is:
keep the two in different folders.

Examples:
    >>> from nestflex.data.fashion_mnist import fashion_mnist_available
    >>> fashion_mnist_available("/nonexistent")
    False
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from nestflex.data.mnist import _find_idx_dir, _IdxDataset, _IdxImages, _load_idx_split, _require_idx_dir

__all__ = [
    "FashionMNIST",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "fashion_mnist_available",
    "find_fashion_mnist_dir",
    "require_fashion_mnist_dir",
    "load_fashion_mnist",
]

#: Class names, index = label (the dataset's own names, as torchvision spells them).
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
#: Mean/std of the 60,000 training images at their native 28x28, in [0, 1] units: the published
#: values (72.94/255 and 90.02/255), as MNIST's constants are. Not recomputed here (the files are
#: not in this workplace); ``compute_mean_std(FashionMNIST(dir).images)`` recomputes them.
FASHION_MNIST_MEAN: tuple[float] = (0.2860,)
FASHION_MNIST_STD: tuple[float] = (0.3530,)

_FASHION = _IdxDataset(
    what="Fashion-MNIST",
    subdirs=("", "raw", "FashionMNIST/raw"),
    classes=FASHION_MNIST_CLASSES,
    hint=(
        "HINT: put the four standard Fashion-MNIST files (gzipped or not) in that directory, its `raw/` or "
        "its `FashionMNIST/raw/`; nestflex never downloads Fashion-MNIST"
    ),
    size_hint="is it another IDX dataset? Only standard Fashion-MNIST is supported",
)


def find_fashion_mnist_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding all four Fashion-MNIST files: ``data_dir``, ``data_dir/raw`` or
    ``data_dir/FashionMNIST/raw``; ``None`` when none holds all four. Only presence is checked."""
    return _find_idx_dir(_FASHION, data_dir)


def fashion_mnist_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether the four Fashion-MNIST files are in ``data_dir`` (or its ``raw/`` or ``FashionMNIST/raw/``).

    Args:
        data_dir: the directory to look in (need not exist).

    Examples:
        >>> fashion_mnist_available("/nonexistent")
        False
    """
    return find_fashion_mnist_dir(data_dir) is not None


def require_fashion_mnist_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_fashion_mnist_dir`, but raise when Fashion-MNIST is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and where they may go.
    """
    return _require_idx_dir(_FASHION, data_dir)


def load_fashion_mnist(
    data_dir: str | os.PathLike[str], split: str = "train"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one Fashion-MNIST split as tensors.

    Args:
        data_dir: directory holding the IDX files (or their ``raw/`` or ``FashionMNIST/raw/``).
        split: ``"train"`` (60,000 images in the standard files) or ``"test"`` (10,000).

    Returns:
        ``(images, targets)``: uint8 ``(N, 1, 28, 28)`` and int64 ``(N,)``.

    Raises:
        DataError: as :func:`~nestflex.data.load_mnist`, with "Fashion-MNIST" in the messages.
    """
    return _load_idx_split(_FASHION, data_dir, split)


class FashionMNIST(_IdxImages):
    """Fashion-MNIST as a torch ``Dataset`` of ``(image, label)``, held in memory as uint8 ``(1, 28, 28)``.

    Args:
        data_dir: directory holding the four IDX files (or their ``raw/`` or ``FashionMNIST/raw/``).
        split: ``"train"`` or ``"test"``.
        transform: callable applied to each uint8 ``(1, 28, 28)`` image; ``None`` returns
            float32 in [0, 1].

    Raises:
        DataError: see :func:`load_fashion_mnist`.

    Examples:
        >>> ds = FashionMNIST("./data/fashion", split="test")  # doctest: +SKIP
        >>> ds.images.shape, ds.classes[9]  # doctest: +SKIP
        (torch.Size([10000, 1, 28, 28]), 'Ankle boot')
    """

    _spec = _FASHION
