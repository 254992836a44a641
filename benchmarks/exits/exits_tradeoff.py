"""Early exits: accuracy vs mean MACs per sample over the threshold sweep, against the backbone alone.

Trains, on the synthetic dataset, with the same budget of ``--epochs``:

* the backbone alone (VGG-16, width 0.25 by default): the reference, MACs fraction 1;
* SDN "IC-only": exit heads trained for ``--head-epochs`` on that frozen backbone;
* SPINN / SDN joint training: backbone and exits from scratch with the overthinking-aware loss.

Thresholds are calibrated on a validation split held out of the training split; every figure is
measured on the test split. The target (SDN: more than 50% cost reduction at preserved accuracy):
at most 50% of the backbone's MACs within 1 point of its accuracy. Writes, under ``--out``:
``summary.json``, ``tradeoff.png`` and ``run.json``; the joint network's weights
(``joint_model.pt``, a state_dict, for ``benchmarks/exits/exits_throughput.py``) are not a result
and go to ``runs/exits_tradeoff/<run>/`` for a run in ``docs/results`` (else beside the summary).

Example:
    python benchmarks/exits/exits_tradeoff.py --run-name mine      # docs/results/exits_tradeoff/mine/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, scratch_dir, write_run  # noqa: E402
from benchmarks.exits._training import batches, build, machine, synthetic_splits, train  # noqa: E402

from nestflex.exits import DEFAULT_POSITIONS, collect_logits  # noqa: E402
from nestflex.exits.placement import parse_positions  # noqa: E402
from nestflex.exits.report import cheapest_within, evaluate_exits, plot_tradeoff  # noqa: E402

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p)
    p.add_argument("--model", default="vgg16")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--train-samples", type=int, default=15_000)
    p.add_argument("--val-samples", type=int, default=5_000)
    p.add_argument("--test-samples", type=int, default=10_000)
    p.add_argument("--epochs", type=int, default=6, help="epochs of the backbone alone and of joint training")
    p.add_argument(
        "--head-epochs", type=int, default=3, help="epochs of exits-only training on the frozen backbone"
    )
    p.add_argument("--positions", default=",".join(str(p) for p in DEFAULT_POSITIONS))
    p.add_argument("--head", default="sdn")
    p.add_argument("--confidence", default="max_prob")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("train_samples", "val_samples", "test_samples", "epochs", "head_epochs", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    resolve_out(args, __file__)
    return args


def _target(sweep, backbone_accuracy):
    row = cheapest_within(sweep, backbone_accuracy, 0.01)
    if row is None:
        return {"met": False, "cheapest_within_1pt": None}
    return {
        "met": row["mean_macs_fraction"] <= 0.5,
        "cheapest_within_1pt": {k: row[k] for k in ("threshold", "accuracy", "mean_macs_fraction")},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    positions = parse_positions(args.positions)

    def log(msg: str) -> None:
        print(f"[exits_tradeoff] {msg}", flush=True)

    data = synthetic_splits(args.train_samples, args.val_samples, args.test_samples, args.seed)
    started = time.perf_counter()

    net = build(args.model, args.width, positions, args.head, args.seed)
    timing = {"backbone": train(net, *data["train"], args.epochs, "backbone", log, seed=args.seed)}
    logits, labels = collect_logits(net, batches(*data["test"]))
    backbone_acc = (logits[-1].argmax(1) == labels).double().mean().item()
    log(f"backbone alone: test accuracy {backbone_acc:.4f} (synthetic)")
    timing["exits_only"] = train(net, *data["train"], args.head_epochs, "exits_only", log, seed=args.seed)
    results = {
        "exits_only": evaluate_exits(net, batches(*data["val"]), batches(*data["test"]), args.confidence)
    }

    joint = build(args.model, args.width, positions, args.head, args.seed)
    timing["joint"] = train(joint, *data["train"], args.epochs, "overthinking", log, seed=args.seed)
    results["joint"] = evaluate_exits(joint, batches(*data["val"]), batches(*data["test"]), args.confidence)
    scratch_dir(args.out).mkdir(parents=True, exist_ok=True)  # the model is not a result: runs/, not docs/
    torch.save(joint.state_dict(), scratch_dir(args.out) / "joint_model.pt")

    variants = {}
    for name, (calibration, test) in results.items():
        variants[name] = {
            "synthetic": True,
            "exits": [
                {k: e[k] for k in ("name", "position", "macs_fraction", "accuracy")} for e in test["exits"]
            ],
            "final_exit_accuracy": test["final_accuracy"],
            "overthinking_rate": test["overthinking_rate"],
            "sweep": [
                {k: r[k] for k in ("threshold", "accuracy", "mean_macs_fraction", "exit_rate")}
                for r in test["sweep"]
            ],
            "sweep_fallback_final": [
                {k: r[k] for k in ("threshold", "accuracy", "mean_macs_fraction")}
                for r in test["sweep_other_fallback"]["sweep"]
            ],
            "lossless": {
                "thresholds": test["at_thresholds"]["thresholds"],
                "fallback": "final",
                "accuracy": test["at_thresholds"]["accuracy"],
                "mean_macs_fraction": test["at_thresholds"]["mean_macs_fraction"],
                "validation_cv_accuracy_delta": calibration["lossless"]["cv_accuracy_delta_mean"],
            },
            "chosen_on_validation": test.get("chosen_on_validation"),
            "target_vs_backbone_alone": _target(test["sweep"], backbone_acc),
            "target_vs_backbone_alone_fallback_final": _target(
                test["sweep_other_fallback"]["sweep"], backbone_acc
            ),
            "train_seconds": timing[name]["seconds"],
        }
        t = variants[name]["target_vs_backbone_alone"]
        log(
            f"{name}: lossless {variants[name]['lossless']['accuracy']:.4f} at "
            f"{variants[name]['lossless']['mean_macs_fraction']:.3f} MACs; within 1 pt of the backbone: "
            f"{t['cheapest_within_1pt']}; target met: {t['met']}"
        )

    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "exits_tradeoff",
        "synthetic": True,
        "scale": "CPU-feasible: reduced width, a training subset and few epochs (see config); not the papers' scale",
        "config": {
            "model": args.model,
            "width": args.width,
            "train_samples": args.train_samples,
            "val_samples": args.val_samples,
            "test_samples": args.test_samples,
            "epochs": args.epochs,
            "head_epochs": args.head_epochs,
            "positions": positions,
            "head": args.head,
            "confidence": args.confidence,
            "seed": args.seed,
            "fallback": "most_confident (SPINN) for 'sweep' and the targets; 'final' for the lossless "
            "thresholds and the '*_fallback_final' entries",
            "thresholds_chosen_on": "validation split (held out of the training split)",
            "reported_on": "test split",
        },
        "target": "at most 50% of the backbone's MACs within 1 point of its accuracy (SDN: >50% cost reduction "
        "at preserved accuracy on CIFAR-10); 'cheapest_within_1pt' picks the sweep point on the test "
        "split, 'chosen_on_validation' picks it on validation (within 1 pt of the final exit there)",
        "backbone_alone": {
            "accuracy": backbone_acc,
            "macs": net.backbone_macs,
            "train_seconds": timing["backbone"]["seconds"],
        },
        "variants": variants,
        "head_macs": net.head_macs,
        "seconds_total": time.perf_counter() - started,
        "machine": machine(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run(args.out, __file__, argv)
    curves = {
        "joint (overthinking loss), fallback most_confident": results["joint"][1]["sweep"],
        "joint (overthinking loss), fallback final": results["joint"][1]["sweep_other_fallback"]["sweep"],
        f"exits only ({args.head_epochs} ep), fallback most_confident": results["exits_only"][1]["sweep"],
        f"exits only ({args.head_epochs} ep), fallback final": results["exits_only"][1][
            "sweep_other_fallback"
        ]["sweep"],
    }
    marks = {
        "joint, lossless thresholds": results["joint"][1]["at_thresholds"],
        "exits only, lossless thresholds": results["exits_only"][1]["at_thresholds"],
    }
    plot_tradeoff(
        curves,
        backbone_acc,
        args.out / "tradeoff.png",
        f"{args.model} x{args.width}, {args.train_samples} train, {args.epochs} epochs: test split",
        synthetic=True,
        marks=marks,
    )
    log(f"wrote {args.out / 'summary.json'} and tradeoff.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
