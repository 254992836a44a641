"""Real CIFAR-100 from the standard python layout, read without trusting the pickles.

The official archive (``cifar-100-python.tar.gz``) holds ``cifar-100-python/`` with three pickles:
``train`` (50,000 images), ``test`` (10,000) and ``meta`` (class names). Each data file is a dict
with ``data`` (``N x 3072`` uint8, rows of 1024 red, 1024 green and 1024 blue values, as CIFAR-10),
``fine_labels`` (100 classes) and ``coarse_labels`` (the 20 superclasses); ``meta`` holds
``fine_label_names`` and ``coarse_label_names``. They are read through CIFAR-10's restricted
unpickler (:mod:`nestflex.data.cifar`: only the numpy globals that rebuild arrays are resolved)
and the same checks, with ``label_type`` choosing the labels: ``"fine"`` or ``"coarse"``.

Nothing is downloaded: extract the archive into ``data_dir`` yourself.

Examples:
    >>> from nestflex.data.cifar100 import cifar100_available
    >>> cifar100_available("/nonexistent")
    False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from nestflex.data._dataset import ImageTensorDataset
from nestflex.data._locate import find_dir, require_dir
from nestflex.data.cifar import _read_names, _read_rows, _rows_to_images
from nestflex.errors import DataError

__all__ = [
    "CIFAR100",
    "CIFAR100_FINE_CLASSES",
    "CIFAR100_COARSE_CLASSES",
    "CIFAR100_LABEL_TYPES",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "CIFAR100_DIRNAME",
    "cifar100_available",
    "find_cifar100_dir",
    "require_cifar100_dir",
    "load_cifar100",
    "cifar100_classes",
]

CIFAR100_DIRNAME = "cifar-100-python"
CIFAR100_LABEL_TYPES: tuple[str, ...] = ("fine", "coarse")
#: The 100 fine classes, index = fine label (the order of ``meta``'s ``fine_label_names``).
CIFAR100_FINE_CLASSES: tuple[str, ...] = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle",
    "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear",
    "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon",
    "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail",
    "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip
#: The 20 superclasses, index = coarse label (``meta``'s ``coarse_label_names``).
CIFAR100_COARSE_CLASSES: tuple[str, ...] = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "large_omnivores_and_herbivores",
    "medium_mammals", "non-insect_invertebrates", "people", "reptiles", "small_mammals", "trees",
    "vehicles_1", "vehicles_2",
)  # fmt: skip
#: Per-channel mean/std of the 50,000 training images, in [0, 1] units: the published values,
#: as CIFAR-10's constants (std over all pixels, not the mean of per-image stds). Not recomputed
#: here; ``compute_mean_std(CIFAR100(dir).images)`` recomputes them.
CIFAR100_MEAN: tuple[float, float, float] = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: tuple[float, float, float] = (0.2673, 0.2564, 0.2762)

_WHAT = "CIFAR-100"
_SPLITS = ("train", "test")
_META_FILE = "meta"
_STANDARD = {"fine": CIFAR100_FINE_CLASSES, "coarse": CIFAR100_COARSE_CLASSES}
_EXPECTED = f"{CIFAR100_DIRNAME}/train, test (meta optional)"
_HINT = (
    f"HINT: extract cifar-100-python.tar.gz there (it holds `{CIFAR100_DIRNAME}/`); nestflex never "
    "downloads CIFAR-100"
)


def _check_label_type(label_type: str) -> None:
    if label_type not in CIFAR100_LABEL_TYPES:
        raise DataError(
            f"`label_type` must be one of {list(CIFAR100_LABEL_TYPES)}, got {label_type!r}. "
            "HINT: 'fine' gives the 100 classes, 'coarse' the 20 superclasses"
        )


def cifar100_classes(label_type: str = "fine") -> tuple[str, ...]:
    """The standard class names of ``label_type`` (``"fine"``: 100, ``"coarse"``: 20).

    Args:
        label_type: ``"fine"`` (the 100 classes) or ``"coarse"`` (the 20 superclasses).

    Raises:
        DataError: ``label_type`` is neither.

    Examples:
        >>> len(cifar100_classes("coarse")), cifar100_classes()[:2]
        (20, ('apple', 'aquarium_fish'))
    """
    _check_label_type(label_type)
    return _STANDARD[label_type]


def _candidates(data_dir: str | os.PathLike[str]) -> list[Path]:
    root = Path(data_dir)
    return [root / CIFAR100_DIRNAME, root]


def _present(directory: Path) -> set[str]:
    return {f for f in _SPLITS if (directory / f).is_file()}


def find_cifar100_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding CIFAR-100's ``train`` and ``test``: ``data_dir/cifar-100-python`` or
    ``data_dir``; ``None`` when neither holds both. Only presence is checked."""
    return find_dir(_candidates(data_dir), _present, _SPLITS)


