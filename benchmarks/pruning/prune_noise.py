"""How noisy is a pruning step's verdict? Evaluation noise vs retraining noise, and what more epochs buy.

FilterPruning keeps a step when its retrained validation accuracy meets ``start - max_drop``.
Two kinds of noise sit under that comparison, and they call for different fixes:

- **evaluation noise**: the validation split is finite. The binomial standard error of one
  accuracy, and the paired standard error of the difference between the starting model and a
  footprint on the same images (what the rule actually compares), come from the predictions.
- **retraining noise**: the same pruned model retrained with another seed (data order,
  augmentation) lands elsewhere. Measured by continuing a footprint's retraining for ``--epochs``
  more epochs under ``--repeats`` seeds (augmentation and training order; the validation split
  stays), the recipe's schedule (a cosine restart per epoch).

The second part also measures what more retraining buys: the mean gain per extra epoch is what a
"recover before judging" rule and a final fine-tune of the seed can expect.

    python benchmarks/pruning/prune_noise.py --run runs/vgg_cifar_default --out docs/results/prune_noise/default

``--run`` is a finished recipe output (baseline + prune stages); ``--recipe-args`` repeats the
flags that run was started with (data, seed, sizes), so the same validation split is rebuilt.
Writes ``summary.json``. Figures are on the run's data (synthetic unless the run says otherwise).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, machine, recipe, resolve_out, scratch_dir, write_run  # noqa: E402

from nestflex._io import read_json, write_json  # noqa: E402
from nestflex.pruning import Roadmap, load_pruned  # noqa: E402
from nestflex.training import ImageClassifier  # noqa: E402


def predictions(model: torch.nn.Module, loader) -> torch.Tensor:
    """Per-sample correct flags of ``model`` on ``loader``, eval mode, no grad."""
    model.eval()
    hits = []
    with torch.no_grad():
        for x, y in loader:
            hits.append(model(x).argmax(1) == y)
    return torch.cat(hits)


def paired(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Accuracy of ``a`` and ``b`` (correct flags on the same samples), their difference, and the
    standard errors: binomial for one accuracy, paired (discordant pairs) for the difference."""
    n = a.numel()
    pa, pb = a.double().mean().item(), b.double().mean().item()
    only_a = (a & ~b).sum().item() / n
    only_b = (b & ~a).sum().item() / n
    d = pa - pb
    return {"n": n, "accuracy_a": round(pa, 5), "accuracy_b": round(pb, 5), "drop": round(d, 5),
            "se_accuracy": round(math.sqrt(pb * (1 - pb) / n), 5),
            "se_drop_paired": round(math.sqrt(max(only_a + only_b - d * d, 0.0) / n), 5),
            "se_drop_unpaired": round(math.sqrt(pa * (1 - pa) / n + pb * (1 - pb) / n), 5),
            "discordant": round(only_a + only_b, 5)}


class _PerEpoch(pl.Callback):
    """Validation and test accuracy after every training epoch."""

    def __init__(self, val_loader, test_loader) -> None:
        self.val_loader, self.test_loader, self.rows = val_loader, test_loader, []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        val = predictions(pl_module.model, self.val_loader)
        test = predictions(pl_module.model, self.test_loader)
        self.rows.append({"epoch": trainer.current_epoch + 1, "val": round(val.double().mean().item(), 5),
                          "test": round(test.double().mean().item(), 5)})
        pl_module.train()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished recipe output directory (baseline, prune)")
    p.add_argument("--recipe-args", default="", help="the flags the run was started with (data, seed, sizes)")
    p.add_argument("--footprint", default="seed", help="'seed' or a footprint step number to retrain")
    p.add_argument("--repeats", type=int, default=3, help="retraining seeds")
    p.add_argument("--epochs", type=int, default=2, help="extra retraining epochs per seed")
    add_out_args(p)
    a = p.parse_args(argv)
    resolve_out(a, __file__)
    recipe_ = recipe()
    ra = recipe_.parse_args(shlex.split(a.recipe_args) + ["--out", str(a.run)])
    dm, message = recipe_.data_module(ra)
    dm.setup("fit")
    dm.setup("test")
    val_loader, test_loader = dm.val_dataloader(), dm.test_dataloader()
    road = Roadmap.load(a.run / "prune" / "roadmap.json")
    fp = road.seed if a.footprint == "seed" else next(f for f in road.footprints if f.step == int(a.footprint))
    prune_cfg = read_json(a.run / "prune" / "config.json")

    base = ImageClassifier.load_from_checkpoint(a.run / "baseline" / "model.ckpt", map_location="cpu", weights_only=True)
    pruned = ImageClassifier(**dict(base.hparams) | {"lr": prune_cfg["lr"], "max_epochs": a.epochs, "restart_epochs": 1})
    load_pruned(pruned, a.run / "prune" / fp.checkpoint)
    evaluation = {}
    for split, loader in (("val", val_loader), ("test", test_loader)):
        b = predictions(base.model, loader)
        f = predictions(pruned.model, loader)
        evaluation[split] = paired(b, f)
    print(f"evaluation noise (val): {evaluation['val']}")

    runs = []
    for r in range(a.repeats):
        module = ImageClassifier(**dict(pruned.hparams))
        load_pruned(module, a.run / "prune" / fp.checkpoint)
        pl.seed_everything(1000 + r, workers=True)
        rec = _PerEpoch(val_loader, test_loader)
        trainer = pl.Trainer(max_epochs=a.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[rec],
                             limit_val_batches=0, default_root_dir=scratch_dir(a.out) / "tmp")
        start = time.perf_counter()
        dm.seed = 1000 + r  # another training order too; the split was drawn at setup and stays
        trainer.fit(module, train_dataloaders=dm.train_dataloader())
        runs.append({"seed": 1000 + r, "epochs": rec.rows, "seconds": round(time.perf_counter() - start, 1)})
        print(f"retraining seed {1000 + r}: {rec.rows}")

    per_epoch = []
    for e in range(a.epochs):
        vals = [run["epochs"][e]["val"] for run in runs]
        tests = [run["epochs"][e]["test"] for run in runs]
        per_epoch.append({
            "extra_epochs": e + 1,
            "val_mean": round(statistics.mean(vals), 5), "val_sd": round(statistics.stdev(vals), 5) if len(vals) > 1 else None,
            "test_mean": round(statistics.mean(tests), 5), "test_sd": round(statistics.stdev(tests), 5) if len(tests) > 1 else None,
            "val_gain": round(statistics.mean(vals) - evaluation["val"]["accuracy_b"], 5),
            "test_gain": round(statistics.mean(tests) - evaluation["test"]["accuracy_b"], 5),
        })
    summary = {
        "run": str(a.run), "data": message, "synthetic": bool(dm.synthetic), "machine": machine(),
        "footprint": {"step": fp.step, "macs_fraction": round(fp.macs / road.footprints[0].macs, 4),
                      "recorded_val_accuracy": fp.accuracy},
        "goal": road.goal, "start_accuracy": road.start_accuracy, "max_drop": round(road.start_accuracy - road.goal, 6),
        "evaluation": evaluation, "retraining": {"lr": prune_cfg["lr"], "runs": runs, "per_epoch": per_epoch},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "summary.json", summary)
    write_run(a.out, __file__, argv)
    print(f"per extra epoch: {per_epoch}")
    return summary


if __name__ == "__main__":
    main()
