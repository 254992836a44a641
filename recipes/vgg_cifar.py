#!/usr/bin/env python
"""End-to-end nestflex recipe: VGG on CIFAR-10 (or MNIST, or the embedded synthetic default).

    python recipes/vgg_cifar.py                      # defaults: synthetic data if no CIFAR-10
    python recipes/vgg_cifar.py --data cifar10 --data-dir ~/data --width 1 --epochs 160
    python recipes/vgg_cifar.py --data mnist --data-dir ~/mnist   # the four IDX files; 1x32x32 input

Every stage builds and traces the network at the data's per-sample shape (the DataModule's
``input_shape``: 3x32x32 for CIFAR-10 and the synthetic set, 1x32x32 for MNIST, whose 28x28
digits are zero-padded by 2 pixels), and the bundle declares that input and normalisation.

Stages run in order and each reuses what an earlier run already left in ``--out`` (matching
configuration), so an interrupted run resumes where it stopped:

    baseline   train the network (Lightning: progress bar, CSV logs, checkpoints)
    prune      NestDNN filter pruning (TRR) of the baseline: roadmap.json and the seed model
    exits      early exits (SPINN/SDN): heads trained on the frozen network (or jointly), calibrated
               on the validation split, accuracy vs MACs reported on test; the network is the
               grow stage's largest level when grow ran (so the bundle stores its weights once),
               else the baseline
    flex       FlexDNN on the baseline: collective filter ranking, fine-grained exit search (M
               exits per location, ranked dropout, pruning while the exit rate holds), greedy
               insertion plan; plan MACs/accuracy on test and the operating points
    profile    split quantisation profile: accuracy, bytes and codec time per <split, bitwidth>;
               per-layer precision profile (float32 / bfloat16 / int8) and the fastest
               assignment within --precision-budget accuracy points

    grow       NestDNN freeze-&-grow from the prune stage's roadmap: one multi-capacity model with
               nested levels; per-level profiles, memory and switching costs

    export     the deployment bundle ``--out/bundle.nfx``: manifest, weights once (safetensors, nested
               order), ONNX graphs, profiles; ``nestflex.deploy.load`` opens it (docs/deploy.md)

Everything lands in ``--out``: ``summary.json`` (documented in docs/recipes.md), plots, logs
and checkpoints.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from nestflex._io import read_json, write_json
from nestflex._machine import machine
from nestflex.data import DATA_KINDS, resolve_data
from nestflex.graph import trace
from nestflex.models import list_models

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"profile": "quantization", "prune": "pruning", "flex": "flexdnn"}
STAGES: dict[str, Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]]] = {}


def stage(name: str):
    def wrap(fn):
        STAGES[name] = fn
        return fn

    return wrap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="auto", choices=list(DATA_KINDS),
                   help="auto: CIFAR-10 if found in --data-dir, else the synthetic dataset; mnist: only when asked")
    p.add_argument("--data-dir", default="data",
                   help="where CIFAR-10 (python-batch layout) or MNIST (the four IDX files, gzipped or not) lives")
    p.add_argument("--download", action="store_true",
                   help="download CIFAR-10 into --data-dir if missing (MNIST is never downloaded)")
    p.add_argument("--model", default="vgg16", help=f"one of {', '.join(list_models())} or timm:<name>")
    p.add_argument("--width", type=float, default=0.25, help="channel multiplier (1.0 = the paper's VGG)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-train-samples", type=int, default=None, help="train on a seeded subset")
    p.add_argument("--val-size", type=int, default=5000, help="validation samples held out of the train split")
    p.add_argument("--synthetic-train-size", type=int, default=50_000, help="synthetic data only: train split size")
    p.add_argument("--synthetic-test-size", type=int, default=10_000, help="synthetic data only: test split size")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu, ...")
    p.add_argument("--devices", default="1", help="Lightning devices")
    p.add_argument("--out", default="runs/vgg_cifar", help="output directory")
    p.add_argument("--profile-samples", type=int, default=1000,
                   help="profile stage: validation samples used per <split, bitwidth> and per layer precision")
    p.add_argument("--precision-budget", type=float, default=1.0,
                   help="profile stage: accuracy drop (points) the per-layer precision assignment may cost")
    p.add_argument("--precision-calibration", type=int, default=256,
                   help="profile stage: validation samples, held out of the accuracy ones, that calibrate int8")
    p.add_argument("--precision-threads", type=int, default=1,
                   help="profile stage: torch threads while timing layer precisions (0: keep torch's setting)")
    p.add_argument("--exit-positions", default="0.15,0.3,0.45,0.6,0.75,0.9",
                   help="exits stage: comma list of MACs fractions in (0, 1) and/or split point names (SPINN default)")
    p.add_argument("--exit-head", default="sdn", help="exits stage: exit head (nestflex.exits.list_heads())")
    p.add_argument("--exit-mode", default="exits_only", choices=["exits_only", "joint"],
                   help="exits stage: train the heads on the frozen baseline, or fine-tune everything jointly")
    p.add_argument("--exit-epochs", type=int, default=3, help="exits stage: training epochs")
    p.add_argument("--exit-lr", type=float, default=0.05, help="exits stage: peak learning rate")
    p.add_argument("--exit-confidence", default="max_prob",
                   help="exits stage: confidence measure (nestflex.exits.list_confidences())")
    p.add_argument("--exit-fallback", default="most_confident", choices=["most_confident", "final"],
                   help="exits stage: who answers a sample no early exit took (SPINN: the most confident exit)")
    p.add_argument("--prune-criterion", default="trr", help="prune stage: importance criterion (trr, l1, l2, random)")
    p.add_argument("--prune-max-drop", type=float, default=1.0,
                   help="prune stage: accuracy points the seed model may lose against the baseline")
    p.add_argument("--prune-step", type=float, default=0.25,
                   help="prune stage: share of channels the most tolerant layer loses per step")
    p.add_argument("--prune-epochs-per-step", type=int, default=1, help="prune stage: retraining epochs per step")
    p.add_argument("--prune-max-steps", type=int, default=8, help="prune stage: at most this many steps")
    p.add_argument("--prune-lr", type=float, default=0.02, help="prune stage: peak learning rate of each retraining")
    p.add_argument("--prune-triplets", type=int, default=1000, help="prune stage: TRR triplets per ranking")
    p.add_argument("--grow-levels", type=int, default=5,
                   help="grow stage: descendants K (seed and vanilla included), evenly spaced in MACs on the roadmap")
    p.add_argument("--grow-epochs-per-level", type=int, default=1, help="grow stage: training epochs per grown level")
    p.add_argument("--grow-lr", type=float, default=0.02, help="grow stage: peak learning rate of each level")
    p.add_argument("--grow-init", default="footprint", choices=["footprint", "vanilla", "random"],
                   help="grow stage: where grown filters start (their footprint's values by default)")
    p.add_argument("--grow-train-samples", type=int, default=None, help="grow stage: train on a seeded subset")
    p.add_argument("--grow-latency-repeats", type=int, default=10, help="grow stage: timed runs per latency")
    p.add_argument("--flex-positions", default="all",
                   help="flex stage: candidate exit locations: `all` (after every layer; the plan picks) or MACs "
                        "fractions and/or split point names")
    p.add_argument("--flex-exits-per-location", type=int, default=3,
                   help="flex stage: M over-parameterised exits per location (exit k takes the top ceil(kN/M) filters)")
    p.add_argument("--flex-base-width", type=int, default=8, help="flex stage: filters of each exit's first block")
    # the exits stage's training budget by default (all training images, --exit-epochs' 3 epochs): FlexDNN's conv
    # heads need at least as much training as SPINN's pooled heads to be compared fairly (docs/flexdnn.md, Measured)
    p.add_argument("--flex-epochs", type=int, default=3, help="flex stage: joint training epochs of the exits")
    p.add_argument("--flex-train-samples", type=int, default=None,
                   help="flex stage: train the exits on a seeded subset of this many training samples (default: all)")
    p.add_argument("--flex-val-samples", type=int, default=2000,
                   help="flex stage: validation samples for ranking, pruning and the plan")
    p.add_argument("--flex-calibration-samples", type=int, default=2000,
                   help="flex stage: further validation samples, disjoint from those, that fit the shipped "
                        "thresholds (0: fit them on the planning samples)")
    p.add_argument("--flex-rate-tolerance", type=float, default=0.02,
                   help="flex stage: exit rate an exit may lose while its layers and filters are pruned")
    p.add_argument("--stages", default="all", help=f"comma list of {', '.join(STAGES)}, or all")
    args = p.parse_args(argv)
    names = list(STAGES) if args.stages == "all" else [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        p.error(f"--stages: unknown stage(s) {unknown or args.stages!r}; choose from {', '.join(STAGES)} or all")
    args.stage_list = names
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    if not 0 <= args.prune_max_drop < 100:
        p.error(f"--prune-max-drop is in accuracy points, in [0, 100), got {args.prune_max_drop}")
    if args.prune_epochs_per_step < 1 or args.prune_max_steps < 1:
        p.error("--prune-epochs-per-step and --prune-max-steps must be >= 1")
    if args.grow_levels < 2 or args.grow_epochs_per_level < 1 or args.grow_latency_repeats < 1:
        p.error("--grow-levels must be >= 2, --grow-epochs-per-level and --grow-latency-repeats >= 1")
    if args.flex_epochs < 1 or args.flex_exits_per_location < 1 or args.flex_base_width < 1:
        p.error("--flex-epochs, --flex-exits-per-location and --flex-base-width must be >= 1")
    if (args.flex_train_samples is not None and args.flex_train_samples < 1) or args.flex_val_samples < 1:
        p.error(f"--flex-train-samples (leave it out for all training images) and --flex-val-samples must be >= 1, "
                f"got {args.flex_train_samples} and {args.flex_val_samples}")
    if args.flex_calibration_samples != 0 and args.flex_calibration_samples < 5:
        p.error(f"--flex-calibration-samples must be 0 (thresholds on the planning images) or >= 5 (the "
                f"cross-validation folds), got {args.flex_calibration_samples}")
    if not 0 <= args.flex_rate_tolerance < 1:
        p.error(f"--flex-rate-tolerance is a share of samples in [0, 1), got {args.flex_rate_tolerance}")
    if args.exit_epochs < 1:
        p.error(f"--exit-epochs must be >= 1, got {args.exit_epochs}")
    if not args.precision_budget >= 0:
        p.error(f"--precision-budget must be >= 0 accuracy points, got {args.precision_budget}")
    if args.precision_calibration < 1:
        p.error(f"--precision-calibration must be >= 1, got {args.precision_calibration}")
    if args.precision_threads < 0:
        p.error(f"--precision-threads must be >= 0, got {args.precision_threads}")
    return args


@stage("baseline")
def run_baseline(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from nestflex.training import ImageClassifier

    out = Path(args.out) / "baseline"
    config = {
        "model": args.model, "width": args.width, "epochs": args.epochs, "batch_size": args.batch_size,
        "lr": args.lr, "seed": args.seed, "data": ctx["data"], "max_train_samples": args.max_train_samples,
        "val_size": args.val_size,
    }
    final = out / "model.ckpt"
    if final.exists() and (out / "config.json").exists() and read_json(out / "config.json") == config:
        print(f"baseline: reusing {final} (same configuration)")
        module = ImageClassifier.load_from_checkpoint(final, map_location="cpu", weights_only=True)
        result = read_json(out / "result.json")
        return {"module": module, "summary": result}

    pl.seed_everything(args.seed, workers=True)
    dm = ctx["datamodule"]
    module = ImageClassifier(args.model, num_classes=dm.num_classes, width=args.width, lr=args.lr, max_epochs=args.epochs,
                             input_shape=dm.input_shape)
    last = out / "last.ckpt"
    resume = last if last.exists() and (out / "config.json").exists() and read_json(out / "config.json") == config else None
    write_json(out / "config.json", config)
    logs = Path(args.out) / "logs"
    # Lightning's CSVLogger empties an existing version directory, so a resumed run logs to a new
    # one and the curves are stitched from all of them: resuming never loses logged epochs.
    version = f"baseline-resume{len(list(logs.glob('baseline-resume*'))) + 1}" if resume else "baseline"
    if not resume:
        for old in logs.glob("baseline-resume*"):
            shutil.rmtree(old)  # logs of an abandoned configuration
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator=args.accelerator,
        devices=int(args.devices) if args.devices.isdigit() else args.devices,
        logger=CSVLogger(args.out, name="logs", version=version),
        # one rolling checkpoint after every epoch: what a killed run resumes from
        callbacks=[ModelCheckpoint(dirpath=out, filename="last", save_top_k=1, enable_version_counter=False)],
        default_root_dir=args.out,
        enable_model_summary=False,
    )
    if resume:
        print(f"baseline: resuming from {resume}")
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
    seconds = time.perf_counter() - start
    test = trainer.test(module, datamodule=dm, verbose=False)[0]
    graph = trace(module.model.cpu(), dm.input_shape)
    result = {
        "accuracy": round(float(test["test_acc"]), 4),
        "params": graph.params(),
        "macs": graph.macs(),
        "epochs": args.epochs,
        "train_seconds": round(seconds, 1),
        "checkpoint": str(final.relative_to(args.out)),
    }
    write_json(out / "result.json", result)
    trainer.save_checkpoint(final, weights_only=True)
    _plot_curves(sorted(logs.glob("baseline*/metrics.csv"), key=lambda p: p.stat().st_mtime),
                 Path(args.out) / "baseline_curves.png", synthetic=ctx["data"]["synthetic"])
    return {"module": module, "summary": result}


@stage("prune")
def run_prune(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """NestDNN filter pruning of the baseline: roadmap.json + the seed model."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from nestflex.callbacks import FilterPruning
    from nestflex.pruning import Roadmap, load_pruned
    from nestflex.training import ImageClassifier

    base = _baseline_module(args, ctx)
    out = Path(args.out) / "prune"
    config = {
        "baseline": read_json(Path(args.out) / "baseline" / "config.json"), "criterion": args.prune_criterion,
        "max_drop": args.prune_max_drop, "step": args.prune_step, "epochs_per_step": args.prune_epochs_per_step,
        "max_steps": args.prune_max_steps, "lr": args.prune_lr, "triplets": args.prune_triplets,
    }
    same = (out / "config.json").exists() and read_json(out / "config.json") == config
    # room for every step to be retried twice (FilterPruning's backoff); the callback stops the
    # Trainer itself once the roadmap ends, so unused epochs cost nothing
    epochs = args.prune_epochs_per_step * args.prune_max_steps * 3
    hp = dict(base.hparams) | {"lr": args.prune_lr, "max_epochs": epochs, "restart_epochs": args.prune_epochs_per_step}
    module = ImageClassifier(**hp)
    road_path = out / "roadmap.json"
    if same and road_path.exists() and Roadmap.load(road_path).status != "running" and (out / "result.json").exists():
        print(f"prune: reusing {road_path} (same configuration)")
        load_pruned(module, out / "seed.ckpt")
        return {"module": module, "summary": read_json(out / "result.json")}
    module.model.load_state_dict(base.model.state_dict())
    resume = out / "last.ckpt" if same and (out / "last.ckpt").exists() else None
    if not same and out.exists():
        shutil.rmtree(out)  # another configuration's roadmap must not be continued
    write_json(out / "config.json", config)
    pl.seed_everything(args.seed, workers=True)
    kwargs = {"triplets": args.prune_triplets, "seed": args.seed} if args.prune_criterion == "trr" else {}
    if args.prune_criterion == "random":
        kwargs = {"seed": args.seed}
    pruner = FilterPruning(
        args.prune_criterion, max_drop=args.prune_max_drop / 100, step=args.prune_step,
        epochs_per_step=args.prune_epochs_per_step, max_steps=args.prune_max_steps, dirpath=out,
        criterion_kwargs=kwargs, input_shape=ctx["datamodule"].input_shape,
    )
    logs = Path(args.out) / "logs"
    version = f"prune-resume{len(list(logs.glob('prune-resume*'))) + 1}" if resume else "prune"
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator=args.accelerator,
        devices=int(args.devices) if args.devices.isdigit() else args.devices,
        logger=CSVLogger(args.out, name="logs", version=version),
        callbacks=[pruner, ModelCheckpoint(dirpath=out, filename="last", save_top_k=1, enable_version_counter=False)],
        default_root_dir=args.out, enable_model_summary=False, num_sanity_val_steps=0,
    )
    if resume:
        print(f"prune: resuming from {resume}")
    start = time.perf_counter()
    trainer.fit(module, datamodule=ctx["datamodule"], ckpt_path=str(resume) if resume else None)
    seconds = time.perf_counter() - start
    road = Roadmap.load(road_path)
    test = trainer.test(module, datamodule=ctx["datamodule"], verbose=False)[0]
    seed, vanilla = road.seed, road.footprints[0]
    result = {
        "roadmap": str(road_path.relative_to(args.out)), "criterion": road.criterion, "status": road.status,
        "steps": len(road.footprints) - 1, "accuracy": round(float(test["test_acc"]), 4),
        "val_accuracy": seed.accuracy, "goal": road.goal, "params": seed.params, "macs": seed.macs,
        "macs_fraction": round(seed.macs / vanilla.macs, 4), "params_fraction": round(seed.params / vanilla.params, 4),
        "seed_checkpoint": "prune/seed.ckpt", "seconds": round(seconds, 1),
    }
    write_json(out / "result.json", result)
    _plot_roadmaps([road], Path(args.out) / "prune_roadmap.png", synthetic=ctx["data"]["synthetic"])
    return {"module": module, "summary": result}


