#!/usr/bin/env python
"""Mean MACs per sample at matched accuracy: FlexDNN plan vs SPINN-style equal-MAC exits.

Both exit sets sit on the same frozen, trained recipe backbone and train on the same images for
the same epochs with the same optimiser (FlexDNN: its searched exits, candidates after every layer
by default, ``--flex-positions``; SPINN: ``sdn`` heads at 15%, ..., 90% of the MACs), once per
training seed (``--seeds``; figures are medians over seeds, with their range). Both are then
evaluated by the same threshold sweep (one entropy confidence threshold at every exit, final-exit
fallback) on the validation and test splits:

* primary: MACs at matched test accuracy (backbone test accuracy minus ``--drops`` points), by
  linear interpolation along each method's Pareto front (accuracy vs mean MACs) on test;
* held-out: per target, the cheapest threshold reaching it on validation, applied to test;
* each method's lossless point (thresholds fitted on validation).

``--protocol v1`` reproduces the first, underpowered run (3,000 images, 2 epochs); ``--epochs 8`` the
first v2 run, whose exits were undertrained. About 11 min per seed on a 2-core CPU.

    python benchmarks/exits/flex_plan.py --out runs/bench_flex_plan
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, load_model, recipe_datamodule, resolve_out, write_run  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.exits import (  # noqa: E402
    DEFAULT_POSITIONS, ExitError, FlexDNNConfig, MultiExitNetwork, collect_logits, exit_profile, flexdnn,
    lossless_thresholds,
)
from nestflex.deploy.exits import get_confidence  # noqa: E402
from nestflex.exits.calibration import evaluate_thresholds  # noqa: E402
from nestflex.exits.front import threshold_front  # noqa: E402
from nestflex.exits.placement import parse_positions  # noqa: E402
from nestflex.exits.search import Candidate, train_candidates  # noqa: E402
from nestflex.graph import trace  # noqa: E402


#: the sweep: one threshold at every exit, fine enough that curves are resolved
GRID = tuple(round(0.01 * i, 2) for i in range(101))


def pareto(points: list[dict]) -> list[dict]:
    """Points no other point beats on both accuracy and MACs, by increasing MACs and accuracy."""
    out: list[dict] = []
    for r in sorted(points, key=lambda r: (r["mean_macs"], -r["accuracy"])):
        if not out or r["accuracy"] > out[-1]["accuracy"]:
            out.append(r)
    return out


def macs_at(points: list[dict], accuracy: float) -> float | None:
    """Mean MACs at ``accuracy`` by linear interpolation along the Pareto front (``None``: never reached)."""
    front = pareto(points)
    for a, b in zip(front, front[1:]):
        if a["accuracy"] <= accuracy <= b["accuracy"]:
            w = (accuracy - a["accuracy"]) / (b["accuracy"] - a["accuracy"])
            return a["mean_macs"] + w * (b["mean_macs"] - a["mean_macs"])
    if front and front[0]["accuracy"] >= accuracy:
        return front[0]["mean_macs"]
    return None


def _curves(net, val, test, lossless=None, max_drop=0.05):
    out = {}
    front = None
    for name, data in (("val", val), ("test", test)):
        logits, labels = collect_logits(net, data)
        if name == "val" and lossless is None:
            lossless = lossless_thresholds(logits, labels, net.exit_macs, net.backbone_macs, "entropy")["thresholds"]
        conf = torch.stack([get_confidence("entropy")(z) for z in logits])
        correct = logits.argmax(-1) == labels[None]
        if name == "val":  # per-exit thresholds fitted on validation only, then measured on test as they are
            front = threshold_front(conf, correct, net.exit_macs, net.backbone_macs, max_drop=max_drop)
        measured = [evaluate_thresholds(logits, labels, f["thresholds"], net.exit_macs, net.backbone_macs, "entropy",
                                        "final") for f in front]
        # the test points are the validation ones' thresholds, by index: stored once, under val
        front_points = [{**({"thresholds": f["thresholds"]} if name == "val" else {}), "accuracy": r["accuracy"],
                         "mean_macs": r["mean_macs"], "mean_macs_fraction": r["mean_macs_fraction"]}
                        for f, r in zip(front, measured)]
        prof = exit_profile(logits, labels, net.exit_macs, net.backbone_macs, thresholds=GRID, confidence="entropy",
                            fallback="final", at_thresholds=lossless)
        keep = ("threshold", "accuracy", "mean_macs", "mean_macs_fraction")
        out[name] = {"backbone_accuracy": prof["final_accuracy"], "sweep": [{k: r[k] for k in keep} for r in prof["sweep"]],
                     "lossless": {k: prof["at_thresholds"][k] for k in ("thresholds", "accuracy", "mean_macs",
                                                                       "mean_macs_fraction", "exit_rate")},
                     "front": front_points}
        # a bound, not an operating point: the same decisions if every exit head cost nothing
        free = [float(p.macs_before) for p in net.points] + [float(net.backbone_macs)]
        prof = exit_profile(logits, labels, free, net.backbone_macs, thresholds=GRID, confidence="entropy",
                            fallback="final")
        out[name]["sweep_free_heads"] = [{k: r[k] for k in keep} for r in prof["sweep"]]
    return out


def _one_seed(seed: int, model, train_set, val, test, args) -> dict:
    """Both exit families trained with ``seed`` (exit initialisation, shuffling, augmentation),
    their curves, and MACs at matched test accuracy."""
    train = DataLoader(train_set, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    # the pruned exits refit their classifiers on every training image the joint training saw
    fit_samples = 2000 if args.protocol == "v1" else args.train_samples
    flex = flexdnn(copy.deepcopy(model), train, val, FlexDNNConfig(
        locations=args.positions, epochs=args.epochs, fit_samples=fit_samples, seed=seed,
        base_width=args.flex_base_width, input_size=args.flex_input_size))
    flex_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    spinn = MultiExitNetwork(copy.deepcopy(model).eval(), DEFAULT_POSITIONS, head="sdn").eval()
    for prm in spinn.backbone.parameters():
        prm.requires_grad_(False)
    graph = trace(spinn.backbone)
    spinn_training = train_candidates(
        graph, [Candidate(pt, i, 0, h) for i, (pt, h) in enumerate(zip(spinn.points, spinn.exits))], train,
        args.epochs, FlexDNNConfig().lr, seed)
    spinn_seconds = time.perf_counter() - t0
    spinn_curves = _curves(spinn, val, test)
    if flex.network is not None:
        flex_curves = _curves(flex.network, val, test, lossless=flex.spec["thresholds"])
    else:  # the plan kept no exit: FlexDNN is the backbone alone (added as a point below)
        flex_curves = {sp: {"backbone_accuracy": c["backbone_accuracy"], "sweep": [],
                            "lossless": {"thresholds": [], "accuracy": c["backbone_accuracy"],
                                         "mean_macs": float(spinn.backbone_macs), "mean_macs_fraction": 1.0,
                                         "exit_rate": [1.0]}, "front": []}
                       for sp, c in spinn_curves.items()}

    backbone_macs = spinn.backbone_macs
    backbone_point = lambda split: {"threshold": None, "accuracy": flex_curves[split]["backbone_accuracy"],  # noqa: E731
                                    "mean_macs": float(backbone_macs), "mean_macs_fraction": 1.0}
    methods = {"flexdnn": flex_curves, "spinn": spinn_curves}
    # the backbone without exits is an operating point either method can fall back to
    points = {m: {sp: c[sp]["sweep"] + [c[sp]["lossless"], backbone_point(sp)] for sp in ("val", "test")}
              for m, c in methods.items()}
    base_test, base_val = flex_curves["test"]["backbone_accuracy"], flex_curves["val"]["backbone_accuracy"]
    matched = []
    for drop in args.drops:
        row = {"drop": drop, "test_accuracy": base_test - drop}
        for m in methods:
            row[f"{m}_macs"] = macs_at(points[m]["test"], base_test - drop)
        f, sp_ = row["flexdnn_macs"], row["spinn_macs"]
        row["flex_saving"] = (1 - f / sp_) if f is not None and sp_ is not None else None
        # how much cheaper heads could buy at most: FlexDNN's curve with free heads vs SPINN's as it is
        free = macs_at(methods["flexdnn"]["test"].get("sweep_free_heads", []) + [backbone_point("test")], base_test - drop)
        row["flexdnn_macs_free_heads"] = free
        row["flex_saving_free_heads"] = (1 - free / sp_) if free is not None and sp_ is not None else None
        # per-exit thresholds (each method's threshold_front, fitted on validation) added to the sweep
        for m, c in methods.items():
            row[f"{m}_macs_per_exit"] = macs_at(points[m]["test"] + c["test"]["front"], base_test - drop)
        f, sp_ = row["flexdnn_macs_per_exit"], row["spinn_macs_per_exit"]
        row["flex_saving_per_exit"] = (1 - f / sp_) if f is not None and sp_ is not None else None
        held_front = {}
        for m, c in methods.items():
            ok = [i for i, r in enumerate(c["val"]["front"]) if r["accuracy"] >= base_val - drop - 1e-12]
            if ok:
                i = min(ok, key=lambda i: c["val"]["front"][i]["mean_macs"])
                test_point = c["test"]["front"][i]
                held_front[m] = {"val_accuracy": c["val"]["front"][i]["accuracy"],
                                 **{k: test_point[k] for k in ("accuracy", "mean_macs", "mean_macs_fraction")}}
        row["val_chosen_per_exit"] = held_front
        held = {}
        for m, c in methods.items():
            if not c["val"]["sweep"]:  # no exits: the backbone alone
                held[m] = {"threshold": None, "val_accuracy": base_val, "accuracy": base_test,
                           "mean_macs": float(backbone_macs), "mean_macs_fraction": 1.0}
                continue
            ok = [i for i, r in enumerate(c["val"]["sweep"]) if r["accuracy"] >= base_val - drop - 1e-12]
            i = min(ok, key=lambda i: c["val"]["sweep"][i]["mean_macs"]) if ok else len(GRID) - 1
            held[m] = {"threshold": GRID[i], "val_accuracy": c["val"]["sweep"][i]["accuracy"],
                       **{k: c["test"]["sweep"][i][k] for k in ("accuracy", "mean_macs", "mean_macs_fraction")}}
        row["val_chosen"] = held
        matched.append(row)
        print(f"seed {seed}:", row, flush=True)
    return {
        "seed": seed,
        "backbone": {"test_accuracy": base_test, "val_accuracy": base_val, "mean_macs": backbone_macs},
        "flexdnn": {"kept_locations": flex.report["plan"]["kept_locations"], "spec": flex.spec,
                    "search": flex.report["search"], "plan": flex.report["plan"], "ranking_seconds": flex.report["seconds"],
                    "seconds": round(flex_seconds, 1), "curves": flex_curves},
        "spinn": {"exit_macs": spinn.exit_macs, "training": spinn_training,
                  "seconds": round(spinn_seconds, 1), "curves": spinn_curves},
        "matched_accuracy": matched,
        "lossless": {m: c["test"]["lossless"] for m, c in methods.items()},
        "points": points,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    add_out_args(p)
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--protocol", choices=["v1", "v2"], default="v2")
    p.add_argument("--train-samples", type=int, default=10000)
    p.add_argument("--val-samples", type=int, default=5000)
    p.add_argument("--test-samples", type=int, default=10000)
    # 32: FlexDNN's conv exits were still improving at 8 and 16 epochs (SPINN's pooled heads barely moved), so
    # fewer epochs measure undertrained exits, not the method (docs/flexdnn.md, Measured; 8: epochs8/ results)
    p.add_argument("--epochs", type=int, default=32,
                   help="training epochs of both exit families (v2; v1 forces 2)")
    p.add_argument("--flex-positions", default="all",
                   help="FlexDNN's candidate exit locations (comma list of MACs fractions / split point names, "
                        "or `all`: after every layer); SPINN keeps its six equal-MAC positions")
    p.add_argument("--flex-base-width", type=int, default=FlexDNNConfig().base_width,
                   help="filters of the first conv block of FlexDNN's over-parameterised exits (doubling per block)")
    p.add_argument("--flex-input-size", type=int, default=FlexDNNConfig().input_size,
                   help="FlexDNN exits average-pool a tapped map at least twice this size (smaller side) "
                        "down to about this size first")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="training seeds: both exit families are trained once per seed; savings are medians")
    p.add_argument("--drops", type=float, nargs="+", default=[0.005, 0.01, 0.02],
                   help="accuracy targets: backbone accuracy minus these")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    try:  # before minutes of loading: a bad list fails now
        args.positions = tuple(parse_positions(args.flex_positions))
    except ExitError as e:
        p.error(f"--flex-positions: {e}")
    if args.protocol == "v1":
        args.train_samples, args.val_samples, args.test_samples, args.epochs = 3000, 2000, 2000, 2
    model, config, source = load_model(args.checkpoint, args.out, args.data_dir)
    dm, message, synthetic = recipe_datamodule(config, args.data_dir)
    # the images are the same for every seed; a seed changes only how exits are initialised and trained
    gen = torch.Generator().manual_seed(0)
    sub = lambda ds, n: Subset(ds, torch.randperm(len(ds), generator=gen)[:n].tolist())  # noqa: E731
    train_set = sub(dm.train_dataset, args.train_samples)
    val = DataLoader(sub(dm.val_dataset, args.val_samples), batch_size=256)
    test = DataLoader(sub(dm.test_dataset, args.test_samples), batch_size=256)

    runs = [_one_seed(seed, model, train_set, val, test, args) for seed in args.seeds]
    points = [r.pop("points") for r in runs]  # for the plot; the curves are in the summary already
    first = runs[0]
    base_test = first["backbone"]["test_accuracy"]
    backbone_macs = first["backbone"]["mean_macs"]
    # per target: the median over seeds of each method's matched MACs and of the saving, and the spread
    matched = []
    for i, drop in enumerate(args.drops):
        rows = [r["matched_accuracy"][i] for r in runs]
        ok = [r for r in rows if r["flex_saving"] is not None]
        row = {"drop": drop, "test_accuracy": base_test - drop, "seeds": len(ok)}
        if ok:
            for key in ("flexdnn_macs", "spinn_macs", "flex_saving", "flex_saving_free_heads",
                        "flexdnn_macs_per_exit", "spinn_macs_per_exit", "flex_saving_per_exit"):
                vals = [r[key] for r in ok if r.get(key) is not None]
                row[key] = statistics.median(vals) if vals else None
            row["flex_saving_min"] = min(r["flex_saving"] for r in ok)
            row["flex_saving_max"] = max(r["flex_saving"] for r in ok)
        matched.append(row)
        print(row, flush=True)
    savings = [r["flex_saving"] for r in matched if "flex_saving" in r]
    summary = {
        "protocol": args.protocol, "model": source, "data": message, "synthetic": synthetic,
        "samples": {"train": args.train_samples, "val": args.val_samples, "test": args.test_samples},
        "epochs": args.epochs, "threshold_grid_step": 0.01, "seeds": list(args.seeds),
        "backbone": first["backbone"],
        "flexdnn_candidate_positions": args.flex_positions,
        "flexdnn_base_width": args.flex_base_width, "flexdnn_input_size": args.flex_input_size,
        "spinn_positions": list(DEFAULT_POSITIONS),
        "matched_accuracy": matched,
        "target_15pct": bool(savings) and min(savings) >= 0.15,
        "per_seed": runs,
        "machine": machine(),
    }
    out = args.out
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for m, label, style, color in (("spinn", "SPINN equal-MAC exits", "s", "C0"), ("flexdnn", "FlexDNN plan", "o", "C1")):
        for k, (run, pts) in enumerate(zip(runs, points)):
            front = pareto(pts[m]["test"])
            ax.plot([r["mean_macs"] / backbone_macs for r in front], [r["accuracy"] for r in front], "-", color=color,
                    lw=1.4 if k == 0 else 0.7, alpha=1.0 if k == 0 else 0.6,
                    label=f"{label} (test Pareto front, {len(runs)} seeds)" if k == 0 else None)
            ll = run["lossless"][m]
            ax.plot([ll["mean_macs_fraction"]], [ll["accuracy"]], style, color=color, ms=7 if k == 0 else 4,
                    label=f"{label} lossless (val thresholds)" if k == 0 else None)
    for r in matched:
        ax.axhline(r["test_accuracy"], color="grey", lw=0.6, ls=":")
    ax.plot([1.0], [base_test], "g^", label="backbone")
    ax.set_xlabel("mean MACs / backbone MACs")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(base_test - 0.06, base_test + 0.01)
    ax.set_title(f"exits on the recipe VGG, {args.train_samples} imgs x {args.epochs} ep"
                 + (" (synthetic)" if synthetic else ""))
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "flex_plan.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
