"""LightningDataModules for CIFAR-10/100, MNIST, Fashion-MNIST, SVHN, image folders and the synthetic set.

All split the same way: a seeded validation hold-out of the training split (5,000 samples by
default; exit thresholds are calibrated on it, so it must never be trained on), an optional
seeded subset of the rest for quick runs (``max_train_samples``), and the official test split.
Training batches get a random crop from a zero padding (+ horizontal flip where the classes
allow it), every split gets per-channel normalisation with the dataset's :attr:`mean` /
:attr:`std`. :attr:`input_shape` is the per-sample shape the loaders yield, known before
:meth:`setup`: models are built and traced from it (MNIST and Fashion-MNIST: ``(1, 32, 32)``,
their 28x28 images padded by 2 pixels; an image folder: its images' channels and size).

Examples:
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
from functools import cached_property
from typing import Callable, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, RandomSampler, Subset

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._transforms import compute_mean_std, eval_transform, train_transform
from nestflex.data.cifar import CIFAR10, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, download_cifar10
from nestflex.data.cifar100 import CIFAR100, CIFAR100_MEAN, CIFAR100_STD, cifar100_classes
from nestflex.data.fashion_mnist import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    FashionMNIST,
)
from nestflex.data.imagefolder import (
    ImageFolder,
    ImageFolderIndex,
    _check_channels,
    _check_fraction,
    _check_image_size,
    _check_seed,
    image_folder_shape,
    index_image_folder,
)
from nestflex.data.mnist import MNIST, MNIST_CLASSES, MNIST_MEAN, MNIST_STD
from nestflex.data.svhn import SVHN, SVHN_CLASSES, SVHN_MEAN, SVHN_STD
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
    "CIFAR100DataModule",
    "MNISTDataModule",
    "FashionMNISTDataModule",
    "SVHNDataModule",
    "ImageFolderDataModule",
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

    Examples:
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
        name: the dataset's short name (``"cifar10"``, ``"mnist"``, ...).
        synthetic: whether the data is generated rather than read from files.
        num_classes: number of classes.
        classes: class names, index = label.
        mean: per-channel mean in [0, 1] units, used by the normalisation.
        std: per-channel standard deviation in [0, 1] units, used by the normalisation.
        input_shape: per-sample ``(C, H, W)`` of what the loaders yield, after the transforms
            (available before :meth:`setup`, checked against the data in it).
        input_scale: factor from the stored 8-bit pixels to the [0, 1] range ``mean``/``std``
            apply to: ``1/255`` for every dataset here (a bundle records it, so a caller knows to
            compute ``(raw / 255 - mean) / std``).
        border: zero border in pixels added to every image of every split.
        crop_padding: zero padding in pixels of the training crop.
        flip: whether training images are flipped left-right.
        train_dataset: the training subset (augmented), after :meth:`setup`.
        val_dataset: the validation hold-out (not augmented), after :meth:`setup`.
        test_dataset: the test split (not augmented), after :meth:`setup`.
        train_indices: indices of the training subset into the full training split, after
            :meth:`setup`.
        val_indices: indices of the hold-out into the full training split, after :meth:`setup`.
    """

    name: str = ""
    synthetic: bool = False
    num_classes: int = 10
    classes: tuple[str, ...] = ()
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.25, 0.25, 0.25)
    input_shape: tuple[int, int, int] = (3, 32, 32)
    input_scale: float = 1 / 255
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


class _DirDataModule(ImageDataModule):
    """A dataset read from files under ``data_dir``: the argument, and ``data_dir`` in :meth:`describe`."""

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

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "data_dir": self.data_dir}


