"""Batched vs per-sample early exit on the CPU: throughput of the same policy, same answers.

*Per-sample* runs one image at a time through the stages and stops it at its exit (SPINN's
on-device loop). *Batched* (:func:`nestflex.deploy.exits.early_exit`) runs a batch and drops the
samples that exit from it before the next stage. Both give the same exit and prediction for every
sample (checked here); the question is speed. References: the backbone alone (batched and per
sample) and all exits computed for the whole batch (no early exit).

The network is the jointly trained one written by ``benchmarks/exits/exits_tradeoff.py``
(``--weights``), or, without it, a quickly trained one (``--train-epochs`` on
``--train-samples``), so that the exit distribution is a trained network's. Every workload is
timed once per round, rounds alternate (the machine's load drifts alike for all), and figures are
medians over ``--repeats`` rounds after a warm-up, with the torch thread count recorded. Writes
``summary.json`` and ``throughput.png`` under ``--out``.

Example:
    python benchmarks/exits/exits_throughput.py --weights runs/exits_tradeoff/mine/joint_model.pt --run-name mine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402
from benchmarks.exits._training import batches, build, machine, synthetic_splits, train  # noqa: E402

from nestflex.deploy.timing import alternating_median_s  # noqa: E402
from nestflex.exits import DEFAULT_POSITIONS  # noqa: E402
from nestflex.exits.placement import parse_positions  # noqa: E402

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_args(p)
    p.add_argument(
        "--weights", type=Path, default=None, help="state_dict of the multi-exit network (exits_tradeoff's)"
    )
    p.add_argument("--model", default="vgg16")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--positions", default=",".join(str(p) for p in DEFAULT_POSITIONS))
    p.add_argument("--head", default="sdn")
    p.add_argument("--confidence", default="max_prob")
    p.add_argument(
        "--thresholds", default="0.5,0.8,0.9,0.95,0.99,1.0", help="one threshold at every early exit"
    )
    p.add_argument("--samples", type=int, default=1000, help="test images timed batched")
    p.add_argument("--per-sample-samples", type=int, default=200, help="test images timed one at a time")
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--train-samples", type=int, default=5000, help="only without --weights")
    p.add_argument("--train-epochs", type=int, default=2, help="only without --weights")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in (
        "samples",
        "per_sample_samples",
        "batch_size",
        "repeats",
        "threads",
        "train_samples",
        "train_epochs",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    resolve_out(args, __file__)
    return args


def plot(rows: list[dict], backbone: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["mean_macs_fraction"] for r in rows]
    ax.plot(xs, [r["batched_samples_per_s"] for r in rows], "o-", label="batched early exit")
    ax.plot(xs, [r["per_sample_samples_per_s"] for r in rows], "s-", label="per-sample early exit")
    for r in rows:
        ax.annotate(
            f"t={r['threshold']}",
            (r["mean_macs_fraction"], r["batched_samples_per_s"]),
            fontsize=6,
            textcoords="offset points",
            xytext=(3, 3),
        )
    ax.axhline(backbone["batched_samples_per_s"], color="k", ls="--", lw=1, label="backbone alone, batched")
    ax.axhline(
        backbone["per_sample_samples_per_s"], color="grey", ls=":", lw=1, label="backbone alone, per sample"
    )
    ax.set_yscale("log")
    ax.set_xlabel("mean MACs per sample / backbone MACs")
    ax.set_ylabel("images per second (median)")
    ax.set_title(title + " (synthetic data)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    positions = parse_positions(args.positions)

    def log(msg: str) -> None:
        print(f"[exits_throughput] {msg}", flush=True)

    data = synthetic_splits(args.train_samples if args.weights is None else 1, 1, args.samples, args.seed)
    net = build(args.model, args.width, positions, args.head, args.seed)
    if args.weights is not None:
        net.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True))
        source = str(args.weights)
    else:
        with torch.enable_grad():
            train(net, *data["train"], args.train_epochs, "overthinking", log, seed=args.seed)
        source = f"trained here: joint, {args.train_epochs} epochs on {args.train_samples} synthetic images"
    net.eval()
    x = torch.cat([b for b, _ in batches(*data["test"])])
    xs = x[: args.per_sample_samples]
    chunks = list(torch.split(x, args.batch_size))
    thresholds = [float(t) for t in args.thresholds.split(",")]

    # every workload is timed once per round, rounds alternate: drift in the machine's load (it is
    # shared) hits all of them alike, and each figure is the median over rounds
    work = {
        "backbone_batched": (len(x), lambda: [net.backbone(c) for c in chunks]),
        "backbone_per_sample": (len(xs), lambda: [net.backbone(xs[i : i + 1]) for i in range(len(xs))]),
        "all_exits_batched": (len(x), lambda: [net(c) for c in chunks]),
    }
    for t in thresholds:
        work[f"batched@{t}"] = (len(x), lambda t=t: [net.early_exit(c, t, args.confidence) for c in chunks])
        work[f"per_sample@{t}"] = (
            len(xs),
            lambda t=t: [net.early_exit(xs[i : i + 1], t, args.confidence) for i in range(len(xs))],
        )
    seconds = alternating_median_s({name: fn for name, (_, fn) in work.items()}, args.repeats)
    rate = {name: work[name][0] / s for name, s in seconds.items()}

    backbone = {
        "batched_samples_per_s": rate["backbone_batched"],
        "per_sample_samples_per_s": rate["backbone_per_sample"],
    }
    all_exits = rate["all_exits_batched"]
    log(
        f"backbone alone: {backbone['batched_samples_per_s']:.0f} img/s batched, "
        f"{backbone['per_sample_samples_per_s']:.0f} img/s per sample; all exits batched {all_exits:.0f} img/s"
    )
    rows = []
    for t in thresholds:
        out = [net.early_exit(c, t, args.confidence) for c in chunks]
        exit_index = torch.cat([o.exit_index for o in out])
        singles = [net.early_exit(xs[i : i + 1], t, args.confidence) for i in range(len(xs))]
        same = exit_index[: len(xs)].tolist() == [s.exit_index.item() for s in singles] and torch.cat(
            [o.logits for o in out]
        )[: len(xs)].argmax(1).tolist() == [s.logits.argmax(1).item() for s in singles]
        macs = torch.as_tensor(net.exit_macs, dtype=torch.float64)[exit_index].mean().item()
        row = {
            "threshold": t,
            "exit_rate": (torch.bincount(exit_index, minlength=net.num_exits).double() / len(x)).tolist(),
            "mean_macs_fraction": macs / net.backbone_macs,
            "batched_samples_per_s": rate[f"batched@{t}"],
            "per_sample_samples_per_s": rate[f"per_sample@{t}"],
            "answers_equal": same,
        }
        row["batched_over_per_sample"] = row["batched_samples_per_s"] / row["per_sample_samples_per_s"]
        row["batched_over_backbone_batched"] = (
            row["batched_samples_per_s"] / backbone["batched_samples_per_s"]
        )
        row["per_sample_over_backbone_per_sample"] = (
            row["per_sample_samples_per_s"] / backbone["per_sample_samples_per_s"]
        )
        rows.append(row)
        log(
            f"t={t}: {row['mean_macs_fraction']:.3f} MACs, batched {row['batched_samples_per_s']:.0f} img/s, "
            f"per sample {row['per_sample_samples_per_s']:.0f} img/s ({row['batched_over_per_sample']:.1f}x), "
            f"same answers: {same}"
        )
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "exits_throughput",
        "synthetic": True,
        "config": {
            "model": args.model,
            "width": args.width,
            "positions": positions,
            "exit_names": net.exit_names,
            "head": args.head,
            "confidence": args.confidence,
            "fallback": "most_confident",
            "weights": source,
            "samples": len(x),
            "per_sample_samples": len(xs),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "timing": "images per second: median over repeats of rounds that time every workload once, in turn, after one warm-up each",
        },
        "backbone_alone": backbone,
        "all_exits_batched_samples_per_s": all_exits,
        "thresholds": rows,
        "machine": machine(),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_run(args.out, __file__, argv)
    plot(
        rows,
        backbone,
        args.out / "throughput.png",
        f"{args.model} x{args.width}, batch {args.batch_size}, {args.threads} threads",
    )
    log(f"wrote {args.out / 'summary.json'} and throughput.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
