#!/usr/bin/env python
"""Roadmaps side by side: TRR vs L1 iterative pruning, same schedule and retraining budget.

Both start from the recipe's trained baseline and run the recipe's own ``prune`` stage (so the
benchmark measures exactly what users run), differing only in ``--prune-criterion``. Writes
``--out/summary.json`` (per criterion: every footprint, the seed's MACs fraction and accuracy)
and ``roadmaps.png`` (validation accuracy vs MACs).

    python benchmarks/pruning/pruning_roadmaps.py --out runs/bench_roadmaps
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, recipe, resolve_out, scratch_dir, write_run  # noqa: E402

from nestflex._io import read_json, write_json  # noqa: E402
from nestflex.pruning import Roadmap  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/vgg_cifar", help="recipe output directory holding baseline/")
    add_out_args(p)
    p.add_argument("--criteria", default="trr,l1")
    p.add_argument("--max-drop", default="1.0", help="accuracy points the seed may lose")
    p.add_argument("--max-steps", default="10")
    p.add_argument("--step", default="0.25")
    p.add_argument("--epochs-per-step", default="1")
    p.add_argument("--max-train-samples", default=None, help="retrain on a seeded subset (CPU budget)")
    args = p.parse_args(argv)
    run, out = Path(args.run), resolve_out(args, __file__)
    base_cfg = read_json(run / "baseline" / "config.json")
    recipe_ = recipe()
    results, roads = {}, []
    for crit in args.criteria.split(","):
        dest = scratch_dir(out) / crit  # a recipe run with checkpoints: under runs/ for a run in docs/results
        if not (dest / "baseline").exists():
            shutil.copytree(run / "baseline", dest / "baseline")
        argv_ = [
            "--stages", "prune", "--out", str(dest), "--model", base_cfg["model"], "--width", str(base_cfg["width"]),
            "--seed", str(base_cfg["seed"]), "--val-size", str(base_cfg["val_size"]), "--accelerator", "cpu",
            "--prune-criterion", crit, "--prune-max-drop", args.max_drop, "--prune-max-steps", args.max_steps,
            "--prune-step", args.step, "--prune-epochs-per-step", args.epochs_per_step,
        ]
        if base_cfg["data"]["synthetic"]:
            argv_ += ["--data", "synthetic", "--synthetic-train-size", str(base_cfg["data"]["train_size"]),
                      "--synthetic-test-size", str(base_cfg["data"]["test_size"])]
        if args.max_train_samples:
            argv_ += ["--max-train-samples", args.max_train_samples]
        summary = recipe_.main(argv_)
        road = Roadmap.load(dest / "prune" / "roadmap.json")
        roads.append(road)
        results[crit] = summary["pruning"] | {
            "footprints": [{"step": f.step, "accuracy": f.accuracy, "macs": f.macs, "params": f.params} for f in road.footprints],
            "rejected": [{"accuracy": r.accuracy, "macs": r.macs} for r in road.rejected],
            "start_accuracy": road.start_accuracy,
        }
    recipe._plot_roadmaps(roads, out / "roadmaps.png", synthetic=base_cfg["data"]["synthetic"])
    summary = {
        "what": "iterative pruning from the same baseline; accuracies are on the validation split, 'accuracy' of the seed on test",
        "synthetic_data": base_cfg["data"]["synthetic"],
        "model": {"name": base_cfg["model"], "width": base_cfg["width"]},
        "schedule": {"max_drop_points": float(args.max_drop), "max_steps": int(args.max_steps), "step": float(args.step),
                     "epochs_per_step": int(args.epochs_per_step), "max_train_samples": args.max_train_samples},
        "criteria": results,
        "torch_threads": torch.get_num_threads(),
    }
    if {"trr", "l1"} <= set(results):
        t, l = results["trr"], results["l1"]
        summary["targets"] = {
            "trr_seed_macs_fraction": t["macs_fraction"], "trr_seed_at_most_35pct": t["macs_fraction"] <= 0.35,
            "trr_seed_fewer_macs_than_l1": t["macs"] < l["macs"], "l1_seed_macs_fraction": l["macs_fraction"],
        }
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    print(f"wrote {out / 'summary.json'}: {summary.get('targets')}")
    return summary


if __name__ == "__main__":
    main()
