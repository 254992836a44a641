#!/usr/bin/env python
"""Ranking quality side by side: sensitivity profiles of TRR, L1, L2 and random on one model.

Every prunable layer of the trained recipe model loses 10..90% of its filters, one layer at a
time, lowest-ranked first, with no retraining (NestDNN Fig. 3.3); accuracy on a fixed slice of
the validation split. Writes ``--out/summary.json`` (per criterion and layer: accuracy at 50% and
90% removed, the full curves) and ``sensitivity.png``.

    python recipes/vgg_cifar.py --stages baseline        # the model this measures
    python benchmarks/pruning/pruning_sensitivity.py --out runs/bench_sensitivity
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, load_model, machine, recipe_datamodule, resolve_out, write_run  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex.graph import trace  # noqa: E402
from nestflex.pruning import accuracy, get_importance, plot_sensitivity, sensitivity_profile  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="recipe baseline checkpoint (default: runs/vgg_cifar/baseline/model.ckpt, else a small one is trained)")
    p.add_argument("--data-dir", default="data")
    add_out_args(p)
    p.add_argument("--samples", type=int, default=500, help="validation samples per accuracy point")
    p.add_argument("--triplets", type=int, default=1000)
    p.add_argument("--criteria", default="trr,l1,l2,random")
    p.add_argument("--fractions", default="0.1,0.3,0.5,0.7,0.9", help="fractions of each layer's filters removed")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    model, config, source = load_model(args.checkpoint, args.out, args.data_dir)
    dm, _, synthetic = recipe_datamodule(config, args.data_dir, batch_size=256)
    graph = trace(model)
    val = DataLoader(Subset(dm.val_dataset, range(min(args.samples, len(dm.val_dataset)))), batch_size=256)
    profiles, rank_seconds = [], {}
    for name in args.criteria.split(","):
        kwargs = {"triplets": args.triplets} if name == "trr" else {}
        crit = get_importance(name, **kwargs)
        start = time.perf_counter()
        scores = crit(model, graph, data=dm.train_dataset if crit.needs_data else None)
        rank_seconds[name] = round(time.perf_counter() - start, 3)
        fractions = [float(f) for f in args.fractions.split(",")]
        profiles.append(sensitivity_profile(graph, scores, lambda m: accuracy(m, val), fractions, criterion=name))
        print(f"{name}: ranked in {rank_seconds[name]} s, profiled", flush=True)
    fr = profiles[0]["fractions"]
    i50, i90 = fr.index(0.5), fr.index(0.9)
    table = {
        prof["criterion"]: {r["group"]: {"at_50": r["accuracy"][i50], "at_90": r["accuracy"][i90]} for r in prof["layers"]}
        for prof in profiles
    }
    layers = [r["group"] for r in profiles[0]["layers"]]
    wins = {}
    if "trr" in table:
        for other in table:
            if other != "trr":
                wins[f"trr_vs_{other}"] = sum(
                    table["trr"][g][k] >= table[other][g][k] for g in layers for k in ("at_50", "at_90")
                )
    summary = {
        "what": "accuracy with one layer's lowest-ranked filters removed, no retraining",
        "model": {"name": config["model"], "width": config["width"], "source": source},
        "synthetic_data": synthetic,
        "samples": len(val.dataset),
        "baseline_accuracy": profiles[0]["baseline_accuracy"],
        "ranking_seconds": rank_seconds,
        "points_compared": 2 * len(layers),
        "trr_at_least_as_good": wins,
        "per_layer": table,
        "profiles": profiles,
        "machine": machine(),
    }
    out = args.out
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    plot_sensitivity(profiles, out / "sensitivity.png",
                     title="per-layer sensitivity" + (" (synthetic data)" if synthetic else ""))
    print(f"wrote {out / 'summary.json'}; TRR at least as good at 50%/90% points: {wins}")
    return summary


if __name__ == "__main__":
    main()
