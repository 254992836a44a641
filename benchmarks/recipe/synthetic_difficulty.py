"""How hard is the synthetic dataset? Accuracy of a small VGG-16 overall and per difficulty quintile.

Trains ``vgg16`` (width 0.25 by default) with a plain torch loop (SGD, momentum 0.9, one-cycle
learning rate, weight decay 5e-4, batch 128, pad-4 crop + flip) on the synthetic train split and
evaluates on the synthetic test split. Writes, under ``--out``:

* ``summary.json``: generation time of the default 60,000 images (median of ``--gen-repeats``
  runs), test accuracy overall and per difficulty quintile, the configuration, the machine
  (cores, torch threads, torch version). Everything is labelled ``"synthetic": true``.
* ``accuracy_vs_difficulty.png``: accuracy per quintile of the per-sample difficulty.
* ``examples.png``: easy and hard examples of every class.

Example:
    python benchmarks/recipe/synthetic_difficulty.py --epochs 15 --out runs/bench_synthetic
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from nestflex._machine import machine
from nestflex.data import (
    SYNTHETIC_CLASSES,
    SYNTHETIC_MEAN,
    SYNTHETIC_STD,
    SYNTHETIC_TEST_SIZE,
    SYNTHETIC_TRAIN_SIZE,
    eval_transform,
    make_synthetic,
    train_transform,
)
from nestflex.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

SCHEMA_VERSION = 1
QUINTILE_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--train-samples", type=int, default=SYNTHETIC_TRAIN_SIZE)
    p.add_argument("--test-samples", type=int, default=SYNTHETIC_TEST_SIZE)
    p.add_argument("--width", type=float, default=0.25, help="VGG-16 width multiplier")
    p.add_argument("--seed", type=int, default=0, help="dataset and training seed")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate of the one-cycle schedule")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads")
    p.add_argument("--gen-repeats", type=int, default=3, help="timed generations of the 60k default set")
    args = p.parse_args(argv)
    for name in ("epochs", "train_samples", "test_samples", "batch_size", "threads", "gen_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    resolve_out(args, __file__)
    return args


def time_generation(
    seed: int, repeats: int
) -> tuple[list[float], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Time rendering of the default 50k train + 10k test sets; return the timings and the sets."""
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        train = make_synthetic(SYNTHETIC_TRAIN_SIZE, seed, "train")
        test = make_synthetic(SYNTHETIC_TEST_SIZE, seed, "test")
        timings.append(time.perf_counter() - t0)
    return timings, train, test


def quintile_accuracy(correct: torch.Tensor, difficulty: torch.Tensor) -> list[dict[str, float]]:
    """Accuracy per fixed difficulty bin [0, 0.2), ..., [0.8, 1.0] (d is uniform: a fifth each)."""
    rows = []
    for lo, hi in zip(QUINTILE_EDGES[:-1], QUINTILE_EDGES[1:]):
        sel = (difficulty >= lo) & ((difficulty < hi) if hi < 1.0 else (difficulty <= hi))
        n = int(sel.sum())
        acc = float(correct[sel].float().mean()) if n else float("nan")
        rows.append({"difficulty_lo": lo, "difficulty_hi": hi, "n": n, "accuracy": acc})
    return rows


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, batch: int = 500
) -> torch.Tensor:
    """Per-sample correctness (bool tensor) on normalised, unaugmented images."""
    model.eval()
    norm = eval_transform(SYNTHETIC_MEAN, SYNTHETIC_STD)
    preds = [model(norm(images[i : i + batch])).argmax(1) for i in range(0, len(images), batch)]
    return torch.cat(preds) == targets


