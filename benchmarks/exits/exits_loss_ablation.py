"""Ablation of the multi-exit training loss at the same budget: overthinking-weighted vs equal
weights vs final-only.

Three networks (VGG-16 width 0.25 with SPINN's six exits by default), same data, seed, epochs,
optimiser and schedule; only the loss differs:

* ``overthinking``: ``L = sum_i tau_i L_i``, tau_i ramping from 0.01 to the exit's MACs fraction
  (Shallow-Deep Networks, used by SPINN); final exit weight 1;
* ``equal``: every exit weighted 1;
* ``final_only``: the backbone learns from the final exit's loss only; the heads learn on detached
  features (weight 1 each), so they cost the same compute but never shape the backbone.

For each: per-exit test accuracy, the test sweep (accuracy vs mean MACs fraction), the cheapest
sweep point within 1 point of the best final-exit accuracy of the three, the lossless-threshold
operating point (thresholds from the validation split) and the overthinking rate. Writes
``summary.json`` and ``ablation.png`` under ``--out``.

Example:
    python benchmarks/exits/exits_loss_ablation.py --out runs/bench_exits_ablation
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402
from benchmarks.exits._training import batches, build, machine, synthetic_splits, train  # noqa: E402

from nestflex.exits import DEFAULT_POSITIONS  # noqa: E402
from nestflex.exits.placement import parse_positions  # noqa: E402
from nestflex.exits.report import cheapest_within, evaluate_exits  # noqa: E402

SCHEMA_VERSION = 1
VARIANTS = ("overthinking", "equal", "final_only")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p)
    p.add_argument("--model", default="vgg16")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--train-samples", type=int, default=15_000)
    p.add_argument("--val-samples", type=int, default=5_000)
    p.add_argument("--test-samples", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--positions", default=",".join(str(p) for p in DEFAULT_POSITIONS))
    p.add_argument("--head", default="sdn")
    p.add_argument("--confidence", default="max_prob")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("train_samples", "val_samples", "test_samples", "epochs", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    resolve_out(args, __file__)
    return args


def plot(variants: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, v in variants.items():
        xs = [e["macs_fraction"] for e in v["exits"]]
        ax1.plot(xs, [100 * e["accuracy"] for e in v["exits"]], "o-", label=name)
        ax2.plot(
            [r["mean_macs_fraction"] for r in v["sweep"]],
            [100 * r["accuracy"] for r in v["sweep"]],
            "o-",
            ms=3,
            label=name,
        )
    ax1.set_xlabel("exit: MACs fraction of the backbone")
    ax1.set_ylabel("test accuracy of the exit alone (%)")
    ax1.set_title("per-exit accuracy", fontsize=9)
    ax2.set_xlabel("mean MACs per sample / backbone MACs")
    ax2.set_ylabel("test accuracy (%)")
    ax2.set_title("threshold sweep (max_prob)", fontsize=9)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title + " (synthetic data)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    positions = parse_positions(args.positions)

    def log(msg: str) -> None:
        print(f"[exits_loss_ablation] {msg}", flush=True)

    data = synthetic_splits(args.train_samples, args.val_samples, args.test_samples, args.seed)
    started = time.perf_counter()
    variants, macs = {}, None
    for name in VARIANTS:
        net = build(args.model, args.width, positions, args.head, args.seed)  # same initial weights
        timing = train(net, *data["train"], args.epochs, name, log, seed=args.seed)
        calibration, test = evaluate_exits(
            net, batches(*data["val"]), batches(*data["test"]), args.confidence
        )
        macs = net.exit_macs
        variants[name] = {
            "exits": [
                {k: e[k] for k in ("name", "position", "macs_fraction", "accuracy")} for e in test["exits"]
            ],
            "final_exit_accuracy": test["final_accuracy"],
            "mean_early_exit_accuracy": sum(e["accuracy"] for e in test["exits"][:-1])
            / (len(test["exits"]) - 1),
            "overthinking_rate": test["overthinking_rate"],
            "sweep": [
                {k: r[k] for k in ("threshold", "accuracy", "mean_macs_fraction")} for r in test["sweep"]
            ],
            "lossless": {
                "thresholds": test["at_thresholds"]["thresholds"],
                "fallback": "final",
                "accuracy": test["at_thresholds"]["accuracy"],
                "mean_macs_fraction": test["at_thresholds"]["mean_macs_fraction"],
            },
            "train_seconds": timing["seconds"],
            "epoch_seconds_median": timing["epoch_seconds_median"],
        }
        log(
            f"{name}: per-exit accuracy {[round(e['accuracy'], 4) for e in test['exits']]}; lossless "
            f"{variants[name]['lossless']['accuracy']:.4f} at {variants[name]['lossless']['mean_macs_fraction']:.3f} MACs"
        )
    reference = max(v["final_exit_accuracy"] for v in variants.values())
    for v in variants.values():
        row = cheapest_within(v["sweep"], reference, 0.01)
        v["cheapest_within_1pt_of_best_final"] = (
            {k: row[k] for k in ("threshold", "accuracy", "mean_macs_fraction")} if row else None
        )
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "exits_loss_ablation",
        "synthetic": True,
        "scale": "CPU-feasible: reduced width, a training subset and few epochs (see config); not the papers' scale",
        "config": {
            "model": args.model,
            "width": args.width,
            "train_samples": args.train_samples,
            "val_samples": args.val_samples,
            "test_samples": args.test_samples,
            "epochs": args.epochs,
            "positions": positions,
            "exit_macs": macs,
            "head": args.head,
            "confidence": args.confidence,
            "fallback": "most_confident for the sweep, final for the lossless thresholds",
            "seed": args.seed,
            "same_budget": "same epochs, data order, initial weights, optimiser and schedule",
            "reported_on": "test split; lossless thresholds fitted on the validation split",
        },
        "best_final_exit_accuracy": reference,
        "variants": variants,
        "seconds_total": time.perf_counter() - started,
        "machine": machine(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run(args.out, __file__, argv)
    plot(
        variants,
        args.out / "ablation.png",
        f"{args.model} x{args.width}, {args.train_samples} train, {args.epochs} epochs",
    )
    log(f"wrote {args.out / 'summary.json'} and ablation.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
