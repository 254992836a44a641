"""Labelled test frames of a recipe run, for the live benchmarks (multitenant_live, split_live)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nestflex._io import read_json


def test_frames(run: Path, n: int, mnist_dir: str | None, data_dir: str, seed: int) -> tuple[list, dict[str, Any]]:
    """The run's test split, rebuilt from its summary.json, as ``n`` normalised (image, label) pairs."""
    from nestflex.data import resolve_data

    data = read_json(run / "summary.json")["data"]
    kind = data["name"] if data["name"] in ("synthetic", "mnist", "cifar10") else "auto"
    kwargs: dict[str, Any] = {"seed": data.get("seed", 0), "batch_size": 256}
    if kind == "synthetic":
        kwargs.update(train_size=data.get("train_size", 50_000), test_size=data.get("test_size", 10_000))
        kwargs["val_size"] = min(5000, kwargs["train_size"] // 10)  # the test split does not depend on it
    where = mnist_dir if kind == "mnist" else data_dir
    if kind == "mnist" and where is None:
        raise SystemExit(f"error: run {str(run)!r} was trained on MNIST; pass --mnist-dir")
    dm, _ = resolve_data(kind, where, **kwargs)
    dm.setup("test")
    frames = []
    for x, y in dm.test_dataloader():
        frames += list(zip(x, y.tolist()))
        if len(frames) >= n:
            break
    order = np.random.default_rng(seed).permutation(len(frames))[:n]
    return [frames[i] for i in order], {"data": data["name"], "synthetic": bool(data.get("synthetic"))}