def _plot_roadmaps(roadmaps, png: Path, synthetic: bool) -> None:
    """Validation accuracy vs MACs of every footprint; the goal as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for road in roadmaps:
        fps = road.footprints
        line, = ax.plot([f.macs / 1e6 for f in fps], [f.accuracy for f in fps], "o-", label=f"{road.criterion} roadmap")
        ax.plot(fps[-1].macs / 1e6, fps[-1].accuracy, "*", ms=14, color=line.get_color())
        for r in road.rejected:
            ax.plot(r.macs / 1e6, r.accuracy, "x", ms=9, color=line.get_color())
        ax.axhline(road.goal, ls="--", lw=0.8, color=line.get_color())
    ax.set_xlabel("MACs per image (millions)")
    ax.set_ylabel("validation top-1")
    ax.set_title("pruning roadmap (star: seed, x: rejected steps)" + (" (synthetic data)" if synthetic else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


@stage("grow")
def run_grow(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """NestDNN freeze-&-grow from the prune stage's roadmap: the multi-capacity model + profiles."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from nestflex.callbacks import FreezeAndGrow
    from nestflex.capacity import set_level
    from nestflex.capacity.profile import memory_report, profile_levels, switching_table
    from nestflex.pruning import Roadmap
    from nestflex.training import ImageClassifier

    road_path = Path(args.out) / "prune" / "roadmap.json"
    if not road_path.exists() or not (Path(args.out) / "prune" / "result.json").exists():
        raise SystemExit(f"--stages: the roadmap {road_path} does not exist. HINT: run with --stages prune first")
    road = Roadmap.load(road_path)
    levels = min(args.grow_levels, len(road.footprints))
    if levels < args.grow_levels:
        print(f"grow: the roadmap has {len(road.footprints)} footprints; growing {levels} levels, "
              f"not --grow-levels {args.grow_levels}")
    if levels < 2:
        raise SystemExit("grow: the roadmap has a single footprint (nothing was pruned); nothing to grow")
    base = _baseline_module(args, ctx)
    out = Path(args.out) / "grow"
    config = {"prune": read_json(Path(args.out) / "prune" / "config.json"), "levels": levels,
              "epochs_per_level": args.grow_epochs_per_level, "lr": args.grow_lr, "init": args.grow_init,
              "train_samples": args.grow_train_samples, "seed": args.seed}
    same = (out / "config.json").exists() and read_json(out / "config.json") == config
    epochs = (levels - 1) * args.grow_epochs_per_level
    hp = dict(base.hparams) | {"lr": args.grow_lr, "max_epochs": epochs, "restart_epochs": args.grow_epochs_per_level}
    module = ImageClassifier(**hp)
    dm = ctx["datamodule"]
    grower = FreezeAndGrow(road_path, levels=levels, epochs_per_level=args.grow_epochs_per_level,
                           init=args.grow_init, dirpath=out, input_shape=dm.input_shape)
    final = out / "model.ckpt"
    if same and final.exists() and (out / "result.json").exists():
        print(f"grow: reusing {final} (same configuration)")
        grower.build(module)
        module.load_state_dict(torch.load(final, map_location="cpu", weights_only=True)["state_dict"])
        set_level(module, levels - 1)
        result = read_json(out / "result.json")
        return {"module": module, "summary": result, "top": {"levels": result["levels"], "memory": result["memory"]}}
    resume = out / "last.ckpt" if same and (out / "last.ckpt").exists() else None
    if not same and out.exists():
        shutil.rmtree(out)
    write_json(out / "config.json", config)
    if args.grow_train_samples:
        from nestflex.data import resolve_data

        dm, _ = resolve_data(
            args.data, args.data_dir, download=False, batch_size=args.batch_size, num_workers=args.num_workers,
            max_train_samples=args.grow_train_samples, val_size=args.val_size, seed=args.seed,
            train_size=args.synthetic_train_size, test_size=args.synthetic_test_size,
        )
    pl.seed_everything(args.seed, workers=True)
    logs = Path(args.out) / "logs"
    version = f"grow-resume{len(list(logs.glob('grow-resume*'))) + 1}" if resume else "grow"
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator=args.accelerator,
        devices=int(args.devices) if args.devices.isdigit() else args.devices,
        logger=CSVLogger(args.out, name="logs", version=version),
        callbacks=[grower, ModelCheckpoint(dirpath=out, filename="last", save_top_k=1, enable_version_counter=False)],
        default_root_dir=args.out, enable_model_summary=False, num_sanity_val_steps=0,
    )
    if resume:
        print(f"grow: resuming from {resume}")
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(final, weights_only=True)
    dm.setup("test")
    net = module.model.cpu()
    # test split: the levels were trained and evaluated (capacity.json) on train/validation only
    levels_profile = profile_levels(net, dm.test_dataloader(), batch_sizes=(1, 64), repeats=args.grow_latency_repeats,
                                    input_shape=dm.input_shape)
    memory = memory_report(net)
    switching = switching_table(net, repeats=3)
    write_json(out / "profile.json", {"levels": levels_profile, "memory": memory, "switching": switching,
                                      "machine": machine()})
    memory_summary = {k: memory[k] for k in ("multi_capacity_mb", "independent_mb", "largest_level_mb", "ratio_to_largest")}
    result = {
        "steps": list(grower.plan.steps), "epochs_per_level": args.grow_epochs_per_level, "init": args.grow_init,
        "levels": levels_profile, "memory": memory_summary, "seconds": round(seconds, 1),
        "capacity": "grow/capacity.json", "profile": "grow/profile.json", "checkpoint": "grow/model.ckpt",
    }
    write_json(out / "result.json", result)
    return {"module": module, "summary": result, "top": {"levels": levels_profile, "memory": memory_summary}}


