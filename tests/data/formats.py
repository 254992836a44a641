"""Tiny datasets in each standard on-disk format, written for tests (no real data needed).

* CIFAR-100: ``cifar-100-python/{train,test,meta}`` pickles with the official keys
  (``data``, ``fine_labels``, ``coarse_labels``, ``filenames``, ``batch_label``; ``meta`` with
  ``fine_label_names`` / ``coarse_label_names``), bytes keys as ``pickle.load(f, encoding="bytes")``
  shows them, at protocol 2 (what Python 3 writes for Python 2 readers) or the highest.
* SVHN: ``train_32x32.mat`` / ``test_32x32.mat`` through :func:`scipy.io.savemat` (MATLAB v5),
  ``X`` ``32 x 32 x 3 x N`` uint8 and ``y`` ``N x 1`` labels in 1..10 (10 = digit 0).
* Image folders: PNG / JPEG / ... files written with Pillow.

Fashion-MNIST uses MNIST's writer (:mod:`tests.data.mnist_files`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from nestflex.data.cifar100 import CIFAR100_COARSE_CLASSES, CIFAR100_DIRNAME, CIFAR100_FINE_CLASSES


def cifar100_batch(n: int, seed: int, n_fine: int = 100, n_coarse: int = 20) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        b"batch_label": b"fake batch",
        b"fine_labels": [int(v) for v in rng.integers(0, n_fine, size=n)],
        b"coarse_labels": [int(v) for v in rng.integers(0, n_coarse, size=n)],
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
    }


def write_pickle(path: Path, obj: object, protocol: int = pickle.HIGHEST_PROTOCOL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def make_fake_cifar100(root: Path, n_train: int = 30, n_test: int = 12, seed: int = 0, subdir: bool = True,
                       meta: bool = True, protocol: int = pickle.HIGHEST_PROTOCOL) -> dict:
    """Write ``train``, ``test`` (and ``meta``) under ``root/cifar-100-python``; return what was written."""
    directory = root / CIFAR100_DIRNAME if subdir else root
    written = {}
    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        written[split] = cifar100_batch(n, s)
        write_pickle(directory / split, written[split], protocol)
    if meta:
        write_pickle(directory / "meta", {b"fine_label_names": [c.encode() for c in CIFAR100_FINE_CLASSES],
                                          b"coarse_label_names": [c.encode() for c in CIFAR100_COARSE_CLASSES]},
                     protocol)
    return {"root": root, "dir": directory, **written}


def svhn_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X (32, 32, 3, n) uint8, y (n, 1) uint8 in 1..10)``, every label present when n >= 10."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(n, 1)
    return x, y


def write_mat(path: Path, **variables: object) -> Path:
    from scipy.io import savemat

    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, variables)
    return path


def make_fake_svhn(root: Path, n_train: int = 30, n_test: int = 12, seed: int = 0, subdir: str = "") -> dict:
    """Write ``train_32x32.mat`` and ``test_32x32.mat`` under ``root/subdir``; return what was written."""
    directory = root / subdir if subdir else root
    written = {}
    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        x, y = svhn_arrays(n, s)
        written[split] = (x, y, write_mat(directory / f"{split}_32x32.mat", X=x, y=y))
    return {"root": root, "dir": directory, **written}


def write_image(path: Path, pixels: np.ndarray, fmt: str | None = None, mode: str | None = None) -> Path:
    """Save ``pixels`` ((H, W) greyscale or (H, W, C)) with Pillow; ``fmt`` overrides the extension's format."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels, mode) if mode else Image.fromarray(pixels)
    image.save(path, format=fmt)
    return path


def make_image_folder(root: Path, classes: dict[str, int], shape: tuple[int, ...] = (40, 24, 3), seed: int = 0,
                      ext: str = ".png") -> dict[str, list[tuple[Path, np.ndarray]]]:
    """``root/<class>/img_<i><ext>`` with random pixels of ``shape`` ((H, W) or (H, W, C)); returns them."""
    rng = np.random.default_rng(seed)
    written: dict[str, list[tuple[Path, np.ndarray]]] = {}
    for name, count in classes.items():
        written[name] = []
        for i in range(count):
            pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
            written[name].append((write_image(root / name / f"img_{i:02d}{ext}", pixels), pixels))
    return written