class CIFAR10DataModule(_DirDataModule):
    """CIFAR-10 from the python-batch files in ``data_dir``.

    Args:
        data_dir: directory holding ``cifar-10-batches-py/`` (or the batch files themselves).
        batch_size: samples per batch, for every split.
        num_workers: DataLoader worker processes (0 loads in the main process).
        max_train_samples: if set, train on a seeded subset of this many samples of what is left
            after the validation hold-out (all of it when fewer remain).
        val_size: validation hold-out taken from the training split: a count (int >= 1) or a
            fraction (float in (0, 1)).
        download: fetch CIFAR-10 into ``data_dir`` in :meth:`prepare_data` if it is missing.
        seed: seed of the hold-out, the subset and the training shuffle order.
        pin_memory: passed to the DataLoaders (useful with a GPU).

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Examples:
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
        super().__init__(data_dir, batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        self.download = download

    def prepare_data(self) -> None:
        if self.download:
            download_cifar10(self.data_dir)

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        train = CIFAR10(self.data_dir, "train", download=self.download)
        test = CIFAR10(self.data_dir, "test")
        self.classes = train.classes
        return train, test


class CIFAR100DataModule(_DirDataModule):
    """CIFAR-100 from the python files in ``data_dir`` (``cifar-100-python/train``, ``test``, ``meta``).

    The same transforms as CIFAR-10 (pad-4 crop + flip, ``(3, 32, 32)`` samples), with the
    CIFAR-100 mean/std; ``label_type`` chooses the 100 fine classes or the 20 superclasses.

    Args:
        data_dir: directory holding ``cifar-100-python/`` (or its files); nothing is downloaded.
        batch_size: samples per batch, for every split.
        num_workers: DataLoader worker processes (0 loads in the main process).
        max_train_samples: if set, train on a seeded subset of this many samples of what is left
            after the validation hold-out (all of it when fewer remain).
        val_size: validation hold-out taken from the training split: a count (int >= 1) or a
            fraction (float in (0, 1)).
        seed: seed of the hold-out, the subset and the training shuffle order.
        pin_memory: passed to the DataLoaders (useful with a GPU).
        label_type: ``"fine"`` (100 classes) or ``"coarse"`` (20 superclasses).

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Examples:
        >>> dm = CIFAR100DataModule("./data", label_type="coarse")
        >>> dm.num_classes, dm.input_shape, dm.classes[0]
        (20, (3, 32, 32), 'aquatic_mammals')
    """

    name = "cifar100"
    synthetic = False
    mean = CIFAR100_MEAN
    std = CIFAR100_STD

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = "./data",
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        val_size: int | float = DEFAULT_VAL_SIZE,
        seed: int = 0,
        pin_memory: bool = False,
        label_type: str = "fine",
    ) -> None:
        super().__init__(data_dir, batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        self.classes = cifar100_classes(label_type)  # validates label_type
        self.num_classes = len(self.classes)
        self.label_type = label_type

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        train = CIFAR100(self.data_dir, "train", self.label_type)
        test = CIFAR100(self.data_dir, "test", self.label_type)
        self.classes = train.classes  # the meta file's names, when there is one
        return train, test

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "label_type": self.label_type}


class MNISTDataModule(_DirDataModule):
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
        batch_size: samples per batch; the remaining arguments (num_workers,
            max_train_samples, val_size, seed, pin_memory) are :class:`ImageDataModule`'s.

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Examples:
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

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        return MNIST(self.data_dir, "train"), MNIST(self.data_dir, "test")


class FashionMNISTDataModule(_DirDataModule):
    """Fashion-MNIST from its four IDX files in ``data_dir``, padded to 1x32x32 as MNIST is.

    The same shape and shifts as :class:`MNISTDataModule` (a 2-pixel zero border in every split,
    random shifts of up to 2 pixels in training), for the same reason (one ``(1, 32, 32)`` input
    for every network). Unlike digits, clothes keep their class when mirrored, so training also
    flips left-right. Normalisation uses the Fashion-MNIST mean/std
    (:data:`~nestflex.data.fashion_mnist.FASHION_MNIST_MEAN`).

    Args:
        data_dir: directory holding the IDX files (or their ``raw/`` or ``FashionMNIST/raw/``);
            nothing is ever downloaded.
        batch_size: samples per batch; the remaining arguments (num_workers,
            max_train_samples, val_size, seed, pin_memory) are :class:`ImageDataModule`'s.

    Raises:
        DataError: bad arguments here; missing or corrupt files in :meth:`setup`.

    Examples:
        >>> dm = FashionMNISTDataModule("./data/fashion")
        >>> dm.input_shape, dm.num_classes, dm.classes[0]
        ((1, 32, 32), 10, 'T-shirt/top')
    """

    name = "fashion_mnist"
    synthetic = False
    classes = FASHION_MNIST_CLASSES
    mean = FASHION_MNIST_MEAN
    std = FASHION_MNIST_STD
    input_shape = (1, 32, 32)
    border = 2
    crop_padding = 2
    flip = True

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        return FashionMNIST(self.data_dir, "train"), FashionMNIST(self.data_dir, "test")


class SVHNDataModule(_DirDataModule):
    """SVHN cropped digits from ``train_32x32.mat`` and ``test_32x32.mat`` in ``data_dir``.

    Samples are ``(3, 32, 32)``. Training shifts by up to 2 pixels (a crop from a 2-pixel zero
    padding: the digit to classify is the centred one, and a larger shift would bring a
    neighbouring digit to the centre) and never flips (a mirrored digit is another glyph).
    Normalisation uses the SVHN mean/std (:data:`~nestflex.data.svhn.SVHN_MEAN`). The ``extra``
    file is not used.

    Args:
        data_dir: directory holding the ``.mat`` files (or its ``svhn/`` or ``SVHN/``); nothing
            is downloaded.
        batch_size: samples per batch; the remaining arguments (num_workers,
            max_train_samples, val_size, seed, pin_memory) are :class:`ImageDataModule`'s.

    Raises:
        DataError: bad arguments here; missing or invalid files in :meth:`setup`.

    Examples:
        >>> dm = SVHNDataModule("./data/svhn")
        >>> dm.input_shape, dm.num_classes, dm.flip
        ((3, 32, 32), 10, False)
    """

    name = "svhn"
    synthetic = False
    classes = SVHN_CLASSES
    mean = SVHN_MEAN
    std = SVHN_STD
    crop_padding = 2
    flip = False

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        return SVHN(self.data_dir, "train"), SVHN(self.data_dir, "test")


class ImageFolderDataModule(_DirDataModule):
    """Your own images, ``data_dir/<class>/<image>`` (or with ``train/`` and ``test/``), any size.

    The folder is read by :mod:`nestflex.data.imagefolder` (its docstring gives the layout, the
    seeded split and the decoding rules). :attr:`input_shape` is ``(C, H, W)`` of the images
    as read: ``channels`` (or the first image's), ``image_size`` (or the first image's size), with
    no padding or forced 32x32; it, :attr:`classes` and :attr:`num_classes` are known before
    :meth:`setup` from the folder listing and the first image's header (read on first access).
    :meth:`setup` decodes every image into memory.

    ``mean``/``std``: given, or ``None`` to compute them per channel over the training split's
    images (:func:`~nestflex.data.compute_mean_std`, hold-out included: it is part of the files
    the model is trained from, and no label is involved) in :meth:`setup`; they are ``None``
    before it.

    Args:
        data_dir: the image folder.
        batch_size: samples per batch, for every split.
        num_workers: DataLoader worker processes (0 loads in the main process).
        max_train_samples: if set, train on a seeded subset of this many samples of what is left
            after the validation hold-out (all of it when fewer remain).
        val_size: hold-out of the training split, a count or a fraction; 10% by default, since a
            folder of your own may hold far fewer than 5,000 images.
        seed: seed of the hold-out, the subset and the training shuffle order.
        pin_memory: passed to the DataLoaders (useful with a GPU).
        channels: 1 (greyscale), 3 (RGB) or ``None`` (from the first image).
        image_size: ``(H, W)`` (or an int for a square) to resize every image to, or ``None``.
        test_fraction: fraction of the images held out as the test split, for a folder without
            ``train/``/``test/`` (ignored otherwise).
        split_seed: seed of that test split (its own seed, so changing ``seed`` keeps the test
            split).
        mean: per-channel normalisation mean in [0, 1] units, or ``None`` (computed, see above;
            give ``std`` too).
        std: per-channel standard deviation in [0, 1] units, all > 0, or ``None`` (computed).
        flip: flip training images left-right (turn it off for text, digits, or anything whose
            mirror image is another class).
        crop_padding: zero padding of the training crop (random shifts of up to this many pixels).

    Raises:
        DataError: bad arguments here; a missing or malformed folder or image when the folder is
            first looked at (``input_shape``, ``classes``, :meth:`setup`).

    Examples:
        >>> dm = ImageFolderDataModule("photos", image_size=(64, 48), flip=False)  # doctest: +SKIP
        >>> dm.input_shape, dm.classes  # doctest: +SKIP
        ((3, 64, 48), ('cats', 'dogs'))
    """

    name = "imagefolder"
    synthetic = False

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = "./data",
        batch_size: int = 128,
        num_workers: int = 0,
        max_train_samples: int | None = None,
        val_size: int | float = 0.1,
        seed: int = 0,
        pin_memory: bool = False,
        *,
        channels: int | None = None,
        image_size: int | Sequence[int] | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        flip: bool = True,
        crop_padding: int = 4,
    ) -> None:
        super().__init__(data_dir, batch_size, num_workers, max_train_samples, val_size, seed, pin_memory)
        _check_channels(channels)
        self.image_size = _check_image_size(image_size)
        _check_fraction(test_fraction)
        _check_seed(split_seed)
        _check_int("crop_padding", crop_padding, 0)
        if not isinstance(flip, bool):
            raise DataError(f"`flip` must be True or False, got {flip!r}")
        if (mean is None) != (std is None):
            raise DataError(
                f"`mean` and `std` must be given together or both left None (computed), got mean={mean!r}, "
                f"std={std!r}"
            )
        if mean is not None:
            if channels is not None and (len(mean) != channels or len(std) != channels):
                raise DataError(
                    f"`mean` and `std` need one value per channel ({channels}), got mean={tuple(mean)!r}, "
                    f"std={tuple(std)!r}"
                )
            if any(s <= 0 for s in std):
                raise DataError(f"`std` must be > 0 for every channel, got {tuple(std)!r}")
        self.channels = channels
        self.test_fraction = float(test_fraction)
        self.split_seed = split_seed
        self.mean = None if mean is None else tuple(float(m) for m in mean)
        self.std = None if std is None else tuple(float(s) for s in std)
        self.flip = flip
        self.crop_padding = crop_padding

    @cached_property
    def index(self) -> ImageFolderIndex:
        """Classes and files of the folder, split (listed on first access, nothing decoded)."""
        return index_image_folder(self.data_dir, self.test_fraction, self.split_seed)

    @cached_property
    def input_shape(self) -> tuple[int, int, int]:  # type: ignore[override]
        """``(C, H, W)`` of every sample (the first image's header decides what is not given)."""
        return image_folder_shape(self.index, self.channels, self.image_size)

    @property
    def classes(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.index.classes

    @property
    def num_classes(self) -> int:  # type: ignore[override]
        return len(self.index.classes)

    def _load_splits(self) -> tuple[ImageTensorDataset, ImageTensorDataset]:
        c, h, w = self.input_shape
        # the resolved shape, so both splits are read alike whatever the first image of each is
        train = ImageFolder(self.index, "train", c, (h, w) if self.image_size else None)
        test = ImageFolder(self.index, "test", c, (h, w) if self.image_size else None)
        if self.mean is None:
            self.mean, self.std = compute_mean_std(train.images)
            # a channel of one value everywhere (a blank dataset) would divide by zero
            self.std = tuple(s if s > 0 else 1.0 for s in self.std)
        elif len(self.mean) != c:
            raise DataError(
                f"`mean` and `std` have {len(self.mean)} value(s), but the images of {self.data_dir} are "
                f"read with {c} channel(s). HINT: give one value per channel, or pass `channels`"
            )
        return train, test

    def describe(self) -> dict[str, object]:
        out = {
            **super().describe(),
            "channels": self.channels,
            "image_size": list(self.image_size) if self.image_size else None,
            "split_folders": self.index.split_folders,
            "classes": list(self.classes),
        }
        if not self.index.split_folders:
            out.update(test_fraction=self.test_fraction, split_seed=self.split_seed)
        if self.mean is not None:
            out.update(mean=list(self.mean), std=list(self.std))
        return out


class SyntheticDataModule(ImageDataModule):
    """The synthetic shapes dataset (:mod:`nestflex.data.synthetic`), rendered in :meth:`setup`.

    Args:
        batch_size: samples per batch, for every split.
        num_workers: DataLoader worker processes (0 loads in the main process).
        max_train_samples: if set, train on a seeded subset of this many samples of what is left
            after the validation hold-out (all of it when fewer remain).
        train_size: samples rendered for the training split (the hold-out comes out of them;
            ``>= 2``).
        test_size: samples rendered for the test split (``>= 1``).
        val_size: validation hold-out taken from the training split: a count (int >= 1) or a
            fraction (float in (0, 1)).
        seed: seed of the hold-out, the subset and the training shuffle order; also seeds the
            rendering of the dataset itself.
        pin_memory: passed to the DataLoaders (useful with a GPU).

    Examples:
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
