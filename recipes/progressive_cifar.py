#!/usr/bin/env python
"""Progressive inference network (SPINN): a ResNet-56 with six early exits, trained jointly.

    python recipes/progressive_cifar.py                  # defaults: synthetic data if no CIFAR-10
    python recipes/progressive_cifar.py --data cifar10 --width 1 --max-train-samples 0 --epochs 160

SPINN's recipe (METHODS.md section 3): exits at 15%, 30%, ..., 90% of the backbone's MACs, all with
the same head, trained jointly from scratch with the overthinking-aware loss of Shallow-Deep
Networks (tau_i ramps from 0.01 to the exit's position; final exit weight 1). SPINN uses
MSDNet-style heads (``--head msdnet``); the default here is SDN's pooled linear head, which did
better on the narrow CPU-sized network (docs/exits.md has both runs). Stages:

    train   joint training (Lightning: progress bar, CSV logs, rolling checkpoint, resumable)
    exits   calibration on the validation split (accuracy and exit rate per exit and threshold,
            lossless thresholds by cross-validation), accuracy vs MACs on the test split

Defaults are sized for a 2-core CPU (width 0.5, a 10,000-image training subset, 5 epochs).
Everything lands in ``--out``: ``summary.json`` (keys in docs/recipes.md), plots, logs and
checkpoints; a stage reuses what an earlier run with the same configuration left there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable


sys.path.insert(0, str(Path(__file__).resolve().parent))  # the recipes' own helper, beside this file
from _run import StageDir  # noqa: E402
from nestflex._io import read_json, write_json
from nestflex._machine import machine
from nestflex.data import resolve_data
from nestflex.exits import list_confidences, list_heads
from nestflex.exits.placement import parse_positions

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"train": "training"}
STAGES: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {}


def stage(name: str):
    def wrap(fn):
        STAGES[name] = fn
        return fn

    return wrap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data",
        default="auto",
        choices=["auto", "cifar10", "synthetic"],
        help="auto: CIFAR-10 if found in --data-dir, else the synthetic dataset",
    )
    p.add_argument("--data-dir", default="data", help="where CIFAR-10 lives (python-batch layout)")
    p.add_argument("--download", action="store_true", help="download CIFAR-10 into --data-dir if missing")
    p.add_argument("--model", default="resnet56", help="backbone (any nestflex or timm:<name> model)")
    p.add_argument(
        "--width", type=float, default=0.5, help="channel multiplier (1.0 = the paper's ResNet-56)"
    )
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--max-train-samples",
        type=int,
        default=10_000,
        help="train on a seeded subset of this many images (0: all)",
    )
    p.add_argument(
        "--val-size", type=int, default=5000, help="validation samples held out of the train split"
    )
    p.add_argument(
        "--synthetic-train-size", type=int, default=50_000, help="synthetic data only: train split size"
    )
    p.add_argument(
        "--synthetic-test-size", type=int, default=10_000, help="synthetic data only: test split size"
    )
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    p.add_argument("--devices", default="1", help="Lightning devices")
    p.add_argument(
        "--positions",
        default="0.15,0.3,0.45,0.6,0.75,0.9",
        help="exit positions: MACs fractions in (0, 1) and/or split point names",
    )
    p.add_argument("--head", default="sdn", help=f"exit head: {', '.join(list_heads())}")
    p.add_argument(
        "--confidence", default="max_prob", help=f"confidence measure: {', '.join(list_confidences())}"
    )
    p.add_argument(
        "--fallback",
        default="most_confident",
        choices=["most_confident", "final"],
        help="who answers a sample no early exit took (SPINN: the most confident exit)",
    )
    p.add_argument("--out", default="runs/progressive_cifar", help="output directory")
    p.add_argument("--stages", default="all", help=f"comma list of {', '.join(STAGES)}, or all")
    args = p.parse_args(argv)
    names = list(STAGES) if args.stages == "all" else [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        p.error(
            f"--stages: unknown stage(s) {unknown or args.stages!r}; choose from {', '.join(STAGES)} or all"
        )
    args.stage_list = names
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.max_train_samples < 0:
        p.error(f"--max-train-samples must be >= 0 (0: all), got {args.max_train_samples}")
    return args


@stage("train")
def run_train(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Joint training of backbone and exits with the overthinking-aware loss (the public callback)."""
    import pytorch_lightning as pl

    from nestflex.exits import MultiExitClassifier, OverthinkingSchedule

    st = StageDir(Path(args.out), "train", {
        "model": args.model, "width": args.width, "epochs": args.epochs, "batch_size": args.batch_size,
        "lr": args.lr, "seed": args.seed, "data": ctx["data"], "max_train_samples": args.max_train_samples,
        "val_size": args.val_size, "positions": parse_positions(args.positions), "head": args.head,
    })
    if st.done("model.ckpt", "result.json"):
        module = MultiExitClassifier.load_from_checkpoint(st.dir / "model.ckpt", map_location="cpu", weights_only=True)
        return {"module": module, "summary": st.read("result.json")}
    resume = st.begin()
    pl.seed_everything(args.seed, workers=True)
    dm = ctx["datamodule"]
    module = MultiExitClassifier(args.model, num_classes=dm.num_classes, width=args.width,
                                 positions=st.config["positions"], head=args.head, mode="joint", lr=args.lr,
                                 max_epochs=args.epochs, input_shape=dm.input_shape)
    trainer = st.trainer(args, [OverthinkingSchedule()], args.epochs, resume)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    net = module.model
    result = {
        "epochs": args.epochs, "train_seconds": round(seconds, 1), "train_samples": len(dm.train_dataset),
        "backbone_macs": net.backbone_macs, "head_macs": net.head_macs,
        "params": sum(p.numel() for p in net.parameters()),
        "backbone_params": sum(p.numel() for p in net.backbone.parameters()), "checkpoint": "train/model.ckpt",
    }
    st.write("result.json", result)
    return {"module": module, "summary": result}


