"""The trained recipe model and its validation split, shared by the profiler benchmarks.

A benchmark given ``--checkpoint`` loads it (``weights_only=True``) and rebuilds the validation
split the recipe held out for it from the ``config.json`` next to it (data, seed, sizes), so
the profilers see the same images the recipe's profile stage saw. Without a checkpoint a small
model is trained by the recipe's own baseline stage, not by a second training loop.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from nestflex._machine import machine  # noqa: F401  (the benchmarks import it from here)
from nestflex._io import read_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = ROOT / "runs" / "vgg_cifar" / "baseline" / "model.ckpt"
#: the small model trained when no checkpoint exists: minutes on 2 cores, not an hour
SMALL = ["--model", "vgg11", "--width", "0.25", "--epochs", "2", "--max-train-samples", "10000",
         "--synthetic-train-size", "15000", "--synthetic-test-size", "2000", "--val-size", "2000"]


def add_model_args(p, samples: int = 1000) -> None:
    """The arguments every single-model profiler benchmark takes: ``--out``, ``--checkpoint``,
    ``--data-dir`` and ``--samples`` (validation samples for accuracy)."""
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="recipe checkpoint (default: runs/vgg_cifar/baseline/model.ckpt, else train a small one)")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--samples", type=int, default=samples, help="validation samples for accuracy")


def load_model(checkpoint: Path | None, out: Path, data_dir: str) -> tuple[torch.nn.Module, dict[str, Any], str]:
    """``(model in eval mode, its baseline config, where it came from)``.

    ``checkpoint=None`` uses the default recipe run if it exists, else trains :data:`SMALL`
    under ``out/recipe_run`` with the recipe's baseline stage.
    """
    from nestflex.training import ImageClassifier

    if checkpoint is None and DEFAULT_CHECKPOINT.is_file():
        checkpoint = DEFAULT_CHECKPOINT
    if checkpoint is None:
        run = out / "recipe_run"
        recipe = _recipe()
        recipe.main([*SMALL, "--data", "synthetic", "--data-dir", data_dir, "--stages", "baseline", "--out", str(run)])
        checkpoint, source = run / "baseline" / "model.ckpt", f"trained here: recipes/vgg_cifar.py {' '.join(SMALL)}"
    else:
        if not checkpoint.is_file():
            raise SystemExit(f"error: no checkpoint at {checkpoint}. HINT: train one with "
                             f"`python recipes/vgg_cifar.py --stages baseline`, or leave out --checkpoint")
        source = str(checkpoint)
    module = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    config_path = checkpoint.parent / "config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    return module.model.eval(), config, source


def recipe_datamodule(config: dict[str, Any], data_dir: str, batch_size: int = 128):
    """The recipe's DataModule for this model's config, set up: ``(dm, message, synthetic)``."""
    from nestflex.data import resolve_data

    data = config.get("data", {})
    kwargs: dict[str, Any] = {"batch_size": batch_size, "seed": config.get("seed", data.get("seed", 0)),
                              "val_size": config.get("val_size", 5000)}
    if config.get("max_train_samples") is not None:
        kwargs["max_train_samples"] = config["max_train_samples"]
    kind = "cifar10" if data.get("name") == "cifar10" else "synthetic"
    if kind == "synthetic":
        kwargs.update({k: data[k] for k in ("train_size", "test_size") if k in data})
    dm, message = resolve_data(kind, data_dir, **kwargs)
    dm.setup("fit")
    return dm, message, kind == "synthetic"


def validation_loader(config: dict[str, Any], data_dir: str, batch_size: int = 128):
    """The validation split the recipe held out for this model (synthetic unless CIFAR-10 was used)."""
    dm, message, synthetic = recipe_datamodule(config, data_dir, batch_size)
    return dm.val_dataloader(), message, synthetic


def _recipe():
    spec = importlib.util.spec_from_file_location("vgg_cifar", ROOT / "recipes" / "vgg_cifar.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("vgg_cifar", module)
    spec.loader.exec_module(module)
    return module
