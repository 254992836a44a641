"""LightningDataModules for CIFAR-10, MNIST and the synthetic dataset.

All split the same way: a seeded validation hold-out of the training split (5,000 samples by
default; exit thresholds are calibrated on it, so it must never be trained on), an optional
seeded subset of the rest for quick runs (``max_train_samples``), and the official test split.
Training batches get a random crop from a zero padding (+ horizontal flip where the classes
allow it), every split gets per-channel normalisation with the dataset's :attr:`mean` /
:attr:`std`. :attr:`input_shape` is the per-sample shape the loaders yield, known before
:meth:`setup`: models are built and traced from it (MNIST: ``(1, 32, 32)``, its 28x28 digits
padded by 2 pixels).

Example:
    >>> from nestflex.data import SyntheticDataModule
    >>> dm = SyntheticDataModule(batch_size=16, train_size=200, test_size=50, val_size=40)
    >>> dm.setup()
    >>> x, y = next(iter(dm.train_dataloader()))
    >>> x.shape, len(dm.val_dataset), len(dm.test_dataset), dm.synthetic, dm.input_shape
    (torch.Size([16, 3, 32, 32]), 40, 50, True, (3, 32, 32))
"""

from __future__ import annotations

import copy
import os
from typing import Callable

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, RandomSampler, Subset

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._transforms import eval_transform, train_transform
from nestflex.data.cifar import CIFAR10, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, download_cifar10
from nestflex.data.mnist import MNIST, MNIST_CLASSES, MNIST_MEAN, MNIST_STD
from nestflex.data.synthetic import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_MEAN,
    SYNTHETIC_STD,
    SYNTHETIC_TEST_SIZE,
    SYNTHETIC_TRAIN_SIZE,
    SyntheticShapes,
)
from nestflex.errors import DataError

__all__ = [
    "EpochShuffleSampler",
    "ImageDataModule",
    "CIFAR10DataModule",
    "MNISTDataModule",
    "SyntheticDataModule",
    "DEFAULT_VAL_SIZE",
]

DEFAULT_VAL_SIZE = 5000


