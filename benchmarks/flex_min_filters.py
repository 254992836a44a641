#!/usr/bin/env python
"""Minimum filters per layer for an exit to match the all-filter exit: collective vs L2 ranking.

For every conv layer of the recipe's trained model: rank its filters by collective importance
(fit on training samples, candidates scored on the validation split) and by L2 norm; then, on the
TEST split (which neither ranking saw), refit the closed-form exit on the top ``k`` filters of
each ranking for every ``k`` and find the fewest filters within ``--tolerance`` of the all-filter
exit. Redundant filters = N - minimum.

    python benchmarks/flex_min_filters.py --out runs/bench_flex_min_filters
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _recipe_model import load_model, recipe_datamodule  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.graph import trace  # noqa: E402
from nestflex.pruning import collective_ranking, exit_accuracy_curve, get_importance, min_filters, pooled_responses  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench_flex_min_filters")
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--samples", type=int, default=1000, help="samples per split (fit, validation, test)")
    p.add_argument("--tolerance", type=float, default=0.005, help="accuracy an exit may lose and still match")
    args = p.parse_args(argv)
    model, config, source = load_model(args.checkpoint, Path(args.out), args.data_dir)
    dm, message, synthetic = recipe_datamodule(config, args.data_dir)
    graph = trace(model)
    groups = [g for g in graph.prunable_groups if len(graph.gm.get_submodule(g.producers[0]).weight.shape) == 4]
    kw = {"pool": 2, "max_samples": args.samples}
    from torch.utils.data import DataLoader
    fit_loader = DataLoader(dm.train_dataset, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))
    fx, fy = pooled_responses(model, graph, groups, fit_loader, name="fit", **kw)
    vx, vy = pooled_responses(model, graph, groups, dm.val_dataloader(), name="validation", **kw)
    tx, ty = pooled_responses(model, graph, groups, dm.test_dataloader(), name="test", **kw)
    l2 = get_importance("l2")(model, graph, groups)
    rows = []
    for g in groups:
        col = collective_ranking(fx[g.id], fy, vx[g.id], vy, stop_fraction=0.0)
        l2_order = torch.argsort(l2[g.id], descending=True, stable=True)
        c_curve = exit_accuracy_curve(fx[g.id], fy, tx[g.id], ty, col.order)
        l_curve = exit_accuracy_curve(fx[g.id], fy, tx[g.id], ty, l2_order)
        mc, ml = min_filters(c_curve, args.tolerance), min_filters(l_curve, args.tolerance)
        rows.append({"layer": g.name, "filters": g.width, "all_filters_accuracy": float(c_curve[-1]),
                     "min_filters": {"collective": mc, "l2": ml},
                     "redundant": {"collective": g.width - mc, "l2": g.width - ml},
                     "curve": {"collective": c_curve.tolist(), "l2": l_curve.tolist()}})
        print(g.name, g.width, "collective", mc, "l2", ml)
    red_c = sum(r["redundant"]["collective"] for r in rows)
    red_l = sum(r["redundant"]["l2"] for r in rows)
    summary = {"model": source, "data": message, "synthetic": synthetic, "samples_per_split": args.samples,
               "tolerance": args.tolerance, "layers": rows,
               "redundant_total": {"collective": red_c, "l2": red_l},
               "more_redundant_found": (red_c - red_l) / red_l if red_l else None,
               "evaluation": "exits refitted on the fit split, minimum counts measured on the test split",
               "machine": machine()}
    out = Path(args.out)
    write_json(out / "summary.json", summary)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["min_filters"]["collective"] / r["filters"] for r in rows], 0.4, label="collective")
    ax.bar([x + 0.2 for x in xs], [r["min_filters"]["l2"] / r["filters"] for r in rows], 0.4, label="L2")
    ax.set_xticks(list(xs), [r["layer"].split(".")[-1] for r in rows], rotation=45)
    ax.set_ylabel("min filters / filters")
    ax.set_title("filters an exit needs to match all filters" + (" (synthetic)" if synthetic else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "flex_min_filters.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