@stage("exits")
def run_exits(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Progressive exits (SPINN/SDN) on the baseline: train, calibrate on validation, report on test."""

    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    from nestflex.exits import MultiExitClassifier, OverthinkingSchedule
    from nestflex.exits.placement import parse_positions
    from nestflex.exits.report import evaluate_exits, exits_summary, plot_tradeoff

    dm = ctx["datamodule"]
    out = Path(args.out) / "exits"
    source = _exit_backbone_source(args, ctx)
    config = {"baseline": read_json(Path(args.out) / "baseline" / "config.json"), "backbone": source,
              "positions": parse_positions(args.exit_positions), "head": args.exit_head, "mode": args.exit_mode,
              "epochs": args.exit_epochs, "lr": args.exit_lr, "batch_size": args.batch_size, "seed": args.seed}
    same = (out / "config.json").exists() and read_json(out / "config.json") == config
    final = out / "model.ckpt"
    if final.exists() and same and (out / "train.json").exists():
        print(f"exits: reusing {final} (same configuration)")
        module = MultiExitClassifier.load_from_checkpoint(final, map_location="cpu", weights_only=True)
        trained = read_json(out / "train.json")
    else:
        pl.seed_everything(args.seed, workers=True)
        backbone = _exit_backbone(args, ctx)
        module = MultiExitClassifier(args.model, num_classes=dm.num_classes, width=args.width,
                                     positions=config["positions"], head=args.exit_head, mode=args.exit_mode,
                                     lr=args.exit_lr, max_epochs=args.exit_epochs, backbone=backbone,
                                     input_shape=dm.input_shape)
        last = out / "last.ckpt"
        resume = last if last.exists() and same else None
        write_json(out / "config.json", config)
        logs = Path(args.out) / "logs"
        version = f"exits-resume{len(list(logs.glob('exits-resume*'))) + 1}" if resume else "exits"
        trainer = pl.Trainer(
            max_epochs=args.exit_epochs, accelerator=args.accelerator,
            devices=int(args.devices) if args.devices.isdigit() else args.devices,
            logger=CSVLogger(args.out, name="logs", version=version),
            callbacks=[OverthinkingSchedule(),
                       ModelCheckpoint(dirpath=out, filename="last", save_top_k=1, enable_version_counter=False)],
            default_root_dir=args.out, enable_model_summary=False,
        )
        if resume:
            print(f"exits: resuming from {resume}")
        start = time.perf_counter()
        trainer.fit(module, datamodule=dm, ckpt_path=str(resume) if resume else None)
        trained = {"epochs": args.exit_epochs, "train_seconds": round(time.perf_counter() - start, 1)}
        trainer.save_checkpoint(final, weights_only=True)
        write_json(out / "train.json", trained)
    dm.setup("fit")
    net = module.model.cpu()
    calibration, test = evaluate_exits(net, dm.val_dataloader(), dm.test_dataloader(), confidence=args.exit_confidence,
                                       fallback=args.exit_fallback)
    write_json(out / "calibration.json", calibration)
    write_json(out / "test.json", test)
    summary = {"head": args.exit_head, "mode": args.exit_mode,
               "backbone_source": "baseline" if source == "baseline" else "grow (largest level)",
               **trained, **exits_summary(net, calibration, test),
               "calibration": "exits/calibration.json", "test_profile": "exits/test.json",
               "checkpoint": str(final.relative_to(args.out))}
    marks = {"lossless thresholds (validation), fallback final": test["at_thresholds"]}
    other = test["sweep_other_fallback"]
    plot_tradeoff({f"{args.exit_mode}, {args.exit_head} heads, fallback {args.exit_fallback}": test["sweep"],
                   f"{args.exit_mode}, {args.exit_head} heads, fallback {other['fallback']}": other["sweep"]},
                  test["final_accuracy"],
                  Path(args.out) / "exits_tradeoff.png", f"{args.model} x{args.width}: early exits",
                  synthetic=ctx["data"]["synthetic"], marks=marks)
    return {"summary": summary, "module": module}


@stage("flex")
def run_flex(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """FlexDNN exits on the frozen backbone (the grown model's largest level after a grow stage, else the
    baseline, as for the exits stage): rank, search, plan; measured on test."""

    from safetensors.torch import load_file, save_file
    from torch.utils.data import DataLoader, Subset

    from nestflex.exits import FlexDNNConfig, build_flex_network, evaluate_flex, flexdnn
    from nestflex.exits.placement import parse_positions
    from nestflex.pruning import accuracy as backbone_accuracy

    dm = ctx["datamodule"]
    dm.setup("fit")
    out = Path(args.out) / "flex"
    config = {"baseline": read_json(Path(args.out) / "baseline" / "config.json"),
              "backbone": _exit_backbone_source(args, ctx),
              "positions": parse_positions(args.flex_positions), "exits_per_location": args.flex_exits_per_location,
              "base_width": args.flex_base_width, "epochs": args.flex_epochs, "train_samples": args.flex_train_samples,
              "val_samples": args.flex_val_samples, "calibration_samples": args.flex_calibration_samples,
              "rate_tolerance": args.flex_rate_tolerance, "seed": args.seed, "calibration_folds": 5}
    backbone = _exit_backbone(args, ctx).eval()  # flexdnn freezes it: a copy
    gen = torch.Generator().manual_seed(args.seed)

    def subset(ds, n):
        return Subset(ds, torch.randperm(len(ds), generator=gen)[: min(n, len(ds))].tolist())

    same = (out / "config.json").exists() and read_json(out / "config.json") == config
    if same and (out / "model.safetensors").exists() and (out / "report.json").exists():
        print(f"flex: reusing {out / 'model.safetensors'} (same configuration)")
        spec, report = read_json(out / "spec.json"), read_json(out / "report.json")
        net = build_flex_network(backbone, spec) if spec["exits"] else None
        if net is not None:
            net.load_state_dict(load_file(out / "model.safetensors"))
    else:
        n_train = len(dm.train_dataset) if args.flex_train_samples is None else args.flex_train_samples
        train = DataLoader(subset(dm.train_dataset, n_train), batch_size=args.batch_size, shuffle=True,
                           generator=torch.Generator().manual_seed(args.seed))
        n_val, n_cal, n = args.flex_val_samples, args.flex_calibration_samples, len(dm.val_dataset)
        folds = config["calibration_folds"]
        if n_val + n_cal > n:  # a small --val-size: share what there is in the requested proportion
            n_val = min(n_val, n) if not n_cal else max(1, round(n * n_val / (n_val + n_cal)))
            n_cal = min(n_cal, n - n_val)
            if n_cal < folds:  # too few to cross-validate on: all of it plans, and calibrates too
                n_val, n_cal = min(args.flex_val_samples, n), 0
            print(f"flex: the validation split has {n} images, fewer than --flex-val-samples "
                  f"{args.flex_val_samples} + --flex-calibration-samples {args.flex_calibration_samples}; "
                  f"planning on {n_val} and " + (f"calibrating on {n_cal}" if n_cal else
                                                 "cross-validating the thresholds on those same images")
                  + ". HINT: raise --val-size for the full counts")
        if (n_cal or n_val) < folds:
            raise SystemExit(f"error: flex stage: {n_cal or n_val} images to fit thresholds on, fewer than the {folds} "
                             f"cross-validation folds. HINT: raise --val-size and --flex-val-samples")
        # one draw: the planning images first, the calibration images after them (disjoint)
        order = torch.randperm(len(dm.val_dataset), generator=gen).tolist()
        val = DataLoader(Subset(dm.val_dataset, order[:n_val]), batch_size=args.batch_size)
        calibration = DataLoader(Subset(dm.val_dataset, order[n_val:n_val + n_cal]), batch_size=args.batch_size) \
            if n_cal else None
        cfg = FlexDNNConfig(locations=tuple(config["positions"]), exits_per_location=args.flex_exits_per_location,
                            base_width=args.flex_base_width, epochs=args.flex_epochs,
                            rate_tolerance=args.flex_rate_tolerance, rank_samples=min(1000, args.flex_val_samples),
                            fit_samples=min(2000, n_train), seed=args.seed,
                            calibration_folds=config["calibration_folds"])
        result = flexdnn(backbone, train, val, cfg, num_classes=dm.num_classes, input_shape=dm.input_shape,
                         calibration_batches=calibration)
        net, spec, report = result.network, result.spec, result.report
        out.mkdir(parents=True, exist_ok=True)
        if net is not None:
            # safetensors: data only, no pickle (invariant 7); written beside, then renamed
            tmp = out / "model.safetensors.tmp"
            save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp))
            tmp.replace(out / "model.safetensors")
        write_json(out / "spec.json", spec)
        write_json(out / "report.json", report)
        write_json(out / "config.json", config)
    plan = report["plan"]
    shipped = report.get("calibration", {})  # the spec's thresholds, measured on the split that fitted them
    summary: dict[str, Any] = {
        "kept_locations": plan["kept_locations"], "thresholds": spec["thresholds"], "confidence": spec["confidence"],
        "candidates": [c["location"] for c in report["candidates"]],
        "validation": {"accuracy": plan["accuracy"], "mean_macs": plan["mean_macs"],
                       "mean_macs_fraction": plan["mean_macs_fraction"]},
        "calibration": {k: shipped[k] for k in ("split", "samples", "accuracy", "mean_macs", "mean_macs_fraction")
                        if k in shipped},
        "backbone_macs": report["backbone_macs"],
        "min_filters": {r["location"]: {k: r[k] for k in ("filters", "min_filters", "min_filters_split")
                                        if k in r}  # reports written before the split was recorded lack it
                        for r in report["ranking"]},
        "operating_points": len(report.get("profile", {}).get("operating_points", [])),
        "seconds": report["seconds"], "spec": "flex/spec.json", "report": "flex/report.json",
    }
    if net is not None:
        test = evaluate_flex(net, spec, dm.test_dataloader())
        summary.update(accuracy=test["accuracy"], mean_macs=test["mean_macs"],
                       mean_macs_fraction=test["mean_macs_fraction"], backbone_accuracy=test["final_accuracy"],
                       exit_rate=test["exit_rate"], checkpoint="flex/model.safetensors")
    else:  # no exit pays for itself: the plan is the backbone alone, and the summary says what that gives
        accuracy = backbone_accuracy(backbone, dm.test_dataloader())
        summary.update(accuracy=accuracy, mean_macs=report["backbone_macs"], mean_macs_fraction=1.0,
                       backbone_accuracy=accuracy, exit_rate=[])
    return {"summary": summary}


@stage("profile")
def run_profile(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """Split quantisation profile: accuracy, bytes and codec time per <split, bitwidth>."""
    from nestflex.profiling import profile_split_quantization
    from nestflex.profiling.plots import plot_split_quantization

    module = _baseline_module(args, ctx)
    out = Path(args.out) / "profile"
    config = {"baseline": read_json(Path(args.out) / "baseline" / "config.json"),
              "samples": args.profile_samples, "codec": "blosc_lz4"}
    if (out / "config.json").exists() and read_json(out / "config.json") == config and (out / "split_quantization.json").exists():
        print(f"profile: reusing {out / 'split_quantization.json'} (same configuration)")
        profile = read_json(out / "split_quantization.json")
    else:
        dm = ctx["datamodule"]
        dm.setup("fit")
        # validation split: thresholds and bitwidths are chosen on it, never on the test set
        profile = profile_split_quantization(module.model.cpu(), dm.val_dataloader(), max_samples=args.profile_samples)
        write_json(out / "split_quantization.json", profile)
        write_json(out / "config.json", config)
    plot_split_quantization(profile, Path(args.out) / "split_quantization.png", synthetic=ctx["data"]["synthetic"])
    splits = {}
    for row in profile["splits"]:
        bits = row["lowest_bits"]["1"]
        ratio = next(r["ratio"] for r in row["per_bits"] if r["bits"] == bits)
        splits[row["name"]] = {"bits": bits, "compression_ratio": round(ratio, 2)}
    summary = {"float_accuracy": profile["float_accuracy"], "samples": profile["samples"],
               "profile": "profile/split_quantization.json", "splits": splits}
    precision = _profile_precision(args, ctx, module, out)
    summary["precision"] = precision["summary"]
    return {"summary": summary, "profile": profile, "precision": precision["profile"]}


def _profile_precision(args: argparse.Namespace, ctx: dict[str, Any], module, out: Path) -> dict[str, Any]:
    """Per-layer precision profile and the fastest assignment within --precision-budget."""
    from nestflex.profiling import DEFAULT_PRECISIONS, profile_layer_precision
    from nestflex.profiling.plots import plot_layer_precision

    config = {"baseline": read_json(Path(args.out) / "baseline" / "config.json"), "samples": args.profile_samples,
              "calibration_samples": args.precision_calibration, "budget_points": args.precision_budget,
              "precisions": list(DEFAULT_PRECISIONS), "batch_sizes": [64, 1], "threads": args.precision_threads}
    path, config_path = out / "layer_precision.json", out / "layer_precision_config.json"
    if path.exists() and config_path.exists() and read_json(config_path) == config:
        print(f"profile: reusing {path} (same configuration)")
        profile = read_json(path)
    else:
        dm = ctx["datamodule"]
        dm.setup("fit")
        # validation split, as for the split profile: the assignment is chosen on it, never on test.
        # One thread by default: steadier per-layer timings, and on a busy 2-core machine a
        # 2-thread region stalls whenever another process holds a core (many times slower).
        profile = profile_layer_precision(
            module.model.cpu(), dm.val_dataloader(), precisions=config["precisions"],
            budget_points=args.precision_budget, max_samples=args.profile_samples,
            calibration_samples=args.precision_calibration, batch_sizes=config["batch_sizes"],
            threads=args.precision_threads or None,
        )
        write_json(path, profile)
        write_json(config_path, config)
    plot_layer_precision(profile, Path(args.out) / "layer_precision.png", synthetic=ctx["data"]["synthetic"])
    a, bs = profile["assignment"], str(profile["optimised_batch_size"])
    summary = {
        "budget_points": a["budget_points"], "batch_size": profile["optimised_batch_size"], "counts": a["counts"],
        "float32_accuracy": profile["reference"]["accuracy"], "accuracy": a["accuracy"], "drop_points": a["drop_points"],
        "float32_latency_ms": round(profile["reference"]["latency_ms"][bs], 3),
        "latency_ms": round(a["latency_ms"][bs], 3), "speedup": round(a["speedup"][bs], 2),
        "samples": profile["samples"], "torch_threads": profile["machine"]["torch_threads"],
        "fallback": a["fallback"], "profile": "profile/layer_precision.json",
    }
    return {"summary": summary, "profile": profile}


@stage("export")
def run_export(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """The deployment bundle: multi-capacity levels (or the baseline), exits, profiles, ONNX."""
    from nestflex.export import export_bundle

    out = Path(args.out)
    grown = _grown_module(args, ctx)
    switching = None
    if grown is not None:
        model = grown.model.cpu()
        grow_profile = read_json(out / "grow" / "profile.json")
        levels = grow_profile["levels"]  # test-split profile rows of the grow stage
        switching = grow_profile.get("switching")  # measured switches: the scheduler's simulation charges them
    else:
        model, levels = _baseline_module(args, ctx).model.cpu(), None
    synthetic = bool(ctx["data"]["synthetic"])
    model_info = {"name": args.model, "width": args.width, "data": ctx["datamodule"].name, "synthetic": synthetic}
    exits = calibration = None
    if (out / "exits" / "model.ckpt").exists() and (out / "exits" / "calibration.json").exists():
        if "exits" in ctx:
            exits = ctx["exits"]["module"].model.cpu()
        else:
            from nestflex.exits import MultiExitClassifier

            exits = MultiExitClassifier.load_from_checkpoint(out / "exits" / "model.ckpt", map_location="cpu",
                                                             weights_only=True).model
        calibration = read_json(out / "exits" / "calibration.json")
    profiles = {name: read_json(out / "profile" / f"{name}.json") if (out / "profile" / f"{name}.json").exists() else None
                for name in ("split_quantization", "layer_precision")}
    dm = ctx["datamodule"]
    policy = {}
    if calibration is not None:  # the lossless thresholds were calibrated under their own fallback
        policy = {"confidence": calibration["confidence"], "fallback": calibration["lossless"]["fallback"]}
    flex = _flex_exits(args, ctx)  # FlexDNN's planned exits from the flex stage's saved outputs (no retraining)
    info = export_bundle(out / "bundle.nfx", model, exits=exits, levels=levels, input_shape=dm.input_shape,
                         mean=dm.mean, std=dm.std, classes=dm.classes, calibration=calibration, split_profile=profiles["split_quantization"],
                         precision_profile=profiles["layer_precision"], model_info=model_info, switching=switching,
                         **policy, **flex)
    summary = {"bundle": "bundle.nfx", **{k: v for k, v in info.items() if k != "bundle"}}
    return {"summary": summary}


def _flex_exits(args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """``flex_exits``/``flex_spec``/``flex_report`` for the bundle when the flex stage planned exits
    on the current exit backbone; ``{}`` otherwise (the bundle then has no ``flex_exits``)."""

    from safetensors.torch import load_file

    out = Path(args.out)
    flex = out / "flex"
    if not all((flex / f).exists() for f in ("spec.json", "report.json", "config.json", "model.safetensors")):
        return {}
    planned = read_json(flex / "config.json")
    if (planned["baseline"] != read_json(out / "baseline" / "config.json")
            or planned.get("backbone") != _exit_backbone_source(args, ctx)):
        print(f"export: skipping {flex} (planned on another backbone). HINT: rerun --stages flex")
        return {}
    from nestflex.exits import build_flex_network

    spec = read_json(flex / "spec.json")
    if not spec.get("exits"):
        return {}
    net = build_flex_network(_exit_backbone(args, ctx).eval(), spec)
    net.load_state_dict(load_file(flex / "model.safetensors"))
    return {"flex_exits": net, "flex_spec": spec, "flex_report": read_json(flex / "report.json")}


def _exit_backbone_source(args: argparse.Namespace, ctx: dict[str, Any]) -> Any:
    """What the exits and flex stages put their heads on, as recorded in their configs: the grown
    model's largest level when the grow stage ran (the bundle then stores the backbone once, as the
    multi-capacity weights, plus small heads; docs/architecture.md), else the baseline."""
    if _grown_module(args, ctx) is None:
        return "baseline"
    return {"grow": read_json(Path(args.out) / "grow" / "config.json"), "level": "largest"}


def _exit_backbone(args: argparse.Namespace, ctx: dict[str, Any]) -> torch.nn.Module:
    """A CPU copy of :func:`_exit_backbone_source`'s network: exit training freezes it, and later
    stages need the baseline and the grown model as they were. ``extract_level`` returns a plain
    copy of the largest level (vanilla shapes, nested channel order)."""
    import copy

    grown = _grown_module(args, ctx)
    if grown is None:
        return copy.deepcopy(_baseline_module(args, ctx).model).cpu()
    from nestflex.capacity import extract_level, num_levels

    return extract_level(grown.model.cpu(), num_levels(grown.model) - 1)


def _grown_module(args: argparse.Namespace, ctx: dict[str, Any]):
    """The grow stage's multi-capacity module from this run or from --out; ``None`` if grow never ran."""
    if "grow" in ctx:
        return ctx["grow"]["module"]
    if "grown_from_disk" in ctx:  # later stages ask several times; rebuild it once per invocation
        return ctx["grown_from_disk"]
    out = Path(args.out) / "grow"
    if not all((out / f).exists() for f in ("model.ckpt", "result.json", "config.json")):
        return None
    from nestflex.callbacks import FreezeAndGrow
    from nestflex.capacity import set_level
    from nestflex.training import ImageClassifier

    config = read_json(out / "config.json")
    module = ImageClassifier(**dict(_baseline_module(args, ctx).hparams))
    grower = FreezeAndGrow(Path(args.out) / "prune" / "roadmap.json", levels=config["levels"],
                           epochs_per_level=config["epochs_per_level"], init=config["init"], dirpath=out,
                           input_shape=ctx["datamodule"].input_shape)
    grower.build(module)
    module.load_state_dict(torch.load(out / "model.ckpt", map_location="cpu", weights_only=True)["state_dict"])
    set_level(module, config["levels"] - 1)
    ctx["grown_from_disk"] = module
    return module


