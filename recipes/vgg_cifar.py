#!/usr/bin/env python
"""End-to-end nestflex recipe: VGG on CIFAR-10 (or the embedded synthetic default).

    python recipes/vgg_cifar.py                      # defaults: synthetic data if no CIFAR-10
    python recipes/vgg_cifar.py --data cifar10 --data-dir ~/data --width 1 --epochs 160

Stages run in order and each reuses what an earlier run already left in ``--out`` (matching
configuration), so an interrupted run resumes where it stopped:

    baseline   train the network (Lightning: progress bar, CSV logs, checkpoints)
    profile    split quantisation profile: accuracy, bytes and codec time per <split, bitwidth>

Later nestflex releases add prune, grow, exits and export to this same list.
Everything lands in ``--out``: ``summary.json`` (documented in docs/recipes.md), plots, logs
and checkpoints.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from nestflex._io import read_json, write_json
from nestflex.data import resolve_data
from nestflex.graph import trace
from nestflex.models import list_models

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"profile": "quantization"}
STAGES: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {}


def stage(name: str):
    def wrap(fn):
        STAGES[name] = fn
        return fn

    return wrap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="auto", choices=["auto", "cifar10", "synthetic"],
                   help="auto: CIFAR-10 if found in --data-dir, else the synthetic dataset")
    p.add_argument("--data-dir", default="data", help="where CIFAR-10 lives (python-batch layout)")
    p.add_argument("--download", action="store_true", help="download CIFAR-10 into --data-dir if missing")
    p.add_argument("--model", default="vgg16", help=f"one of {', '.join(list_models())} or timm:<name>")
    p.add_argument("--width", type=float, default=0.25, help="channel multiplier (1.0 = the paper's VGG)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-train-samples", type=int, default=None, help="train on a seeded subset")
    p.add_argument("--val-size", type=int, default=5000, help="validation samples held out of the train split")
    p.add_argument("--synthetic-train-size", type=int, default=50_000, help="synthetic data only: train split size")
    p.add_argument("--synthetic-test-size", type=int, default=10_000, help="synthetic data only: test split size")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    p.add_argument("--devices", default="1", help="Lightning devices")
    p.add_argument("--out", default="runs/vgg_cifar", help="output directory")
    p.add_argument("--profile-samples", type=int, default=1000,
                   help="profile stage: validation samples used per <split, bitwidth>")
    p.add_argument("--stages", default="all", help=f"comma list of {', '.join(STAGES)}, or all")
    args = p.parse_args(argv)
    names = list(STAGES) if args.stages == "all" else [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        p.error(f"--stages: unknown stage(s) {unknown or args.stages!r}; choose from {', '.join(STAGES)} or all")
    args.stage_list = names
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    return args


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


@stage("baseline")
def run_baseline(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from nestflex.training import ImageClassifier

    out = Path(args.out) / "baseline"
    config = {
        "model": args.model, "width": args.width, "epochs": args.epochs, "batch_size": args.batch_size,
        "lr": args.lr, "seed": args.seed, "data": ctx["data"], "max_train_samples": args.max_train_samples,
        "val_size": args.val_size,
    }
    final = out / "model.ckpt"
    if final.exists() and (out / "config.json").exists() and read_json(out / "config.json") == config:
        print(f"baseline: reusing {final} (same configuration)")
        module = ImageClassifier.load_from_checkpoint(final, map_location="cpu", weights_only=True)
        result = read_json(out / "result.json")
        return {"module": module, "summary": result}

    pl.seed_everything(args.seed, workers=True)
    dm = ctx["datamodule"]
    module = ImageClassifier(args.model, num_classes=dm.num_classes, width=args.width, lr=args.lr, max_epochs=args.epochs)
    last = out / "last.ckpt"
    resume = last if last.exists() and (out / "config.json").exists() and read_json(out / "config.json") == config else None
    write_json(out / "config.json", config)
    logs = Path(args.out) / "logs"
    # Lightning's CSVLogger empties an existing version directory, so a resumed run logs to a new
    # one and the curves are stitched from all of them: resuming never loses logged epochs.
    version = f"baseline-resume{len(list(logs.glob('baseline-resume*'))) + 1}" if resume else "baseline"
    if not resume:
        for old in logs.glob("baseline-resume*"):
            shutil.rmtree(old)  # logs of an abandoned configuration
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator=args.accelerator,
        devices=int(args.devices) if args.devices.isdigit() else args.devices,
        logger=CSVLogger(args.out, name="logs", version=version),
        # one rolling checkpoint after every epoch: what a killed run resumes from
        callbacks=[ModelCheckpoint(dirpath=out, filename="last", save_top_k=1, enable_version_counter=False)],
        default_root_dir=args.out,
        enable_model_summary=False,
    )
    if resume:
        print(f"baseline: resuming from {resume}")
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
    seconds = time.perf_counter() - start
    test = trainer.test(module, datamodule=dm, verbose=False)[0]
    graph = trace(module.model.cpu())
    result = {
        "accuracy": round(float(test["test_acc"]), 4),
        "params": graph.params(),
        "macs": graph.macs(),
        "epochs": args.epochs,
        "train_seconds": round(seconds, 1),
        "checkpoint": str(final.relative_to(args.out)),
    }
    write_json(out / "result.json", result)
    trainer.save_checkpoint(final, weights_only=True)
    _plot_curves(sorted(logs.glob("baseline*/metrics.csv"), key=lambda p: p.stat().st_mtime),
                 Path(args.out) / "baseline_curves.png", synthetic=ctx["data"]["synthetic"])
    return {"module": module, "summary": result}


@stage("profile")
def run_profile(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Split quantisation profile: accuracy, bytes and codec time per <split, bitwidth>."""
    from nestflex.profiling import profile_split_quantization
    from nestflex.profiling.plots import plot_split_quantization

    module = _baseline_module(args, ctx)
    out = Path(args.out) / "profile"
    config = {"baseline": read_json(Path(args.out) / "baseline" / "config.json"),
              "samples": args.profile_samples, "codec": "blosc_lz4"}
    if (out / "config.json").exists() and read_json(out / "config.json") == config and (out / "split_quantization.json").exists():
        print(f"profile: reusing {out / 'split_quantization.json'} (same configuration)")
        profile = read_json(out / "split_quantization.json")
    else:
        dm = ctx["datamodule"]
        dm.setup("fit")
        # validation split: thresholds and bitwidths are chosen on it, never on the test set
        profile = profile_split_quantization(module.model.cpu(), dm.val_dataloader(), max_samples=args.profile_samples)
        write_json(out / "split_quantization.json", profile)
        write_json(out / "config.json", config)
    plot_split_quantization(profile, Path(args.out) / "split_quantization.png", synthetic=ctx["data"]["synthetic"])
    splits = {}
    for row in profile["splits"]:
        bits = row["lowest_bits"]["1"]
        ratio = next(r["ratio"] for r in row["per_bits"] if r["bits"] == bits)
        splits[row["name"]] = {"bits": bits, "compression_ratio": round(ratio, 2)}
    summary = {"float_accuracy": profile["float_accuracy"], "samples": profile["samples"],
               "profile": "profile/split_quantization.json", "splits": splits}
    return {"summary": summary, "profile": profile}


