"""Fixtures: small CIFAR-10 directories in the official python-batch layout, written to tmp_path."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from nestflex.data.cifar import CIFAR10_CLASSES, CIFAR10_DIRNAME, CIFAR10_TEST_FILE, CIFAR10_TRAIN_FILES

N_PER_BATCH = 24


def write_batch(path: Path, data: object, labels: object, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    """Write one batch the way the official files are laid out (plus batch_label/filenames)."""
    n = len(labels) if hasattr(labels, "__len__") else 0
    obj = {
        "batch_label": f"fake batch {path.name}",
        "labels": labels,
        "data": data,
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


def make_fake_cifar(
    root: Path, n: int = N_PER_BATCH, seed: int = 0, subdir: bool = True, meta: bool = True
) -> dict:
    """Write data_batch_1..5, test_batch (and batches.meta) with random images; return what was written."""
    rng = np.random.default_rng(seed)
    directory = root / CIFAR10_DIRNAME if subdir else root
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in CIFAR10_TRAIN_FILES + (CIFAR10_TEST_FILE,):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        write_batch(directory / name, data, labels)
        written[name] = (data, labels)
    if meta:
        (directory / "batches.meta").write_bytes(
            pickle.dumps({"label_names": list(CIFAR10_CLASSES), "num_cases_per_batch": n, "num_vis": 3072})
        )
    return {"dir": directory, "batches": written}


@pytest.fixture
def fake_cifar(tmp_path: Path) -> dict:
    """A complete small CIFAR-10 under ``tmp_path/cifar-10-batches-py``; ``root`` is ``tmp_path``."""
    out = make_fake_cifar(tmp_path)
    out["root"] = tmp_path
    return out


@pytest.fixture
def write_cifar_batch():
    """The batch writer, for tests that need a malformed file."""
    return write_batch


@pytest.fixture
def cifar_factory():
    """``make_fake_cifar(root, n=..., seed=..., subdir=..., meta=...)``."""
    return make_fake_cifar