@stage("exits")
def run_exits(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Calibrate on the validation split, report accuracy vs MACs on the test split."""
    from nestflex.exits import MultiExitClassifier
    from nestflex.exits.report import evaluate_exits, exits_summary, plot_tradeoff

    if "train" in ctx:
        module = ctx["train"]["module"]
    else:
        ckpt = Path(args.out) / "train" / "model.ckpt"
        if not ckpt.exists():
            raise SystemExit(
                f"--stages: the trained network {ckpt} does not exist. "
                f"HINT: run with --stages train first (or --stages all)"
            )
        module = MultiExitClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
    dm = ctx["datamodule"]
    dm.setup("fit")
    net = module.model.cpu()
    calibration, test = evaluate_exits(
        net, dm.val_dataloader(), dm.test_dataloader(), confidence=args.confidence, fallback=args.fallback
    )
    out = Path(args.out) / "exits"
    write_json(out / "calibration.json", calibration)
    write_json(out / "test.json", test)
    other = test["sweep_other_fallback"]
    plot_tradeoff(
        {
            f"joint, {module.hparams.head} heads, fallback {args.fallback}": test["sweep"],
            f"joint, {module.hparams.head} heads, fallback {other['fallback']}": other["sweep"],
        },
        test["final_accuracy"],
        Path(args.out) / "exits_tradeoff.png",
        f"progressive {args.model} x{args.width}",
        synthetic=ctx["data"]["synthetic"],
        marks={"lossless thresholds (validation), fallback final": test["at_thresholds"]},
    )
    summary = {
        "head": module.hparams.head,
        "mode": "joint",
        **exits_summary(net, calibration, test),
        "calibration": "exits/calibration.json",
        "test_profile": "exits/test.json",
    }
    return {"summary": summary}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dm, message = resolve_data(
        args.data,
        args.data_dir,
        download=args.download,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        max_train_samples=args.max_train_samples or None,
        val_size=args.val_size,
        seed=args.seed,
        train_size=args.synthetic_train_size,
        test_size=args.synthetic_test_size,
    )
    print(message)
    summary_path = out / "summary.json"
    summary: dict[str, Any] = read_json(summary_path) if summary_path.exists() else {}
    data = {"name": dm.name, "synthetic": bool(dm.synthetic), "seed": args.seed, "source": message}
    if dm.synthetic:
        data.update(train_size=dm.train_size, test_size=dm.test_size)
    ctx: dict[str, Any] = {"datamodule": dm, "data": data}
    summary.update(
        data=data,
        model={"name": args.model, "width": args.width, "num_classes": dm.num_classes},
        machine=machine(),
    )
    for name in args.stage_list:
        result = STAGES[name](args, ctx)
        ctx[name] = result
        summary[SUMMARY_KEYS.get(name, name)] = result["summary"]
        write_json(summary_path, summary)  # after every stage: a crash later keeps what is done
    print(f"summary: {summary_path}")
    tag = "  (synthetic data)" if data["synthetic"] else ""
    if "training" in summary:
        t = summary["training"]
        print(
            f"  train     {t['epochs']} epochs on {t['train_samples']:,} images in {t['train_seconds']} s; "
            f"backbone MACs {t['backbone_macs']:,}, exit heads {sum(t['head_macs']):,}{tag}"
        )
    if "exits" in summary:
        e = summary["exits"]
        print(f"  exits     {e['layers']} at {e['positions']} of the MACs{tag}")
        print(f"  exits     test accuracy per exit {e['accuracy']} (final = backbone alone){tag}")
        if "within_1pt" in e:
            w = e["within_1pt"]
            print(
                f"  exits     within 1 pt (threshold {w['threshold']} chosen on validation): accuracy "
                f"{w['accuracy']:.4f} at {w['macs_fraction']:.2f} of the backbone's MACs{tag}"
            )
        else:
            print(
                f"  exits     no threshold keeps the {e['fallback']} policy within 1 pt of the final exit on validation"
            )
        ll = e["lossless"]
        print(
            f"  exits     lossless thresholds: accuracy {ll['accuracy']:.4f} at {ll['macs_fraction']:.2f} of the "
            f"backbone's MACs; overthinking rate {e['overthinking_rate']:.4f}{tag}"
        )
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