def cifar100_available(data_dir: str | os.PathLike[str]) -> bool:
    """Whether CIFAR-100's files are in ``data_dir`` (or its ``cifar-100-python/``).

    Args:
        data_dir: the directory to look in (need not exist).

    Examples:
        >>> cifar100_available("/nonexistent")
        False
    """
    return find_cifar100_dir(data_dir) is not None


def require_cifar100_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Like :func:`find_cifar100_dir`, but raise when CIFAR-100 is missing.

    Raises:
        DataError: naming ``data_dir``, the missing files and how to get them.
    """
    return require_dir(Path(data_dir), _candidates(data_dir), _present, _SPLITS, what=_WHAT,
                       expected=_EXPECTED, hint=_HINT)


def load_cifar100(
    data_dir: str | os.PathLike[str], split: str = "train", label_type: str = "fine"
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Load one CIFAR-100 split as tensors.

    Args:
        data_dir: directory holding ``cifar-100-python/`` (or its ``train`` and ``test`` files).
        split: ``"train"`` (50,000 images) or ``"test"`` (10,000).
        label_type: ``"fine"`` (100 classes, ``fine_labels``) or ``"coarse"`` (20 superclasses,
            ``coarse_labels``).

    Returns:
        ``(images, targets, classes)``: uint8 ``(N, 3, 32, 32)``, int64 ``(N,)``, and the class
        names of ``label_type`` (from ``meta`` when it is there, else the standard ones).

    Raises:
        DataError: unknown split or label type; files missing (the message lists them); a file
            corrupt, not a CIFAR-100 pickle, lacking the ``label_type`` labels, with labels out of
            range, or trying to load anything but numpy arrays.
    """
    if split not in _SPLITS:
        raise DataError(f"`split` must be 'train' or 'test', got {split!r}")
    _check_label_type(label_type)
    directory = require_cifar100_dir(data_dir)
    key = f"{label_type}_labels"
    standard = _STANDARD[label_type]
    data, labels = _read_rows(directory / split, _WHAT, key, len(standard), other="CIFAR-10")
    meta = directory / _META_FILE
    # the meta file only names the classes; without it the standard names serve
    classes = standard
    if meta.exists():
        classes = _read_names(meta, f"{label_type}_label_names", len(standard), _WHAT)
    return _rows_to_images(data), torch.from_numpy(labels), classes


class CIFAR100(ImageTensorDataset):
    """CIFAR-100 as a torch ``Dataset`` of ``(image, label)``, held in memory as uint8 ``(3, 32, 32)``.

    Args:
        data_dir: directory holding ``cifar-100-python/`` (or its files).
        split: ``"train"`` or ``"test"``.
        label_type: ``"fine"`` (100 classes) or ``"coarse"`` (20 superclasses).
        transform: callable applied to each uint8 ``(3, 32, 32)`` image; ``None`` returns
            float32 in [0, 1].

    Raises:
        DataError: see :func:`load_cifar100`.

    Examples:
        >>> ds = CIFAR100("./data", split="test", label_type="coarse")  # doctest: +SKIP
        >>> len(ds), len(ds.classes)  # doctest: +SKIP
        (10000, 20)
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        label_type: str = "fine",
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        images, targets, classes = load_cifar100(data_dir, split, label_type)
        super().__init__(images, targets, classes=classes, transform=transform)
        self.split = split
        self.label_type = label_type
