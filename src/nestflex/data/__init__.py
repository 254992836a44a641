"""Datasets: real CIFAR-10/100, MNIST, Fashion-MNIST, SVHN, your own image folders, and the synthetic default.

Every reader takes files from a local directory, validates them and raises
:class:`~nestflex.errors.DataError` naming the file, the value and the fix; only CIFAR-10
downloads, and only when asked.

* :mod:`nestflex.data.synthetic`: :class:`SyntheticShapes` / :func:`make_synthetic`, a
  deterministic 10-class 32x32 dataset with per-sample difficulty (the offline default).
* :mod:`nestflex.data.cifar`: :class:`CIFAR10` from the python-batch files, read with a
  restricted unpickler; downloads only when asked.
* :mod:`nestflex.data.cifar100`: :class:`CIFAR100` from ``cifar-100-python/`` through the same
  unpickler, fine (100) or coarse (20) labels.
* :mod:`nestflex.data.mnist`: :class:`MNIST` from the four standard IDX files (gzipped or
  not), validated; never downloaded. :mod:`nestflex.data.fashion_mnist`: :class:`FashionMNIST`,
  the same format and reader.
* :mod:`nestflex.data.svhn`: :class:`SVHN` cropped digits from ``train_32x32.mat`` /
  ``test_32x32.mat`` (scipy), label 10 read as digit 0.
* :mod:`nestflex.data.imagefolder`: :class:`ImageFolder`, ``root/<class>/<image>`` (PNG, JPEG,
  BMP, WebP) decoded with Pillow, 1 or 3 channels, any size or resized; ``train/``/``test/``
  subfolders or a seeded split.
* transforms: zero border, pad-and-crop (+ flip) and normalisation in plain torch, per image or
  per batch.
* DataModules (:class:`CIFAR10DataModule`, :class:`CIFAR100DataModule`,
  :class:`MNISTDataModule`, :class:`FashionMNISTDataModule`, :class:`SVHNDataModule`,
  :class:`ImageFolderDataModule`, :class:`SyntheticDataModule`) and :func:`resolve_data` for
  Lightning and the recipes. A DataModule of your own works too: docs/data.md says what
  nestflex reads from it.

Everything except the DataModules and :func:`resolve_data` needs torch and numpy only (SVHN's
reader imports scipy, the image folder's Pillow, when they read files). The DataModules import
Lightning, so they are loaded on first access, and ``import nestflex.data`` (or
``nestflex.data.synthetic``) works where Lightning is not installed.

Examples:
    >>> from nestflex.data import SyntheticShapes, resolve_data
    >>> len(SyntheticShapes("test", size=10))
    10
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nestflex._lazy import lazy_exports
from nestflex.data._dataset import ImageTensorDataset

if TYPE_CHECKING:  # the lazy names below, for type checkers, IDEs and the API reference (read statically)
    from nestflex.data.datamodule import (
        CIFAR10DataModule,
        CIFAR100DataModule,
        FashionMNISTDataModule,
        ImageDataModule,
        ImageFolderDataModule,
        MNISTDataModule,
        SVHNDataModule,
        SyntheticDataModule,
    )
    from nestflex.data.resolve import DATA_KINDS, resolve_data
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
from nestflex.data.cifar100 import (
    CIFAR100,
    CIFAR100_COARSE_CLASSES,
    CIFAR100_FINE_CLASSES,
    CIFAR100_LABEL_TYPES,
    CIFAR100_MEAN,
    CIFAR100_STD,
    cifar100_available,
    cifar100_classes,
    load_cifar100,
)
from nestflex.data.fashion_mnist import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    FashionMNIST,
    fashion_mnist_available,
    load_fashion_mnist,
)
from nestflex.data.imagefolder import (
    IMAGE_EXTENSIONS,
    ImageFolder,
    ImageFolderIndex,
    image_folder_shape,
    index_image_folder,
    load_image_folder,
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
from nestflex.data.svhn import (
    SVHN,
    SVHN_CLASSES,
    SVHN_MEAN,
    SVHN_STD,
    load_svhn,
    svhn_available,
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
    "CIFAR100DataModule": "nestflex.data.datamodule",
    "MNISTDataModule": "nestflex.data.datamodule",
    "FashionMNISTDataModule": "nestflex.data.datamodule",
    "SVHNDataModule": "nestflex.data.datamodule",
    "ImageFolderDataModule": "nestflex.data.datamodule",
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
    "FashionMNIST",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "fashion_mnist_available",
    "load_fashion_mnist",
    "CIFAR100",
    "CIFAR100_FINE_CLASSES",
    "CIFAR100_COARSE_CLASSES",
    "CIFAR100_LABEL_TYPES",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "cifar100_available",
    "cifar100_classes",
    "load_cifar100",
    "SVHN",
    "SVHN_CLASSES",
    "SVHN_MEAN",
    "SVHN_STD",
    "load_svhn",
    "svhn_available",
    "IMAGE_EXTENSIONS",
    "ImageFolder",
    "ImageFolderIndex",
    "image_folder_shape",
    "index_image_folder",
    "load_image_folder",
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
    # Lightning (lazy: _LAZY; written out so static readers such as the API reference see them)
    "ImageDataModule",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "MNISTDataModule",
    "FashionMNISTDataModule",
    "SVHNDataModule",
    "ImageFolderDataModule",
    "SyntheticDataModule",
    "DATA_KINDS",
    "resolve_data",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
