#!/usr/bin/env python
"""Freeze-&-grow vs independent footprints vs from-scratch training, at each level's architecture.

    python benchmarks/capacity/freeze_grow.py --out runs/bench_freeze_grow          # small, CPU-feasible
    python benchmarks/capacity/freeze_grow.py --out DIR --recipe-args "--width 0.25 --model vgg16"

Runs the recipe's baseline, prune and grow stages (reused when ``recipe_run`` already holds them:
under ``runs/`` for a run in ``docs/results``, else ``DIR/recipe_run``), then for every level of the multi-capacity model measures on the test split:

* the level itself (from the grow stage's profile);
* the *independent* footprint of the roadmap at the same step (NestDNN's "independent model
  variants": pruned and retrained on its own), loaded from ``prune/footprints``;
* the same architecture trained *from scratch* for ``--scratch-epochs`` epochs (default: the
  baseline's budget). The paper's ImageNet-pretrained baselines are not available offline.

Writes ``DIR/summary.json`` (keys: ``levels`` rows with ``accuracy``, ``independent_accuracy``,
``scratch_accuracy``, ``macs``; ``memory``; ``switching``; ``targets``) and
``DIR/accuracy_vs_macs.png``, ``DIR/switching.png``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, recipe, resolve_out, scratch_dir, write_run  # noqa: E402

from nestflex._io import read_json, write_json  # noqa: E402

SMALL = ("--data synthetic --model vgg11 --width 0.25 --epochs 3 --synthetic-train-size 6000 "
         "--synthetic-test-size 2000 --val-size 1000 --prune-criterion l1 --prune-max-drop 3 --prune-step 0.3 "
         "--prune-max-steps 5 --grow-levels 5 --grow-epochs-per-level 1 --grow-latency-repeats 5")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_out_args(p)
    p.add_argument("--recipe-args", default=SMALL, help="recipe flags (baseline, prune and grow stages)")
    p.add_argument("--scratch-epochs", type=int, default=None, help="from-scratch budget (default: baseline epochs)")
    args = p.parse_args(argv)
    out = resolve_out(args, __file__)
    import pytorch_lightning as pl

    from nestflex.pruning import Roadmap, accuracy, apply_footprint
    from nestflex.capacity import read_state
    from nestflex.training import ImageClassifier

    run = scratch_dir(out) / "recipe_run"
    recipe_ = recipe()
    flags = [*shlex.split(args.recipe_args), "--out", str(run), "--stages", "baseline,prune,grow"]
    summary = recipe_.main(flags)
    rargs = recipe_.parse_args(flags)
    from nestflex.data import resolve_data

    dm, message = resolve_data(rargs.data, rargs.data_dir, batch_size=rargs.batch_size, num_workers=0,
                               max_train_samples=rargs.max_train_samples, val_size=rargs.val_size, seed=rargs.seed,
                               train_size=rargs.synthetic_train_size, test_size=rargs.synthetic_test_size)
    dm.setup("test")
    road = Roadmap.load(run / "prune" / "roadmap.json")
    grow = summary["grow"]
    base_hp = dict(ImageClassifier.load_from_checkpoint(run / "baseline" / "model.ckpt", map_location="cpu",
                                                        weights_only=True).hparams)
    scratch_epochs = args.scratch_epochs or summary["baseline"]["epochs"]
    rows = []
    for level, step in zip(grow["levels"], grow["steps"]):
        fresh = ImageClassifier(**base_hp)
        indep = apply_footprint(fresh, road, step)
        indep.load_state_dict(read_state(run / "prune" / road.footprint(step).checkpoint, indep))
        indep_acc = accuracy(indep, dm.test_dataloader())
        pl.seed_everything(rargs.seed, workers=True)
        # a freshly initialised model pruned to the level's architecture: trained from scratch
        scratch = apply_footprint(ImageClassifier(**(base_hp | {"max_epochs": scratch_epochs})), road, step)
        trainer = pl.Trainer(max_epochs=scratch_epochs, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                             default_root_dir=scratch_dir(out) / "scratch", num_sanity_val_steps=0, limit_val_batches=0)
        trainer.fit(scratch, datamodule=dm)
        scratch_acc = accuracy(scratch, dm.test_dataloader())
        rows.append({**level, "step": step, "independent_accuracy": round(indep_acc, 4),
                     "scratch_accuracy": round(scratch_acc, 4),
                     "minus_independent_points": round(100 * (level["accuracy"] - indep_acc), 2),
                     "minus_scratch_points": round(100 * (level["accuracy"] - scratch_acc), 2)})
        print(f"level {level['level']}: nested {level['accuracy']:.4f}  independent {indep_acc:.4f}  scratch {scratch_acc:.4f}")
    profile = read_json(run / "grow" / "profile.json")
    mem = profile["memory"]
    within = sum(abs(r["minus_independent_points"]) <= 1.0 or r["minus_independent_points"] > 0 for r in rows)
    above = sum(r["minus_scratch_points"] > 0 for r in rows)
    result = {
        "data": {"source": message, "synthetic": bool(dm.synthetic)}, "recipe_args": flags,
        "scratch_epochs": scratch_epochs, "grow_epochs_per_level": grow["epochs_per_level"],
        "levels": rows, "memory": mem, "switching": profile["switching"], "machine": profile["machine"],
        "targets": {
            "multi_capacity_le_1.05x_largest": mem["ratio_to_largest"] <= 1.05,
            "levels_within_1pt_of_independent": f"{within}/{len(rows)}",
            "levels_above_scratch": f"{above}/{len(rows)}",
            "mean_points_over_scratch": round(sum(r["minus_scratch_points"] for r in rows) / len(rows), 2),
        },
        "note": "the paper's ImageNet-pretrained baselines are not available offline; the from-scratch baseline "
                "trains the same architecture for the same epoch budget as the baseline stage",
    }
    write_json(out / "summary.json", result)
    write_run(out, __file__, argv)
    _plot(result, out, bool(dm.synthetic))
    print(f"summary: {out / 'summary.json'}  targets: {result['targets']}")
    return result


def _plot(result: dict, out: Path, synthetic: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["levels"]
    macs = [r["macs"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(macs, [r["accuracy"] for r in rows], "o-", label="multi-capacity levels (freeze-&-grow)")
    ax.plot(macs, [r["independent_accuracy"] for r in rows], "s--", label="independent footprints (roadmap)")
    ax.plot(macs, [r["scratch_accuracy"] for r in rows], "^:", label=f"from scratch ({result['scratch_epochs']} epochs)")
    ax.set_xlabel("MACs per image (millions)")
    ax.set_ylabel("test top-1")
    ax.set_title("accuracy vs MACs per level" + (" (synthetic data)" if synthetic else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_macs.png", dpi=120)
    plt.close(fig)

    sw = result["switching"]
    K = max(r["to"] for r in sw) + 1
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for ax, key, title in ((axes[0], "page_in", "page-in MB (nested / independent)"),
                           (axes[1], "nested_ms", "switch ms (nested / independent)")):
        grid = torch.full((K, K), float("nan"))
        text = {}
        for r in sw:
            nested = r[key] / 1e6 if key == "page_in" else r[key]
            indep = r["independent_page_in"] / 1e6 if key == "page_in" else r["independent_ms"]
            grid[r["from"], r["to"]] = nested / indep
            text[(r["from"], r["to"])] = f"{nested:.2f}\n/{indep:.2f}"
        ax.imshow(grid.numpy(), cmap="viridis_r", vmin=0, vmax=1)
        for (a, b), t in text.items():
            ax.text(b, a, t, ha="center", va="center", fontsize=6, color="w")
        ax.set_xlabel("to level")
        ax.set_ylabel("from level")
        ax.set_title(title, fontsize=8)
    fig.suptitle("switching levels" + (" (synthetic data)" if synthetic else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "switching.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
