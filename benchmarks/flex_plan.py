#!/usr/bin/env python
"""Mean MACs per sample: FlexDNN plan vs SPINN-style equal-MAC exits vs the backbone.

Both exit sets sit on the same frozen, trained recipe backbone and train on the same subset for
the same epochs (FlexDNN: its searched exits; SPINN: ``sdn`` heads at 15%, ..., 90% of the MACs).
Thresholds are chosen on the validation split (lossless, FlexDNN's entropy confidence, final-exit
fallback for both) and everything is measured on the test split. "Equal accuracy": from the
SPINN test sweep, the cheapest point at least as accurate as the FlexDNN plan on test.

    python benchmarks/flex_plan.py --out runs/bench_flex_plan
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _recipe_model import load_model, recipe_datamodule  # noqa: E402

from nestflex._io import write_json  # noqa: E402
from nestflex._machine import machine  # noqa: E402
from nestflex.exits import (  # noqa: E402
    DEFAULT_POSITIONS, FlexDNNConfig, MultiExitNetwork, collect_logits, evaluate_flex, exit_profile, flexdnn,
    lossless_thresholds,
)
from nestflex.exits.search import Candidate, train_candidates  # noqa: E402
from nestflex.graph import trace  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench_flex_plan")
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--data-dir", default="data")
    p.add_argument("--train-samples", type=int, default=5000)
    p.add_argument("--val-samples", type=int, default=2000)
    p.add_argument("--test-samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    model, config, source = load_model(args.checkpoint, Path(args.out), args.data_dir)
    dm, message, synthetic = recipe_datamodule(config, args.data_dir)
    gen = torch.Generator().manual_seed(0)
    sub = lambda ds, n: Subset(ds, torch.randperm(len(ds), generator=gen)[:n].tolist())  # noqa: E731
    train = DataLoader(sub(dm.train_dataset, args.train_samples), batch_size=128, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(sub(dm.val_dataset, args.val_samples), batch_size=256)
    test = DataLoader(sub(dm.test_dataset, args.test_samples), batch_size=256)

    flex = flexdnn(copy.deepcopy(model), train, val, FlexDNNConfig(epochs=args.epochs))
    flex_test = evaluate_flex(flex.network, flex.spec, test)

    torch.manual_seed(0)
    spinn = MultiExitNetwork(copy.deepcopy(model).eval(), DEFAULT_POSITIONS, head="sdn").eval()
    for prm in spinn.backbone.parameters():
        prm.requires_grad_(False)
    graph = trace(spinn.backbone)
    train_candidates(graph, [Candidate(pt, i, 0, h) for i, (pt, h) in enumerate(zip(spinn.points, spinn.exits))],
                     train, args.epochs, 3e-3)
    vl, vy = collect_logits(spinn, val)
    ll = lossless_thresholds(vl, vy, spinn.exit_macs, spinn.backbone_macs, "entropy")
    tl, ty = collect_logits(spinn, test)
    sp = exit_profile(tl, ty, spinn.exit_macs, spinn.backbone_macs, confidence="entropy", fallback="final",
                      at_thresholds=ll["thresholds"])
    target = flex_test["accuracy"]
    same = [r for r in sp["sweep"] + [sp["at_thresholds"]] if r["accuracy"] >= target - 1e-12]
    spinn_equal = min(same, key=lambda r: r["mean_macs"]) if same else None
    backbone_macs = spinn.backbone_macs
    summary = {
        "model": source, "data": message, "synthetic": synthetic,
        "samples": {"train": args.train_samples, "val": args.val_samples, "test": args.test_samples},
        "epochs": args.epochs, "backbone": {"accuracy": flex_test["final_accuracy"], "mean_macs": backbone_macs},
        "flexdnn": {"kept_locations": flex.report["plan"]["kept_locations"], "thresholds": flex.spec["thresholds"],
                    "accuracy": flex_test["accuracy"], "mean_macs": flex_test["mean_macs"],
                    "mean_macs_fraction": flex_test["mean_macs_fraction"], "seconds": flex.report["seconds"],
                    "search": flex.report["search"], "plan": flex.report["plan"]},
        "spinn_lossless": {"accuracy": sp["at_thresholds"]["accuracy"], "mean_macs": sp["at_thresholds"]["mean_macs"],
                           "mean_macs_fraction": sp["at_thresholds"]["mean_macs_fraction"]},
        "spinn_at_flex_accuracy": spinn_equal,
        "flex_macs_saving_vs_spinn_lossless": 1 - flex_test["mean_macs"] / sp["at_thresholds"]["mean_macs"],
        "flex_macs_saving_vs_spinn_equal_accuracy": (1 - flex_test["mean_macs"] / spinn_equal["mean_macs"]) if spinn_equal else None,
        "target_15pct": None,
        "machine": machine(),
    }
    s = summary["flex_macs_saving_vs_spinn_equal_accuracy"]
    summary["target_15pct"] = bool(s is not None and s >= 0.15)
    out = Path(args.out)
    write_json(out / "summary.json", summary)
    print({k: summary[k] for k in ("backbone", "spinn_lossless", "flex_macs_saving_vs_spinn_lossless",
                                   "flex_macs_saving_vs_spinn_equal_accuracy")}, summary["flexdnn"]["accuracy"],
          summary["flexdnn"]["mean_macs"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot([r["mean_macs"] / backbone_macs for r in sp["sweep"]], [r["accuracy"] for r in sp["sweep"]], ".-",
            label="SPINN equal-MAC exits (sweep)")
    ax.plot([r["mean_macs"] / backbone_macs for r in flex_test["sweep"]], [r["accuracy"] for r in flex_test["sweep"]],
            ".-", label="FlexDNN plan (sweep)")
    ax.plot([flex_test["mean_macs_fraction"]], [flex_test["accuracy"]], "r*", ms=12, label="FlexDNN lossless")
    ax.plot([sp["at_thresholds"]["mean_macs_fraction"]], [sp["at_thresholds"]["accuracy"]], "ks", label="SPINN lossless")
    ax.plot([1.0], [flex_test["final_accuracy"]], "g^", label="backbone")
    ax.set_xlabel("mean MACs / backbone MACs")
    ax.set_ylabel("test accuracy")
    ax.set_title("exits on the recipe VGG" + (" (synthetic)" if synthetic else ""))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "flex_plan.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