def _baseline_module(args: argparse.Namespace, ctx: dict[str, Any]):
    """The baseline from this run, or from an earlier run's checkpoint in --out."""
    from nestflex.training import ImageClassifier

    if "baseline" in ctx:
        return ctx["baseline"]["module"]
    ckpt = Path(args.out) / "baseline" / "model.ckpt"
    if not ckpt.exists():
        raise SystemExit(f"--stages: the baseline checkpoint {ckpt} does not exist. "
                         f"HINT: run with --stages baseline first (or --stages all)")
    return ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)


def _plot_curves(csv_paths: list[Path], png: Path, synthetic: bool) -> None:
    """Accuracy per epoch from Lightning CSV logs; later files (resumed runs) win per epoch."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val: dict[int, float] = {}
    train: dict[int, float] = {}
    for csv_path in csv_paths:
        with open(csv_path) as f:
            for row in csv.DictReader(f):
                if row.get("val_acc"):
                    val[int(row["epoch"])] = float(row["val_acc"])
                if row.get("train_acc"):
                    train[int(row["epoch"])] = float(row["train_acc"])
    if not val and not train:
        return
    train, val = dict(sorted(train.items())), dict(sorted(val.items()))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([e + 1 for e in train], list(train.values()), "o-", label="train")
    ax.plot([e + 1 for e in val], list(val.values()), "s-", label="validation")
    ax.set_xlabel("epoch")
    ax.set_ylabel("top-1 accuracy")
    ax.set_title("baseline" + (" (synthetic data)" if synthetic else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dm, message = resolve_data(
        args.data, args.data_dir, download=args.download, batch_size=args.batch_size,
        num_workers=args.num_workers, max_train_samples=args.max_train_samples, val_size=args.val_size,
        seed=args.seed, train_size=args.synthetic_train_size, test_size=args.synthetic_test_size,
    )
    print(message)
    summary_path = out / "summary.json"
    summary: dict[str, Any] = read_json(summary_path) if summary_path.exists() else {}
    data = {"name": dm.name, "synthetic": bool(dm.synthetic), "seed": args.seed, "source": message}
    if dm.synthetic:
        data.update(train_size=dm.train_size, test_size=dm.test_size)
    ctx: dict[str, Any] = {"datamodule": dm, "data": data}
    summary.update(data=data, model={"name": args.model, "width": args.width, "num_classes": dm.num_classes,
                                     "input_shape": list(dm.input_shape)},
                   machine=machine())
    # wall seconds of this invocation per stage (a reused stage shows its reuse time, not its training time)
    timing: dict[str, Any] = {"stages": {}, "seconds": 0.0}
    start = time.perf_counter()
    for i, name in enumerate(args.stage_list, 1):
        print(f"== stage {i}/{len(args.stage_list)}: {name}")
        t0 = time.perf_counter()
        result = STAGES[name](args, ctx)
        ctx[name] = result
        summary[SUMMARY_KEYS.get(name, name)] = result["summary"]
        summary.update(result.get("top", {}))  # keys a stage also puts at the top level (grow: levels, memory)
        timing["stages"][name] = round(time.perf_counter() - t0, 1)
        timing["seconds"] = round(time.perf_counter() - start, 1)
        summary["timing"] = timing
        write_json(summary_path, summary)  # after every stage: a crash later keeps what is done
        print(f"== stage {name} done in {timing['stages'][name]:.0f} s ({timing['seconds']:.0f} s so far)")
    print(f"summary: {summary_path}")
    tag = "  (synthetic data)" if data["synthetic"] else ""
    if "baseline" in summary:
        s = summary["baseline"]
        print(f"  baseline  accuracy {s['accuracy']:.4f}  params {s['params']:,}  MACs {s['macs']:,}{tag}")
    if "pruning" in summary:
        s = summary["pruning"]
        print(f"  prune     seed ({s['criterion']}, {s['steps']} steps, {s['status']}) accuracy {s['accuracy']:.4f}  "
              f"params {s['params']:,}  MACs {s['macs']:,} ({s['macs_fraction']:.0%} of the baseline){tag}")
    if "grow" in summary:
        g = summary["grow"]
        for lv in g["levels"]:
            print(f"  grow      level {lv['level']}  accuracy {lv['accuracy']:.4f}  params {lv['params']:,}  MACs "
                  f"{lv['macs']:,}  {lv['memory_mb']:.3f} MB  latency {lv['latency_ms']['1']:.2f} ms (batch 1){tag}")
        m = g["memory"]
        print(f"  grow      multi-capacity {m['multi_capacity_mb']:.3f} MB vs {m['independent_mb']:.3f} MB for "
              f"{len(g['levels'])} independent models ({m['ratio_to_largest']:.3f}x the largest level)")
    if "exits" in summary:
        e = summary["exits"]
        print(f"  exits     {len(e['layers'])} exits at {e['positions']} of the MACs; test accuracy per exit "
              f"{e['accuracy']}{tag}")
        if "within_1pt" in e:
            w = e["within_1pt"]
            print(f"  exits     within 1 pt (threshold {w['threshold']} chosen on validation): accuracy "
                  f"{w['accuracy']:.4f} at {w['macs_fraction']:.2f} of the backbone's MACs{tag}")
        else:
            print(f"  exits     no threshold keeps the {e['fallback']} policy within 1 pt of the final exit on validation")
        ll = e["lossless"]
        print(f"  exits     lossless thresholds: accuracy {ll['accuracy']:.4f} at {ll['macs_fraction']:.2f} of the "
              f"backbone's MACs (backbone alone {e['backbone']['accuracy']:.4f}){tag}")
    if "flexdnn" in summary:
        f = summary["flexdnn"]
        if "accuracy" in f:
            print(f"  flex      plan {f['kept_locations']}: test accuracy {f['accuracy']:.4f} at {f['mean_macs_fraction']:.2f} "
                  f"of the backbone's MACs (backbone alone {f['backbone_accuracy']:.4f}){tag}")
        else:
            print("  flex      the insertion plan kept no exit: the backbone alone is cheapest")
    if "quantization" in summary:
        for split, q in summary["quantization"]["splits"].items():
            print(f"  profile   {split:<18} lowest bits within 1 pt: {q['bits']}  ratio {q['compression_ratio']}x{tag}")
        if "precision" in summary["quantization"]:
            pr = summary["quantization"]["precision"]
            counts = ", ".join(f"{n} {p}" for p, n in pr["counts"].items() if n)
            print(f"  precision layers {counts} within {pr['budget_points']:g} pt: measured drop {pr['drop_points']:.2f} pt, "
                  f"{pr['speedup']}x faster than float32 at batch {pr['batch_size']}{tag}")
    if "export" in summary:
        x = summary["export"]
        print(f"  export    {x['levels']} level(s), exits backbone {x['exits_backbone']}, "
              f"{x.get('flex_exits', 0)} FlexDNN exit(s) (backbone {x.get('flex_exits_backbone')}): {x['bytes']:,} bytes "
              f"({x['weights_bytes']:,} weights, {x['onnx_bytes']:,} ONNX; largest level {x['largest_level_bytes']:,})")
        print(f"bundle: {out / x['bundle']}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
