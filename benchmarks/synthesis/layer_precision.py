"""Per-layer precision (float32 / bfloat16 / int8) on the trained recipe model, and the fastest
assignment within an accuracy-drop budget (Cappuccino's inexact computing).

Runs :func:`nestflex.profiling.profile_layer_precision` on the recipe's validation split: per
compute layer, accuracy with only that layer switched, and latency of the layer alone on its
recorded input; then the greedy assignment, verified by building and evaluating the mixed
model, and its whole-model latency against float32 (variants alternated, median of repeats).
One profile per budget in ``--budgets`` (the single-layer rows are re-measured each time, so
their spread across budgets shows the timing noise).

Writes, under ``--out``: ``summary.json`` (the profiles, machine, a note on timing noise) and
``layer_precision.png`` (per-layer latency and accuracy drop per precision, first budget).

Example:
    python benchmarks/synthesis/layer_precision.py --out runs/bench_layer_precision --checkpoint runs/vgg_cifar/baseline/model.ckpt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from nestflex._io import write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_model_args, load_model, machine, resolve_out, validation_loader, write_run  # noqa: E402

SCHEMA_VERSION = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--calibration", type=int, default=256, help="validation samples held out to calibrate int8")
    p.add_argument("--budgets", default="1,0", help="comma list of accuracy-drop budgets (points)")
    p.add_argument("--batch-sizes", default="64,1", help="comma list; the assignment is chosen for the first")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats (median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (recorded)")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nestflex.profiling import profile_layer_precision
    from nestflex.profiling.plots import plot_layer_precision

    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    model, config, source = load_model(args.checkpoint, args.out, args.data_dir)
    loader, data_source, synthetic = validation_loader(config, args.data_dir)
    budgets = [float(b) for b in args.budgets.split(",")]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    torch.set_num_threads(args.threads)
    profiles, seconds = [], []
    for budget in budgets:
        start = time.perf_counter()
        profiles.append(profile_layer_precision(
            model, loader, budget_points=budget, max_samples=args.samples, calibration_samples=args.calibration,
            batch_sizes=sizes, repeats=args.repeats, threads=args.threads,
        ))
        seconds.append(round(time.perf_counter() - start, 1))
        a, key = profiles[-1]["assignment"], str(sizes[0])
        print(f"budget {budget:g} pt: {a['counts']}  measured drop {a['drop_points']:.2f} pt  "
              f"speedup {a['speedup'][key]:.2f}x at batch {key} ({seconds[-1]} s)", flush=True)
    headline = []
    for budget, prof in zip(budgets, profiles):
        a = prof["assignment"]
        headline.append({
            "budget_points": budget, "counts": a["counts"], "float32_accuracy": prof["reference"]["accuracy"],
            "accuracy": a["accuracy"], "drop_points": a["drop_points"],
            "float32_latency_ms": prof["reference"]["latency_ms"], "unfused_float32_latency_ms": prof["reference"]["unfused_latency_ms"],
            "latency_ms": a["latency_ms"], "speedup": a["speedup"], "fallback": a["fallback"],
        })
    summary = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "layer_precision",
        "synthetic": synthetic,
        "data": data_source,
        "model_source": source,
        "model": {k: config.get(k) for k in ("model", "width", "epochs")},
        "budgets": budgets,
        "profile_seconds": seconds,
        "headline": headline,
        "machine": {**machine(), "torch_threads": args.threads},
        "note": ("timed on a 2-core machine shared with other jobs while it ran: latencies are medians of "
                 f"{args.repeats} repeats with float32 and the other variants alternated, so ratios are steadier "
                 "than absolute times; compare the single-layer rows of the two budgets to see the spread"),
        "profiles": profiles,
    }
    write_json(args.out / "summary.json", summary)
    write_run(args.out, __file__, argv)
    plot_layer_precision(profiles[0], args.out / "layer_precision.png", synthetic=synthetic)
    print(f"wrote {args.out / 'summary.json'}, layer_precision.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
