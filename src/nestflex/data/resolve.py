"""Choose the dataset for a recipe: ``resolve_data("auto" | "cifar10" | "mnist" | "synthetic", data_dir)``.

Recipes must run offline out of the box, and must never pass off synthetic numbers as CIFAR-10
ones. So ``auto`` takes CIFAR-10 when its files are in ``data_dir`` (downloading it only when
``download=True``), else the synthetic dataset, and the resolver returns one line saying which
and why, for the recipe to print and to copy into its ``summary.json``. MNIST is used only when
asked for (``"mnist"``): its 1x32x32 samples change the network's input, which ``auto`` must not
do behind the user's back; and it is never downloaded.

Example:
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
from nestflex.data.datamodule import CIFAR10DataModule, ImageDataModule, MNISTDataModule, SyntheticDataModule
from nestflex.data.mnist import require_mnist_dir
from nestflex.errors import DataError

__all__ = ["DATA_KINDS", "resolve_data"]

#: Values accepted by :func:`resolve_data` (and by the recipes' ``--data`` option).
DATA_KINDS: tuple[str, ...] = ("auto", "cifar10", "mnist", "synthetic")

_COMMON_KWARGS = frozenset(
    {"batch_size", "num_workers", "max_train_samples", "val_size", "seed", "pin_memory"}
)
_SYNTHETIC_ONLY_KWARGS = frozenset({"train_size", "test_size"})


def resolve_data(
    kind: str = "auto",
    data_dir: str | os.PathLike[str] = "./data",
    download: bool = False,
    **dm_kwargs: Any,
) -> tuple[ImageDataModule, str]:
    """Build the DataModule a recipe asked for, and a one-line message saying which and why.

    Args:
        kind: ``"auto"`` (CIFAR-10 if present, else synthetic), ``"cifar10"`` (required),
            ``"mnist"`` (required) or ``"synthetic"``.
        data_dir: where CIFAR-10 is looked for (``data_dir/cifar-10-batches-py`` or ``data_dir``),
            or MNIST's four IDX files (``data_dir``, ``data_dir/raw`` or ``data_dir/MNIST/raw``).
        download: fetch CIFAR-10 into ``data_dir`` if it is missing (for ``auto`` and ``cifar10``);
            an error with ``"mnist"``, which is never downloaded.
        **dm_kwargs: DataModule arguments: ``batch_size``, ``num_workers``,
            ``max_train_samples``, ``val_size``, ``seed``, ``pin_memory``; and, used only when the
            synthetic dataset is chosen, ``train_size`` and ``test_size``.

    Returns:
        ``(datamodule, message)``; ``message`` starts with ``"data: "``.

    Raises:
        DataError: unknown ``kind`` or keyword; ``kind="cifar10"`` with the files missing and
            ``download=False``; a failed download; ``kind="mnist"`` with the files missing or
            ``download=True``.
    """
    if kind not in DATA_KINDS:
        raise DataError(f"`kind` must be one of {list(DATA_KINDS)}, got {kind!r}")
    unknown = set(dm_kwargs) - _COMMON_KWARGS - _SYNTHETIC_ONLY_KWARGS
    if unknown:
        raise DataError(
            f"unknown DataModule argument(s) {sorted(unknown)}; accepted: "
            f"{sorted(_COMMON_KWARGS | _SYNTHETIC_ONLY_KWARGS)}"
        )
    data_dir = os.fspath(data_dir)
    seed = dm_kwargs.get("seed", 0)

    if kind == "synthetic":
        return SyntheticDataModule(**dm_kwargs), (
            f"data: using the synthetic dataset (seed {seed}), as requested — figures on it are synthetic"
        )

    real_kwargs = {k: v for k, v in dm_kwargs.items() if k in _COMMON_KWARGS}
    if kind == "mnist":
        if download:
            raise DataError(
                f"`download=True` with kind 'mnist': nestflex never downloads MNIST. HINT: put the four standard "
                f"IDX files in {data_dir} (or its raw/) and drop `download` (recipes: `--download`)"
            )
        where = require_mnist_dir(data_dir)  # raises the DataError naming the path and the expected files
        return MNISTDataModule(data_dir, **real_kwargs), (
            f"data: MNIST found in {where} (28x28 digits padded to 1x32x32)"
        )
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
