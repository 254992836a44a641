#!/usr/bin/env python
"""Minimum filters per layer for an exit to match the all-filter exit: collective vs L2 ranking.

For every conv layer of the recipe's trained model, with one protocol for both criteria:

* **splits** (three, disjoint): the exits (closed-form ridge probes on 2x2-pooled responses)
  are fitted on ``--fit-samples`` un-augmented training images; the collective ranking scores
  its candidates on the recipe's validation split; the minimum counts are read on the TEST
  split (``--test-samples``), which neither ranking nor any probe ever saw. L2 is the per-filter
  conv weight norm (Li et al. 2016), as in the paper.
* **tolerance**: per layer, ``--se-multiple`` binomial standard errors of the all-filter exit's
  test accuracy (the reference is the same exit for both criteria, so the tolerance is too);
  ``--tolerance`` overrides it with a fixed value.
* **minimum count** (``rule="first"``): the smallest ``k`` whose test accuracy is within the
  tolerance of the all-filter exit's. The literal rule (every larger count must match too,
  ``rule="all_larger"``) is also reported, on the same curves.

Redundant filters = N - minimum. The old protocol (``--protocol v1``: 1000 samples per split,
augmented fit split, 0.005 tolerance, literal rule) is kept so its figures can be reproduced.

    python benchmarks/exits/flex_min_filters.py --out runs/bench_flex_min_filters
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, load_model, recipe_datamodule, resolve_out, write_run  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.graph import trace  # noqa: E402
from nestflex.pruning import collective_ranking, exit_accuracy_curve, get_importance, min_filters, pooled_responses  # noqa: E402


def _paired_se(correct, k: int) -> float:
    """Standard error of ``acc(k) - acc(N)`` on the same samples (paired: discordant pairs only)."""
    d = correct[k - 1].double() - correct[-1].double()
    return float(d.std(unbiased=True) / math.sqrt(d.numel()))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    add_out_args(p)
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--protocol", choices=["v1", "v2"], default="v2", help="v1: the first, noisy protocol")
    p.add_argument("--fit-samples", type=int, default=8000, help="training images the probes are fitted on")
    p.add_argument("--val-samples", type=int, default=5000, help="validation images collective ranking scores on")
    p.add_argument("--test-samples", type=int, default=10000, help="test images minimum counts are read on")
    p.add_argument("--se-multiple", type=float, default=2.0, help="tolerance = this many SEs of the reference")
    p.add_argument("--tolerance", type=float, default=None, help="fixed tolerance instead of the SE rule")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    v1 = args.protocol == "v1"
    if v1:
        args.fit_samples = args.val_samples = args.test_samples = 1000
        args.tolerance = 0.005 if args.tolerance is None else args.tolerance
    model, config, source = load_model(args.checkpoint, args.out, args.data_dir)
    dm, message, synthetic = recipe_datamodule(config, args.data_dir)
    graph = trace(model)
    groups = [g for g in graph.prunable_groups if len(graph.gm.get_submodule(g.producers[0]).weight.shape) == 4]
    if v1:
        fit_data = DataLoader(dm.train_dataset, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))
    else:
        # the un-augmented view of the training split (the validation Subset's parent): random
        # crops/flips would make the fit features noisier than the test features they predict
        gen = torch.Generator().manual_seed(0)
        idx = dm.train_indices[torch.randperm(len(dm.train_indices), generator=gen)[: args.fit_samples]]
        fit_data = DataLoader(Subset(dm.val_dataset.dataset, idx.tolist()), batch_size=256)
    fx, fy = pooled_responses(model, graph, groups, fit_data, name="fit", pool=2, max_samples=args.fit_samples)
    vx, vy = pooled_responses(model, graph, groups, dm.val_dataloader(), name="validation", pool=2,
                              max_samples=args.val_samples)
    tx, ty = pooled_responses(model, graph, groups, dm.test_dataloader(), name="test", pool=2,
                              max_samples=args.test_samples)
    l2 = get_importance("l2")(model, graph, groups)
    rows = []
    for g in groups:
        col = collective_ranking(fx[g.id], fy, vx[g.id], vy, stop_fraction=0.0)
        l2_order = torch.argsort(l2[g.id], descending=True, stable=True)
        c_curve, c_ok = exit_accuracy_curve(fx[g.id], fy, tx[g.id], ty, col.order, return_correct=True)
        l_curve, l_ok = exit_accuracy_curve(fx[g.id], fy, tx[g.id], ty, l2_order, return_correct=True)
        ref = float(c_curve[-1])  # the same all-filter exit under both orders
        se = math.sqrt(ref * (1 - ref) / ty.numel())
        tol = args.tolerance if args.tolerance is not None else args.se_multiple * se
        rule = "all_larger" if v1 else "first"
        mc, ml = min_filters(c_curve, tol, rule), min_filters(l_curve, tol, rule)
        row = {"layer": g.name, "filters": g.width, "all_filters_accuracy": ref, "reference_se": se,
               "tolerance": tol, "min_filters": {"collective": mc, "l2": ml},
               "redundant": {"collective": g.width - mc, "l2": g.width - ml},
               "paired_se_at_min": {"collective": _paired_se(c_ok, mc), "l2": _paired_se(l_ok, ml)},
               "curve": {"collective": c_curve.tolist(), "l2": l_curve.tolist()}}
        if not v1:
            lc, ll = min_filters(c_curve, tol, "all_larger"), min_filters(l_curve, tol, "all_larger")
            row["min_filters_all_larger"] = {"collective": lc, "l2": ll}
        rows.append(row)
        print(g.name, g.width, f"tol {tol:.4f}", "collective", mc, "l2", ml, flush=True)

    def total(key: str) -> dict:
        c = sum(r["filters"] - r[key]["collective"] for r in rows)
        l_ = sum(r["filters"] - r[key]["l2"] for r in rows)
        return {"collective": c, "l2": l_, "more_redundant_found": (c - l_) / l_ if l_ else None}

    red = total("min_filters")
    summary = {"model": source, "data": message, "synthetic": synthetic, "protocol": args.protocol,
               "samples": {"fit": int(fy.numel()), "validation": int(vy.numel()), "test": int(ty.numel())},
               "tolerance": args.tolerance if args.tolerance is not None else f"{args.se_multiple} x SE",
               "rule": "all_larger" if v1 else "first", "layers": rows,
               "redundant_total": {"collective": red["collective"], "l2": red["l2"]},
               "more_redundant_found": red["more_redundant_found"],
               "evaluation": "exits refitted on the fit split, minimum counts measured on the test split",
               "machine": machine()}
    if not v1:
        summary["all_larger_rule"] = total("min_filters_all_larger")
    out = args.out
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["min_filters"]["collective"] / r["filters"] for r in rows], 0.4, label="collective")
    ax.bar([x + 0.2 for x in xs], [r["min_filters"]["l2"] / r["filters"] for r in rows], 0.4, label="L2")
    ax.set_xticks(list(xs), [r["layer"].split(".")[-1] for r in rows], rotation=45)
    ax.set_ylabel("min filters / filters")
    ax.set_title(f"protocol {args.protocol}" + (" (synthetic)" if synthetic else ""))
    ax.legend()
    for r in rows[6:10]:  # the wide layers, where the two rankings differ most
        k = range(1, r["filters"] + 1)
        line, = bx.plot(k, r["curve"]["collective"], lw=1, label=f"{r['layer'].split('.')[-1]} collective")
        bx.plot(k, r["curve"]["l2"], lw=1, ls="--", color=line.get_color(), label=f"{r['layer'].split('.')[-1]} L2")
    bx.set_xlabel("top-k filters")
    bx.set_ylabel("exit test accuracy")
    bx.set_ylim(0.5, None)
    bx.legend(fontsize=6, ncol=2)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "flex_min_filters.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
