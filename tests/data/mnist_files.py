"""Small MNIST directories in the standard IDX format, written for tests (no real data needed).

The images are learnable stand-ins for digits: class ``c`` is a bright 8x8 block at one of ten
positions on a faint noisy background, so a one-epoch run learns something and pruning has an
accuracy to keep.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from nestflex.data.mnist import MNIST_FILES


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """The IDX encoding of a uint8 array: magic (0, 0, type, ndim), big-endian dims, data."""
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False, type_code: int = 0x08) -> Path:
    data = idx_bytes(array, type_code)
    path = path.with_name(path.name + ".gz") if gz else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def fake_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(images (n, 28, 28) uint8, labels (n,) uint8)``, balanced classes, seeded."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(labels)
    images = rng.integers(0, 40, size=(n, 28, 28), dtype=np.uint8)
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 5)
        top, left = 4 + 12 * r + rng.integers(-1, 2), 1 + 5 * q + rng.integers(-1, 2)
        images[i, top: top + 8, max(0, left): left + 6] = 255
    return images, labels


def make_fake_mnist(root: Path, n_train: int = 120, n_test: int = 40, seed: int = 0, gz: bool = True,
                    subdir: str = "raw") -> dict:
    """Write the four MNIST files under ``root/subdir``; return what was written."""
    directory = root / subdir if subdir else root
    written = {}
    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        images, labels = fake_digits(n, s)
        image_name, label_name = MNIST_FILES[split]
        written[split] = (images, labels, write_idx(directory / image_name, images, gz),
                          write_idx(directory / label_name, labels, gz))
    return {"root": root, "dir": directory, **written}