def _baseline_module(args: argparse.Namespace, ctx: dict[str, Any]):
    """The baseline from this run, or from an earlier run's checkpoint in --out."""
    from nestflex.training import ImageClassifier

    if "baseline" in ctx:
        return ctx["baseline"]["module"]
    ckpt = Path(args.out) / "baseline" / "model.ckpt"
    if not ckpt.exists():
        raise SystemExit(f"--stages: the baseline checkpoint {ckpt} does not exist. "
                         f"HINT: run with --stages baseline first (or --stages all)")
    return ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)


def _plot_curves(csv_paths: list[Path], png: Path, synthetic: bool) -> None:
    """Accuracy per epoch from Lightning CSV logs; later files (resumed runs) win per epoch."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val: dict[int, float] = {}
    train: dict[int, float] = {}
    for csv_path in csv_paths:
        with open(csv_path) as f:
            for row in csv.DictReader(f):
                if row.get("val_acc"):
                    val[int(row["epoch"])] = float(row["val_acc"])
                if row.get("train_acc"):
                    train[int(row["epoch"])] = float(row["train_acc"])
    if not val and not train:
        return
    train, val = dict(sorted(train.items())), dict(sorted(val.items()))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([e + 1 for e in train], list(train.values()), "o-", label="train")
    ax.plot([e + 1 for e in val], list(val.values()), "s-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("baseline" + (" (synthetic data)" if synthetic else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dm, message = resolve_data(
        args.data, args.data_dir, download=args.download, batch_size=args.batch_size,
        num_workers=args.num_workers, max_train_samples=args.max_train_samples, val_size=args.val_size,
        seed=args.seed, train_size=args.synthetic_train_size, test_size=args.synthetic_test_size,
    )
    print(message)
    summary_path = out / "summary.json"
    summary: dict[str, Any] = read_json(summary_path) if summary_path.exists() else {}
    data = {"name": dm.name, "synthetic": bool(dm.synthetic), "seed": args.seed, "source": message}
    if dm.synthetic:
        data.update(train_size=dm.train_size, test_size=dm.test_size)
    ctx: dict[str, Any] = {"datamodule": dm, "data": data}
    summary.update(data=data, model={"name": args.model, "width": args.width, "num_classes": dm.num_classes},
                   machine=machine())
    for name in args.stage_list:
        result = STAGES[name](args, ctx)
        ctx[name] = result
        summary[SUMMARY_KEYS.get(name, name)] = result["summary"]
        write_json(summary_path, summary)  # after every stage: a crash later keeps what is done
    print(f"summary: {summary_path}")
    tag = "  (synthetic data)" if data["synthetic"] else ""
    if "baseline" in summary:
        s = summary["baseline"]
        print(f"  baseline  accuracy {s['accuracy']:.4f}  params {s['params']:,}  MACs {s['macs']:,}{tag}")
    if "quantization" in summary:
        for split, q in summary["quantization"]["splits"].items():
            print(f"  profile   {split:<18} lowest bits within 1 pt: {q['bits']}  ratio {q['compression_ratio']}x{tag}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