def _check_int(name: str, value: object, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if allow_none else ""
        raise DataError(f"`{name}` must be an integer >= {minimum}{extra}, got {value!r}")


class EpochShuffleSampler(RandomSampler):
    """A shuffle that is a function of ``(seed, epoch)`` only.

    Lightning calls ``set_epoch`` before every epoch (also after resuming from a checkpoint),
    so a resumed run sees the same order as an uninterrupted one; a ``DataLoader`` generator
    would restart from its seed instead. Under DDP Lightning swaps it for a seeded
    ``DistributedSampler``, which is resumable the same way.

    Example:
        >>> s = EpochShuffleSampler(range(5), seed=0)
        >>> s.set_epoch(1); a = list(s); s.set_epoch(1); a == list(s)
        True
    """

    def __init__(self, data_source, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(len(self.data_source), generator=gen).tolist())


def _with_transform(
    dataset: ImageTensorDataset, transform: Callable[[torch.Tensor], torch.Tensor]
) -> ImageTensorDataset:
    # A shallow copy shares the image tensors (no copy of the data) but has its own transform,
    # so the augmented training view and the plain validation view come from one split.
    view = copy.copy(dataset)
    view.transform = transform
    return view


class ImageDataModule(pl.LightningDataModule):
    """Shared splitting and loading; subclasses say where the two splits come from.

    Args:
        batch_size: samples per batch, for every split.
        num_workers: DataLoader worker processes (0 loads in the main process).
        max_train_samples: if set, train on a seeded subset of this many samples of what is left
            after the validation hold-out (all of it when fewer remain).
        val_size: validation hold-out taken from the training split: a count (int >= 1) or a
            fraction (float in (0, 1)).
        seed: seed of the hold-out, the subset and the training shuffle order.
        pin_memory: passed to the DataLoaders (useful with a GPU).

    Attributes:
        name, synthetic, num_classes, classes, mean, std: describe the dataset (available before
            :meth:`setup`); ``mean``/``std`` have one value per channel.
        input_shape: per-sample ``(C, H, W)`` of what the loaders yield, after the transforms
            (available before :meth:`setup`, checked against the data in it).
        border, crop_padding, flip: the transforms: a zero border added to every image of every
            split, the zero padding of the training crop, and whether training images are flipped.
        train_dataset, val_dataset, test_dataset: after :meth:`setup`.
        train_indices, val_indices: indices into the full training split, after :meth:`setup`.
    """

    name: str = ""
    synthetic: bool = False
    num_classes: int = 10
    classes: tuple[str, ...] = ()
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    input_shape: tuple[int, int, int] = (3, 32, 32)
    border: int = 0
    crop_padding: int = 4
    flip: bool = True

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        val_size: int | float = DEFAULT_VAL_SIZE,
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        _check_int("batch_size", batch_size, 1)
        _check_int("num_workers", num_workers, 0)
        _check_int("max_train_samples", max_train_samples, 1, allow_none=True)
        _check_int("seed", seed, 0)
        is_count = isinstance(val_size, int) and not isinstance(val_size, bool) and val_size >= 1
        is_fraction = isinstance(val_size, float) and 0 < val_size < 1
        if not (is_count or is_fraction):
            raise DataError(
                f"`val_size` must be a count >= 1 or a fraction in (0, 1), got {val_size!r}. "
                "HINT: later stages calibrate exit thresholds on this hold-out, so it cannot be empty"
            )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_train_samples = max_train_samples
        self.val_size = val_size
        self.seed = seed
        self.pin_memory = pin_memory
        self.train_dataset: Subset | None = None
        self.val_dataset: Subset | None = None
        self.test_dataset: ImageTensorDataset | None = None
        self.train_indices: torch.Tensor | None = None
        self.val_indices: torch.Tensor | None = None

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        """Return the full (train, test) splits, without transforms."""
        raise NotImplementedError

    def _val_count(self, n_train: int) -> int:
        count = round(self.val_size * n_train) if isinstance(self.val_size, float) else self.val_size
        if not 1 <= count < n_train:
            raise DataError(
                f"`val_size`={self.val_size!r} holds out {count} of the {n_train} samples of the "
                f"{self.name} training split; both the hold-out and the rest need at least one. "
                "HINT: pass a count or fraction in between"
            )
        return count

    def setup(self, stage: str | None = None) -> None:
        """Load the splits and draw the hold-out (once; later calls reuse them)."""
        if self.train_dataset is not None:
            return
        train, test = self._load_splits()
        n = len(train)
        n_val = self._val_count(n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        self.val_indices = perm[:n_val].sort().values
        rest = perm[n_val:]
        if self.max_train_samples is not None:
            rest = rest[: self.max_train_samples]
        self.train_indices = rest.sort().values
        train_t = train_transform(self.mean, self.std, self.crop_padding, flip=self.flip, border=self.border)
        eval_t = eval_transform(self.mean, self.std, border=self.border)
        augmented = _with_transform(train, train_t)
        plain = _with_transform(train, eval_t)
        self.train_dataset = Subset(augmented, self.train_indices.tolist())
        self.val_dataset = Subset(plain, self.val_indices.tolist())
        self.test_dataset = _with_transform(test, eval_t)
        for split, images in (("train", train.images), ("test", test.images)):
            # the eval transform: the training one draws random numbers, and setup must not
            shape = tuple(eval_t(images[0]).shape) if len(images) else tuple(self.input_shape)
            if shape != tuple(self.input_shape):
                raise DataError(
                    f"{type(self).__name__}: the {split} split yields samples of shape {shape}, but "
                    f"`input_shape` is {tuple(self.input_shape)}; models would be built and traced for the "
                    "wrong shape. HINT: a subclass that changes its images or transforms must set `input_shape`"
                )

    def _loader(self, dataset: torch.utils.data.Dataset, train: bool) -> DataLoader:
        if dataset is None:
            raise DataError(f"{type(self).__name__}: call `setup()` before asking for a dataloader")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=EpochShuffleSampler(dataset, self.seed) if train else None,
            # A training batch of 1 breaks BatchNorm; dropping the last partial batch avoids it.
            drop_last=train and len(dataset) > self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, train=False)

    def describe(self) -> dict[str, object]:
        """Plain-data description for ``summary.json`` files."""
        out: dict[str, object] = {
            "name": self.name,
            "synthetic": self.synthetic,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "seed": self.seed,
            "val_size": self.val_size,
            "max_train_samples": self.max_train_samples,
        }
        if self.train_indices is not None:
            out.update(
                train_samples=len(self.train_indices),
                val_samples=len(self.val_indices),
                test_samples=len(self.test_dataset),
            )
        return out


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 from the python-batch files in ``data_dir``.

    Args:
        data_dir: directory holding ``cifar-10-batches-py/`` (or the batch files themselves).
        download: fetch CIFAR-10 into ``data_dir`` in :meth:`prepare_data` if it is missing.
        **kwargs: see :class:`ImageDataModule` (batch_size, num_workers, max_train_samples,
            val_size, seed, pin_memory).

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Example:
        >>> dm = CIFAR10DataModule("./data", batch_size=128)  # doctest: +SKIP
        >>> dm.setup(); len(dm.train_dataset), len(dm.val_dataset)  # doctest: +SKIP
        (45000, 5000)
    """

    name = "cifar10"
    synthetic = False
    classes = CIFAR10_CLASSES
    mean = CIFAR10_MEAN
    std = CIFAR10_STD

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = "./data",
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        val_size: int | float = DEFAULT_VAL_SIZE,
        download: bool = False,
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        self.data_dir = os.fspath(data_dir)
        self.download = download

    def prepare_data(self) -> None:
        if self.download:
            download_cifar10(self.data_dir)

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        train = CIFAR10(self.data_dir, "train", download=self.download)
        test = CIFAR10(self.data_dir, "test")
        self.classes = train.classes
        return train, test

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "data_dir": self.data_dir}


class MNISTDataModule(ImageDataModule):
    """MNIST from the four standard IDX files in ``data_dir``, padded to 1x32x32.

    The 28x28 digits get a 2-pixel zero border in every split (LeNet-5's 32x32 input), because
    the CIFAR networks need it: VGG halves the resolution five times (28 -> 14 -> 7 -> 3 -> 1 ->
    nothing) and its classifier expects one pixel per channel after the last pooling, which a
    32x32 input gives. Training adds random shifts of up to 2 pixels (a crop from a further zero
    padding) and no flip: a mirrored digit is another glyph. Normalisation uses the usual MNIST
    mean/std (:data:`~nestflex.data.mnist.MNIST_MEAN`).

    Args:
        data_dir: directory holding the IDX files (or their ``raw/`` or ``MNIST/raw/``); nothing
            is ever downloaded.
        **kwargs: see :class:`ImageDataModule` (batch_size, num_workers, max_train_samples,
            val_size, seed, pin_memory).

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Example:
        >>> dm = MNISTDataModule("../shared/data/mnist")  # doctest: +SKIP
        >>> dm.setup(); len(dm.train_dataset), len(dm.val_dataset), dm.input_shape  # doctest: +SKIP
        (55000, 5000, (1, 32, 32))
    """

    name = "mnist"
    synthetic = False
    classes = MNIST_CLASSES
    mean = MNIST_MEAN
    std = MNIST_STD
    input_shape = (1, 32, 32)
    border = 2
    crop_padding = 2
    flip = False

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = "./data",
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        val_size: int | float = DEFAULT_VAL_SIZE,
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        self.data_dir = os.fspath(data_dir)

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        return MNIST(self.data_dir, "train"), MNIST(self.data_dir, "test")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "data_dir": self.data_dir}


class SyntheticDataModule(ImageDataModule):
    """The synthetic shapes dataset (:mod:`nestflex.data.synthetic`), rendered in :meth:`setup`.

    Args:
        batch_size, num_workers, max_train_samples, val_size, seed, pin_memory: see
            :class:`ImageDataModule`; ``seed`` also seeds the dataset itself.
        train_size: samples rendered for the training split (the hold-out comes out of them).
        test_size: samples rendered for the test split.

    Example:
        >>> dm = SyntheticDataModule(train_size=300, test_size=100, val_size=50)
        >>> dm.setup(); dm.test_dataset.difficulty.shape
        torch.Size([100])
    """

    name = "synthetic"
    synthetic = True
    classes = SYNTHETIC_CLASSES
    mean = SYNTHETIC_MEAN
    std = SYNTHETIC_STD

    def __init__(
        self,
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        train_size: int = SYNTHETIC_TRAIN_SIZE,
        test_size: int = SYNTHETIC_TEST_SIZE,
        val_size: int | float = DEFAULT_VAL_SIZE,
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        _check_int("train_size", train_size, 2)
        _check_int("test_size", test_size, 1)
        self.train_size = train_size
        self.test_size = test_size

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        return (
            SyntheticShapes("train", self.train_size, self.seed),
            SyntheticShapes("test", self.test_size, self.seed),
        )

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "train_size": self.train_size, "test_size": self.test_size}
