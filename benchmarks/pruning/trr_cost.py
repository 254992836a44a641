#!/usr/bin/env python
"""What TRR ranking costs: all filters of VGG-16 with 1,000 triplets vs L1 vs one forward pass.

The forward pass runs over the same 3,000 images at the same batch size, with the same data
loading, so the ratio isolates what TRR adds (the interpreter, the residual reduction). Weights
are an untrained VGG-16: cost does not depend on them. Medians of ``--repeats`` after one
warm-up, TRR and the forward pass alternated within each repeat so a change in machine load
hits both alike.

    python benchmarks/pruning/trr_cost.py --out runs/bench_trr_cost
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.data import SyntheticShapes
from nestflex.deploy.timing import alternating_median_s
from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import TRR, get_importance, sample_triplets

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    add_out_args(p)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--triplets", type=int, default=1000)
    p.add_argument("--batch", type=int, default=128, help="triplets per batch (3x images)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: keep torch's setting)")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model("vgg16", width=args.width).eval()
    graph = trace(model)
    data = SyntheticShapes("train", size=5000, seed=0)
    trr = TRR(triplets=args.triplets, batch_size=args.batch)
    order = sample_triplets(data.targets, args.triplets, 0).t().flatten()  # the same 3,000 images

    def forward():
        with torch.no_grad():
            for start in range(0, order.numel(), 3 * args.batch):
                idx = order[start : start + 3 * args.batch]
                model(torch.stack([data[int(i)][0] for i in idx]))

    t = alternating_median_s({"trr": lambda: trr(model, graph, data=data), "forward": forward,
                             "l1": lambda: get_importance("l1")(model, graph)}, args.repeats)
    t_trr, t_fwd, t_l1 = t["trr"], t["forward"], t["l1"]
    summary = {
        "model": {"name": "vgg16", "width": args.width, "macs": graph.macs(), "filters": sum(g.width for g in graph.prunable_groups)},
        "triplets": args.triplets,
        "images": int(order.numel()),
        "seconds": {"trr": round(t_trr, 3), "forward": round(t_fwd, 3), "l1": round(t_l1, 5)},
        "trr_over_forward": round(t_trr / t_fwd, 3),
        "trr_over_l1": round(t_trr / t_l1, 1),
        "target_trr_within_1.5x_forward": t_trr <= 1.5 * t_fwd,
        "repeats": args.repeats,
        "machine": machine(),
        "note": "medians after one warm-up, TRR and forward alternated in each repeat; the 2-core machine was "
                "shared with other jobs, so absolute times are noisy and the ratio is the figure to read",
    }
    write_json(args.out / "summary.json", summary)
    write_run(args.out, __file__, argv)
    _plot(summary, args.out / "trr_cost.png")
    print(summary)
    return summary


def _plot(summary: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary["seconds"]
    fig, ax = plt.subplots(figsize=(5, 2.6))
    names = ["L1 ranking", f"forward, {summary['images']} images", f"TRR, {summary['triplets']} triplets"]
    ax.barh(names, [s["l1"], s["forward"], s["trr"]], color=["#999", "#4a7", "#37c"])
    for i, v in enumerate([s["l1"], s["forward"], s["trr"]]):
        ax.text(v, i, f" {v:.3g} s", va="center", fontsize=8)
    ax.set_xlabel("seconds (median)")
    ax.set_title(f"ranking all filters of VGG-16 (width {summary['model']['width']}), CPU", fontsize=9)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
