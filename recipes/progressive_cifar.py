#!/usr/bin/env python
"""Progressive inference network (SPINN): a ResNet-56 with six early exits, trained jointly.

    python recipes/progressive_cifar.py                  # defaults: synthetic data if no CIFAR-10
    python recipes/progressive_cifar.py --data cifar10 --width 1 --max-train-samples 0 --epochs 160

SPINN's recipe (METHODS.md section 3): exits at 15%, 30%, ..., 90% of the backbone's MACs, all with
the same head, trained jointly from scratch with the overthinking-aware loss of Shallow-Deep
Networks (tau_i ramps from 0.01 to the exit's position; final exit weight 1). SPINN uses
MSDNet-style heads (``--head msdnet``); the default here is SDN's pooled linear head, which did
better on the narrow CPU-sized network (docs/exits.md has both runs). Stages:

    train   joint training (Lightning: progress bar, CSV logs, rolling checkpoint, resumable)
    exits   calibration on the validation split (accuracy and exit rate per exit and threshold,
            lossless thresholds by cross-validation), accuracy vs MACs on the test split

Defaults are sized for a 2-core CPU (width 0.5, a 10,000-image training subset, 5 epochs).
The options are one typed config, ``recipes/progressive_cifar_config.py`` (``--print-config``
shows them; ``--config FILE`` reads them from YAML or JSON, flags override it). Everything lands in
``--out``: ``summary.json`` (keys in docs/recipes.md), plots, logs and checkpoints; a stage reuses
what an earlier run with the same configuration left there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the recipes' own helpers, beside this file
from _config import parse_config  # noqa: E402
from _run import Run, open_run, run_stages  # noqa: E402
from _summary import print_progressive_summary  # noqa: E402
from progressive_cifar_config import ProgressiveCifarConfig  # noqa: E402
from nestflex._machine import machine
from nestflex.exits.placement import parse_positions

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"train": "training"}


def parse_args(argv: list[str] | None = None) -> ProgressiveCifarConfig:
    """The run's options: the defaults, then ``--config FILE``, then the flags."""
    return parse_config(ProgressiveCifarConfig, argv, description=__doc__)


def run_train(run: Run) -> dict[str, Any]:
    """Joint training of backbone and exits with the overthinking-aware loss (the public callback)."""
    import pytorch_lightning as pl

    from nestflex.exits import MultiExitClassifier, OverthinkingSchedule

    c, e, dm = run.cfg, run.cfg.exits, run.dm
    st = run.stage("train", {
        "model": c.model, "width": c.width, "epochs": c.epochs, "batch_size": c.data.batch_size,
        "lr": c.lr, "seed": c.seed, "data": run.data, "max_train_samples": c.data.max_train_samples,
        "val_size": c.data.val_size, "positions": parse_positions(e.positions), "head": e.head,
    })
    if st.done("model.ckpt", "result.json"):
        module = MultiExitClassifier.load_from_checkpoint(st.dir / "model.ckpt", map_location="cpu", weights_only=True)
        run.modules["train"] = module
        return {"summary": st.read("result.json")}
    resume = st.begin()
    pl.seed_everything(c.seed, workers=True)
    module = MultiExitClassifier(c.model, num_classes=dm.num_classes, width=c.width,
                                 positions=st.config["positions"], head=e.head, mode="joint", lr=c.lr,
                                 max_epochs=c.epochs, input_shape=dm.input_shape)
    trainer = st.trainer(c, [OverthinkingSchedule()], c.epochs, resume)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    net = module.model
    result = {
        "epochs": c.epochs, "train_seconds": round(seconds, 1), "train_samples": len(dm.train_dataset),
        "backbone_macs": net.backbone_macs, "head_macs": net.head_macs,
        "params": sum(p.numel() for p in net.parameters()),
        "backbone_params": sum(p.numel() for p in net.backbone.parameters()), "checkpoint": "train/model.ckpt",
    }
    st.write("result.json", result)
    run.modules["train"] = module
    return {"summary": result}


def run_exits(run: Run) -> dict[str, Any]:
    """Calibrate on the validation split, report accuracy vs MACs on the test split."""
    from nestflex._io import write_json
    from nestflex.exits import MultiExitClassifier
    from nestflex.exits.report import evaluate_exits, exits_summary, plot_tradeoff

    c, e, dm = run.cfg, run.cfg.exits, run.dm
    module = run.modules.get("train")
    if module is None:
        ckpt = run.out / "train" / "model.ckpt"
        if not ckpt.exists():
            raise SystemExit(
                f"--stages: the trained network {ckpt} does not exist. "
                f"HINT: run with --stages train first (or --stages all)"
            )
        module = MultiExitClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
    dm.setup("fit")
    net = module.model.cpu()
    calibration, test = evaluate_exits(
        net, dm.val_dataloader(), dm.test_dataloader(), confidence=e.confidence, fallback=e.fallback
    )
    out = run.out / "exits"
    write_json(out / "calibration.json", calibration)
    write_json(out / "test.json", test)
    other = test["sweep_other_fallback"]
    plot_tradeoff(
        {
            f"joint, {module.hparams.head} heads, fallback {e.fallback}": test["sweep"],
            f"joint, {module.hparams.head} heads, fallback {other['fallback']}": other["sweep"],
        },
        test["final_accuracy"],
        run.out / "exits_tradeoff.png",
        f"progressive {c.model} x{c.width}",
        synthetic=run.data["synthetic"],
        marks={"lossless thresholds (validation), fallback final": test["at_thresholds"]},
    )
    summary = {
        "head": module.hparams.head,
        "mode": "joint",
        **exits_summary(net, calibration, test),
        "calibration": "exits/calibration.json",
        "test_profile": "exits/test.json",
    }
    return {"summary": summary}


#: the stages in the order ``--stages all`` runs them (progressive_cifar_config.STAGES)
STAGES = {"train": run_train, "exits": run_exits}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_args(argv)
    run = open_run(cfg, max_train_samples=cfg.data.max_train_samples or None)  # 0: every training image
    run.summary.update(model={"name": cfg.model, "width": cfg.width, "num_classes": run.dm.num_classes},
                       machine=machine())
    summary = run_stages(run, STAGES, cfg.stage_list, SUMMARY_KEYS, timing=False)
    print_progressive_summary(summary)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