def train(
    args: argparse.Namespace, images: torch.Tensor, targets: torch.Tensor, log: Callable[[str], None]
) -> tuple[torch.nn.Module, list[float]]:
    """Plain SGD loop with batch-level augmentation; returns the model and each epoch's seconds."""
    torch.manual_seed(args.seed)
    model = create_model("vgg16", num_classes=len(SYNTHETIC_CLASSES), width=args.width)
    opt = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay, nesterov=True
    )
    steps_per_epoch = len(images) // args.batch_size  # drop the last partial batch (BatchNorm1d)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, pct_start=0.15
    )
    g = torch.Generator().manual_seed(args.seed)
    augment = train_transform(SYNTHETIC_MEAN, SYNTHETIC_STD, generator=g)
    epoch_seconds = []
    for epoch in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        order = torch.randperm(len(images), generator=g)
        total_loss = 0.0
        for step in range(steps_per_epoch):
            idx = order[step * args.batch_size : (step + 1) * args.batch_size]
            loss = F.cross_entropy(model(augment(images[idx])), targets[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total_loss += float(loss.detach())
        epoch_seconds.append(time.perf_counter() - t0)
        mean_loss = total_loss / steps_per_epoch
        log(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss:.4f} ({epoch_seconds[-1]:.1f} s)")
    return model, epoch_seconds


def plot_accuracy(rows: list[dict[str, float]], overall: float, path: Path, title: str) -> None:
    """Bar chart of accuracy per difficulty quintile, with the overall accuracy and chance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['difficulty_lo']:.1f}-{r['difficulty_hi']:.1f}" for r in rows]
    accs = [100 * r["accuracy"] for r in rows]
    bars = ax.bar(labels, accs, color="#4c72b0")
    for b, a in zip(bars, accs):
        ax.text(b.get_x() + b.get_width() / 2, a + 1, f"{a:.1f}", ha="center", fontsize=9)
    ax.axhline(100 * overall, color="k", ls="--", lw=1, label=f"overall {100 * overall:.1f}%")
    ax.axhline(10, color="grey", ls=":", lw=1, label="chance")
    ax.set_ylim(0, 118)  # headroom above the bars for the legend
    ax.set_xlabel("difficulty quintile")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_examples(
    images: torch.Tensor, targets: torch.Tensor, difficulty: torch.Tensor, path: Path, per_side: int = 6
) -> None:
    """One row per class: ``per_side`` easiest examples, then ``per_side`` hardest ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_cls = len(SYNTHETIC_CLASSES)
    fig, axes = plt.subplots(n_cls, 2 * per_side, figsize=(2 * per_side * 0.9, n_cls * 1.0))
    for k in range(n_cls):
        idx = (targets == k).nonzero().flatten()
        order = idx[difficulty[idx].argsort()]
        picks = torch.cat([order[:per_side], order[-per_side:]])
        for j, i in enumerate(picks):
            ax = axes[k, j]
            ax.imshow(images[i].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"d={float(difficulty[i]):.2f}", fontsize=6, pad=2)
        axes[k, 0].set_ylabel(SYNTHETIC_CLASSES[k], fontsize=7)
    fig.suptitle("nestflex synthetic dataset (test split): easiest | hardest per class", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[synthetic_difficulty] {msg}", flush=True)

    gen_times, (tr_x, tr_y, tr_d), (te_x, te_y, te_d) = time_generation(args.seed, args.gen_repeats)
    gen_median = statistics.median(gen_times)
    log(f"generated 60,000 synthetic images in {gen_median:.2f} s (median of {len(gen_times)})")
    if args.train_samples > len(tr_x):
        tr_x, tr_y, tr_d = make_synthetic(args.train_samples, args.seed, "train")
    if args.test_samples > len(te_x):
        te_x, te_y, te_d = make_synthetic(args.test_samples, args.seed, "test")
    tr_x, tr_y = tr_x[: args.train_samples], tr_y[: args.train_samples]
    te_x, te_y, te_d = te_x[: args.test_samples], te_y[: args.test_samples], te_d[: args.test_samples]

    t0 = time.perf_counter()
    model, epoch_seconds = train(args, tr_x, tr_y, log)
    train_seconds = time.perf_counter() - t0
    correct = evaluate(model, te_x, te_y)
    overall = float(correct.float().mean())
    rows = quintile_accuracy(correct, te_d)
    per_class = [float(correct[te_y == k].float().mean()) for k in range(len(SYNTHETIC_CLASSES))]
    per_quintile = ", ".join(f"{100 * r['accuracy']:.1f}" for r in rows)
    log(f"test accuracy {100 * overall:.2f}% (synthetic); per difficulty quintile: {per_quintile}")

    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "synthetic_difficulty",
        "synthetic": True,
        "dataset": {
            "name": "nestflex synthetic shapes",
            "synthetic": True,
            "seed": args.seed,
            "classes": list(SYNTHETIC_CLASSES),
            "train_samples": int(len(tr_x)),
            "test_samples": int(len(te_x)),
        },
        "generation": {
            "synthetic": True,
            "images": SYNTHETIC_TRAIN_SIZE + SYNTHETIC_TEST_SIZE,
            "seconds_median": gen_median,
            "seconds_all": gen_times,
        },
        "training": {
            "model": "vgg16",
            "width": args.width,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "optimizer": "SGD(momentum=0.9, nesterov=True)",
            "lr_schedule": f"one-cycle, max_lr={args.lr}, pct_start=0.15",
            "weight_decay": args.weight_decay,
            "augmentation": "pad-4 random crop + horizontal flip",
            "seconds": train_seconds,
            "epoch_seconds_median": statistics.median(epoch_seconds),
        },
        "results": {
            "synthetic": True,
            "test_accuracy": overall,
            "test_accuracy_per_difficulty_quintile": rows,
            "test_accuracy_per_class": dict(zip(SYNTHETIC_CLASSES, per_class)),
        },
        "machine": machine(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run(args.out, __file__, argv)
    plot_accuracy(
        rows,
        overall,
        args.out / "accuracy_vs_difficulty.png",
        f"SYNTHETIC data: vgg16 x{args.width}, {args.epochs} epochs, {len(tr_x)} train samples",
    )
    plot_examples(te_x, te_y, te_d, args.out / "examples.png")
    log(f"wrote {args.out / 'summary.json'}, accuracy_vs_difficulty.png, examples.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
