"""Choose the dataset for a recipe: ``resolve_data(kind, data_dir)``, ``kind`` one of :data:`DATA_KINDS`.

Recipes must run offline out of the box, and must never pass off synthetic numbers as CIFAR-10
ones. So ``auto`` takes CIFAR-10 when its files are in ``data_dir`` (downloading it only when
``download=True``), else the synthetic dataset, and the resolver returns one line saying which
and why, for the recipe to print and to copy into its ``summary.json``. MNIST is used only when
asked for (``"mnist"``): its 1x32x32 samples change the network's input, which ``auto`` must not
do behind the user's back; and it is never downloaded. The same holds for the other real datasets,
each used only when asked for and never downloaded: ``"cifar100"`` (the python pickles,
``label_type="fine"|"coarse"``), ``"fashion_mnist"`` (IDX files, 1x32x32 like MNIST), ``"svhn"``
(the ``*_32x32.mat`` files) and ``"imagefolder"`` (``data_dir/<class>/<image>``, any channel
count and size).

Examples:
    >>> from nestflex.data import resolve_data
    >>> dm, message = resolve_data("auto", "/nonexistent", train_size=200, test_size=50, val_size=20)
    >>> dm.synthetic
    True
    >>> print(message)  # doctest: +NORMALIZE_WHITESPACE
    data: CIFAR-10 not found in /nonexistent (expected cifar-10-batches-py/data_batch_1..5,
    test_batch); using the synthetic dataset (seed 0) — figures on it are synthetic
"""

from __future__ import annotations

import os
from typing import Any

from nestflex.data.cifar import (
    _EXPECTED,
    cifar10_available,
    download_cifar10,
    find_cifar10_dir,
    require_cifar10_dir,
)
from nestflex.data.cifar100 import require_cifar100_dir
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
from nestflex.data.fashion_mnist import require_fashion_mnist_dir
from nestflex.data.mnist import require_mnist_dir
from nestflex.data.svhn import require_svhn_dir
from nestflex.errors import DataError

__all__ = ["DATA_KINDS", "resolve_data"]

#: Values accepted by :func:`resolve_data` (and by the recipes' ``--data`` option).
DATA_KINDS: tuple[str, ...] = (
    "auto", "cifar10", "mnist", "synthetic", "cifar100", "fashion_mnist", "svhn", "imagefolder",
)  # fmt: skip

_COMMON_KWARGS = frozenset(
    {"batch_size", "num_workers", "max_train_samples", "val_size", "seed", "pin_memory"}
)
_SYNTHETIC_ONLY_KWARGS = frozenset({"train_size", "test_size"})
#: Arguments that only one kind takes; given with another kind they are an error, not ignored.
_KIND_KWARGS: dict[str, frozenset[str]] = {
    "cifar100": frozenset({"label_type"}),
    "imagefolder": frozenset({"channels", "image_size", "test_fraction", "split_seed", "flip"}),
}
_NAMES = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "cifar100": "CIFAR-100", "svhn": "SVHN",
          "imagefolder": "an image folder"}
_FILES = {"mnist": "the four standard IDX files", "fashion_mnist": "the four standard IDX files",
          "cifar100": "the extracted cifar-100-python/ folder", "svhn": "train_32x32.mat and test_32x32.mat",
          "imagefolder": "your images, one subfolder per class,"}


