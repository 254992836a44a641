"""Datasets: real CIFAR-10 and MNIST, and the embedded synthetic default.

* :mod:`nestflex.data.synthetic`: :class:`SyntheticShapes` / :func:`make_synthetic`, a
  deterministic 10-class 32x32 dataset with per-sample difficulty (the offline default).
* :mod:`nestflex.data.cifar`: :class:`CIFAR10` from the python-batch files, read with a
  restricted unpickler; downloads only when asked.
* :mod:`nestflex.data.mnist`: :class:`MNIST` from the four standard IDX files (gzipped or
  not), validated; never downloaded.
* transforms: zero border, pad-and-crop (+ flip) and normalisation in plain torch, per image or
  per batch.
* :class:`CIFAR10DataModule`, :class:`MNISTDataModule`, :class:`SyntheticDataModule` and
  :func:`resolve_data` for Lightning and the recipes.

Everything except the DataModules and :func:`resolve_data` needs torch and numpy only. Those
import Lightning, so they are loaded on first access, and ``import nestflex.data`` (or
``nestflex.data.synthetic``) works where Lightning is not installed.

Example:
    >>> from nestflex.data import SyntheticShapes, resolve_data
    >>> len(SyntheticShapes("test", size=10))
    10
"""

from __future__ import annotations

import importlib
from typing import Any

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._transforms import (
    Compose,
    Normalize,
    Pad,
    RandomCropFlip,
    compute_mean_std,
    eval_transform,
    pad,
    random_crop_flip,
    to_float,
    train_transform,
)
from nestflex.data.cifar import (
    CIFAR10,
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    cifar10_available,
    download_cifar10,
    load_cifar10,
)
from nestflex.data.mnist import (
    MNIST,
    MNIST_CLASSES,
    MNIST_MEAN,
    MNIST_STD,
    load_mnist,
    mnist_available,
    read_idx,
)
from nestflex.data.synthetic import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_MEAN,
    SYNTHETIC_STD,
    SYNTHETIC_TEST_SIZE,
    SYNTHETIC_TRAIN_SIZE,
    SyntheticShapes,
    make_synthetic,
)

# Public names that live in Lightning-importing modules, resolved on first access (PEP 562).
_LAZY = {
    "ImageDataModule": "nestflex.data.datamodule",
    "CIFAR10DataModule": "nestflex.data.datamodule",
    "MNISTDataModule": "nestflex.data.datamodule",
    "SyntheticDataModule": "nestflex.data.datamodule",
    "DATA_KINDS": "nestflex.data.resolve",
    "resolve_data": "nestflex.data.resolve",
}

__all__ = [
    # datasets
    "ImageTensorDataset",
    "SyntheticShapes",
    "make_synthetic",
    "SYNTHETIC_CLASSES",
    "SYNTHETIC_MEAN",
    "SYNTHETIC_STD",
    "SYNTHETIC_TRAIN_SIZE",
    "SYNTHETIC_TEST_SIZE",
    "CIFAR10",
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "cifar10_available",
    "download_cifar10",
    "load_cifar10",
    "MNIST",
    "MNIST_CLASSES",
    "MNIST_MEAN",
    "MNIST_STD",
    "load_mnist",
    "mnist_available",
    "read_idx",
    # transforms
    "Compose",
    "Normalize",
    "Pad",
    "RandomCropFlip",
    "compute_mean_std",
    "eval_transform",
    "pad",
    "random_crop_flip",
    "to_float",
    "train_transform",
    # Lightning (lazy)
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nestflex.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