def resolve_data(
    kind: str = "auto",
    data_dir: str | os.PathLike[str] = "./data",
    download: bool = False,
    **dm_kwargs: Any,
) -> tuple[ImageDataModule, str]:
    """Build the DataModule a recipe asked for, and a one-line message saying which and why.

    Args:
        kind: ``"auto"`` (CIFAR-10 if present, else synthetic), ``"synthetic"``, or a real
            dataset that must be there: ``"cifar10"``, ``"cifar100"``, ``"mnist"``,
            ``"fashion_mnist"``, ``"svhn"``, ``"imagefolder"``.
        data_dir: where the dataset is looked for: CIFAR-10 in ``data_dir/cifar-10-batches-py``
            or ``data_dir``; CIFAR-100 in ``data_dir/cifar-100-python`` or ``data_dir``; MNIST's
            four IDX files in ``data_dir``, ``data_dir/raw`` or ``data_dir/MNIST/raw``
            (Fashion-MNIST: ``.../FashionMNIST/raw``); SVHN's ``.mat`` files in ``data_dir``,
            ``data_dir/svhn`` or ``data_dir/SVHN``; an image folder is ``data_dir`` itself.
        download: fetch CIFAR-10 into ``data_dir`` if it is missing (for ``auto`` and ``cifar10``);
            an error with every other real kind, which nestflex never downloads.
        **dm_kwargs: DataModule arguments: ``batch_size``, ``num_workers``,
            ``max_train_samples``, ``val_size``, ``seed``, ``pin_memory``; used only when the
            synthetic dataset is chosen, ``train_size`` and ``test_size``; for ``"cifar100"`` only,
            ``label_type``; for ``"imagefolder"`` only, ``channels``, ``image_size``,
            ``test_fraction``, ``split_seed`` and ``flip`` (see :class:`ImageFolderDataModule`).

    Returns:
        ``(datamodule, message)``; ``message`` starts with ``"data: "``.

    Raises:
        DataError: unknown ``kind`` or keyword; a keyword of another kind (``label_type`` with
            ``"svhn"``); ``kind="cifar10"`` with the files missing and ``download=False``; a failed
            download; another real kind with its files missing (the message names the expected
            files) or ``download=True``.
    """
    if kind not in DATA_KINDS:
        raise DataError(f"`kind` must be one of {list(DATA_KINDS)}, got {kind!r}")
    specific = frozenset().union(*_KIND_KWARGS.values())
    accepted = _COMMON_KWARGS | _SYNTHETIC_ONLY_KWARGS | specific
    unknown = set(dm_kwargs) - accepted
    if unknown:
        raise DataError(f"unknown DataModule argument(s) {sorted(unknown)}; accepted: {sorted(accepted)}")
    misplaced = sorted((set(dm_kwargs) & specific) - _KIND_KWARGS.get(kind, frozenset()))
    if misplaced:
        owners = sorted(k for k, names in _KIND_KWARGS.items() if names & set(misplaced))
        raise DataError(
            f"DataModule argument(s) {misplaced} apply to kind {' / '.join(map(repr, owners))} only, got "
            f"kind {kind!r}. HINT: drop them, or choose that kind"
        )
    data_dir = os.fspath(data_dir)
    seed = dm_kwargs.get("seed", 0)

    if kind == "synthetic":
        return SyntheticDataModule(**dm_kwargs), (
            f"data: using the synthetic dataset (seed {seed}), as requested — figures on it are synthetic"
        )

    real_kwargs = {k: v for k, v in dm_kwargs.items() if k in _COMMON_KWARGS | _KIND_KWARGS.get(kind, set())}
    if kind in _NAMES and download:
        raise DataError(
            f"`download=True` with kind {kind!r}: nestflex never downloads {_NAMES[kind]}. HINT: put "
            f"{_FILES[kind]} in {data_dir} and drop `download` (recipes: `--download`)"
        )
    # Each require_* raises the DataError naming the path and the expected files.
    if kind == "mnist":
        where = require_mnist_dir(data_dir)
        return MNISTDataModule(data_dir, **real_kwargs), (
            f"data: MNIST found in {where} (28x28 digits padded to 1x32x32)"
        )
    if kind == "fashion_mnist":
        where = require_fashion_mnist_dir(data_dir)
        return FashionMNISTDataModule(data_dir, **real_kwargs), (
            f"data: Fashion-MNIST found in {where} (28x28 images padded to 1x32x32)"
        )
    if kind == "cifar100":
        where = require_cifar100_dir(data_dir)
        dm = CIFAR100DataModule(data_dir, **real_kwargs)
        return dm, f"data: CIFAR-100 found in {where} ({dm.label_type} labels, {dm.num_classes} classes)"
    if kind == "svhn":
        where = require_svhn_dir(data_dir)
        return SVHNDataModule(data_dir, **real_kwargs), f"data: SVHN found in {where}"
    if kind == "imagefolder":
        dm = ImageFolderDataModule(data_dir, **real_kwargs)
        c, h, w = dm.input_shape  # lists the folder and reads the first image's header: fails here if missing
        return dm, f"data: image folder {data_dir}: {dm.index.describe()}, samples {c}x{h}x{w}"
    cifar_kwargs = real_kwargs
    if cifar10_available(data_dir):
        where = find_cifar10_dir(data_dir)
        return CIFAR10DataModule(data_dir, **cifar_kwargs), f"data: CIFAR-10 found in {where}"
    if download:
        where = download_cifar10(data_dir)
        return CIFAR10DataModule(data_dir, **cifar_kwargs), f"data: CIFAR-10 downloaded to {where}"
    if kind == "cifar10":
        require_cifar10_dir(data_dir)  # raises the DataError naming the path and the expected files
        raise AssertionError("unreachable: CIFAR-10 reported both missing and present")
    return SyntheticDataModule(**dm_kwargs), (
        f"data: CIFAR-10 not found in {data_dir} (expected {_EXPECTED}); "
        f"using the synthetic dataset (seed {seed}) — figures on it are synthetic"
    )
