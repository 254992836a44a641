#!/usr/bin/env python
"""End-to-end nestflex recipe: VGG on CIFAR-10 (or MNIST, or the embedded synthetic default).

    python recipes/vgg_cifar.py                      # defaults: synthetic data if no CIFAR-10
    python recipes/vgg_cifar.py --data cifar10 --data-dir ~/data --width 1 --epochs 160
    python recipes/vgg_cifar.py --data mnist --data-dir ~/mnist   # the four IDX files; 1x32x32 input

The user's path, stage by stage: each stage builds a Lightning ``Trainer`` with the public nestflex
callbacks and functions a user adds to their own training (docs/callbacks.md), at the data's
per-sample shape (the DataModule's ``input_shape``):

    baseline   train an ImageClassifier
    prune      FilterPruning (NestDNN, TRR): roadmap.json and the seed model
    grow       FreezeAndGrow from the roadmap: one multi-capacity model; per-level profile on test
    exits      MultiExitClassifier + OverthinkingSchedule (SPINN/SDN) on the largest level (else the
               baseline); calibrated on validation, reported on test
    flex       FlexDNNExits (FlexDNN) on the same backbone; its plan measured on test
    profile    split quantisation and per-layer precision profiles (validation split)
    export     BundleExporter: levels, both exit sets and the profiles in ``--out/bundle.nfx``

Resume and caching live in ``recipes/_run.py``: a stage whose configuration matches what an
earlier run left in ``--out`` is reused, a killed one resumes from its last checkpoint.
Everything lands in ``--out``: ``summary.json`` (documented in docs/recipes.md), plots, logs
and checkpoints.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the recipes' own helper, beside this file
from _run import StageDir, callback_trainer, plot_curves, plot_roadmap, print_summary  # noqa: E402
from nestflex._io import read_json, write_json
from nestflex._machine import machine
from nestflex.callbacks import BundleExporter, FilterPruning, FlexDNNExits, FreezeAndGrow, OverthinkingSchedule
from nestflex.capacity import extract_level, num_levels, set_level
from nestflex.data import DATA_KINDS, resolve_data
from nestflex.exits import MultiExitClassifier, evaluate_flex
from nestflex.exits.placement import parse_positions
from nestflex.graph import trace
from nestflex.models import list_models
from nestflex.pruning import Roadmap, load_pruned
from nestflex.training import ImageClassifier

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"profile": "quantization", "prune": "pruning", "flex": "flexdnn"}
STAGES: dict[str, Callable[["Run"], dict[str, Any]]] = {}


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
    p.add_argument("--prune-max-steps", type=int, default=10,
                   help="prune stage: at most this many kept steps (docs/pruning.md#noise says why 10)")
    p.add_argument("--prune-recover-epochs", type=int, default=1,
                   help="prune stage: extra retraining epochs a step that misses the goal gets before it counts as broken")
    p.add_argument("--prune-retry-budget", type=int, default=2,
                   help="prune stage: broken steps the roadmap retries in all; the next ends it "
                        "(bounds the stage's time: docs/pruning.md#time; -1: no bound)")
    p.add_argument("--prune-round-to", type=int, default=1,
                   help="prune stage: keep channel counts at multiples of this (8, 16: SIMD-friendly widths; 1: any)")
    p.add_argument("--prune-finetune-epochs", type=int, default=2,
                   help="prune stage: epochs of fine-tuning for the seed once the roadmap ends (0: none)")
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
    if args.prune_retry_budget < -1:
        p.error(f"--prune-retry-budget is a count of tries (-1: no bound), got {args.prune_retry_budget}")
    if args.prune_round_to < 1:
        p.error(f"--prune-round-to must be >= 1, got {args.prune_round_to}")
    if args.prune_epochs_per_step < 1 or args.prune_max_steps < 1 or min(args.prune_recover_epochs,
                                                                         args.prune_finetune_epochs) < 0:
        p.error("--prune-epochs-per-step and --prune-max-steps must be >= 1, --prune-recover-epochs and "
                "--prune-finetune-epochs >= 0")
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


class Run:
    """What the stages share: the flags, the data, and the modules earlier stages left."""

    def __init__(self, args: argparse.Namespace, dm, data: dict[str, Any]) -> None:
        self.args, self.dm, self.data, self.out = args, dm, data, Path(args.out)
        self.modules: dict[str, Any] = {}
        self.opened: StageDir | None = None  # the stage directory the running stage opened

    def stage(self, name: str, config: dict[str, Any]) -> StageDir:
        self.opened = StageDir(self.out, name, config)
        return self.opened

    def config(self, name: str) -> Any:
        return read_json(self.out / name / "config.json")

    def baseline(self) -> ImageClassifier:
        if "baseline" not in self.modules:
            ckpt = self.out / "baseline" / "model.ckpt"
            if not ckpt.exists():
                raise SystemExit(f"--stages: the baseline checkpoint {ckpt} does not exist. "
                                 f"HINT: run with --stages baseline first (or --stages all)")
            self.modules["baseline"] = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
        return self.modules["baseline"]

    def grown(self) -> ImageClassifier | None:
        """The grow stage's multi-capacity module (this run's, or rebuilt from ``--out``); ``None`` without one."""
        if "grow" not in self.modules:
            out = self.out / "grow"
            if not all((out / f).exists() for f in ("model.ckpt", "result.json", "config.json")):
                return None
            config = read_json(out / "config.json")
            module = ImageClassifier(**dict(self.baseline().hparams))
            FreezeAndGrow(self.out / "prune" / "roadmap.json", levels=config["levels"]).build(module)
            module.load_state_dict(torch.load(out / "model.ckpt", map_location="cpu", weights_only=True)["state_dict"])
            set_level(module, config["levels"] - 1)
            self.modules["grow"] = module
        return self.modules["grow"]

    def exit_backbone(self) -> tuple[Any, ImageClassifier]:
        """Where exits go, as recorded in their configs, and the module holding it: the grown model's
        largest level when grow ran (the bundle then stores the backbone once), else the baseline."""
        grown = self.grown()
        if grown is None:
            return "baseline", self.baseline()
        return {"grow": self.config("grow"), "level": "largest"}, grown


@stage("baseline")
def run_baseline(run: Run) -> dict[str, Any]:
    a, dm = run.args, run.dm
    st = run.stage("baseline", {"model": a.model, "width": a.width, "epochs": a.epochs, "batch_size": a.batch_size,
                                "lr": a.lr, "seed": a.seed, "data": run.data, "max_train_samples": a.max_train_samples,
                                "val_size": a.val_size})
    if st.done("model.ckpt", "result.json"):
        return {"summary": st.read("result.json")}
    resume = st.begin()
    pl.seed_everything(a.seed, workers=True)
    module = ImageClassifier(a.model, num_classes=dm.num_classes, width=a.width, lr=a.lr, max_epochs=a.epochs,
                             input_shape=dm.input_shape)
    trainer = st.trainer(a, [], a.epochs, resume)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    test = trainer.test(module, datamodule=dm, verbose=False)[0]
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    graph = trace(module.model.cpu(), dm.input_shape)
    result = {"accuracy": round(float(test["test_acc"]), 4), "params": graph.params(), "macs": graph.macs(),
              "epochs": a.epochs, "train_seconds": round(seconds, 1), "checkpoint": "baseline/model.ckpt"}
    st.write("result.json", result)
    run.modules["baseline"] = module
    plot_curves(sorted((run.out / "logs").glob("baseline*/metrics.csv"), key=lambda p: p.stat().st_mtime),
                run.out / "baseline_curves.png", run.data["synthetic"])
    return {"summary": result}


@stage("prune")
def run_prune(run: Run) -> dict[str, Any]:
    """NestDNN filter pruning of the baseline: roadmap.json + the seed model."""
    a, base = run.args, run.baseline()
    budget = None if a.prune_retry_budget < 0 else a.prune_retry_budget
    st = run.stage("prune", {"baseline": run.config("baseline"), "criterion": a.prune_criterion,
                             "max_drop": a.prune_max_drop, "step": a.prune_step,
                             "epochs_per_step": a.prune_epochs_per_step, "max_steps": a.prune_max_steps,
                             "recover_epochs": a.prune_recover_epochs, "finetune_epochs": a.prune_finetune_epochs,
                             "retry_budget": budget,
                             **({"round_to": a.prune_round_to} if a.prune_round_to != 1 else {}),
                             "lr": a.prune_lr, "triplets": a.prune_triplets})
    # room for every step to be recovered and retried twice (the back-off), then the seed's fine-tuning;
    # the callback stops the Trainer when done
    epochs = (a.prune_epochs_per_step + a.prune_recover_epochs) * a.prune_max_steps * 3 + a.prune_finetune_epochs
    module = ImageClassifier(**dict(base.hparams) | {"lr": a.prune_lr, "max_epochs": epochs,
                                                     "restart_epochs": a.prune_epochs_per_step})
    road_path = st.dir / "roadmap.json"
    if st.done("result.json", "roadmap.json", "seed.ckpt"):
        return {"summary": st.read("result.json")}
    resume = st.begin()
    module.model.load_state_dict(base.model.state_dict())
    pl.seed_everything(a.seed, workers=True)
    kwargs = {"triplets": a.prune_triplets, "seed": a.seed} if a.prune_criterion == "trr" else {}
    kwargs = {"seed": a.seed} if a.prune_criterion == "random" else kwargs
    pruner = FilterPruning(a.prune_criterion, max_drop=a.prune_max_drop / 100, step=a.prune_step,
                           epochs_per_step=a.prune_epochs_per_step, max_steps=a.prune_max_steps,
                           recover_epochs=a.prune_recover_epochs, finetune_epochs=a.prune_finetune_epochs,
                           retry_budget=budget, round_to=a.prune_round_to, dirpath=st.dir, criterion_kwargs=kwargs)
    trainer = st.trainer(a, [pruner], epochs, resume, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=run.dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    load_pruned(module, st.dir / "seed.ckpt")  # the module ends as the seed; stated here for a resumed run too
    road = Roadmap.load(road_path)
    test = trainer.test(module, datamodule=run.dm, verbose=False)[0]
    seed, vanilla = road.seed, road.footprints[0]
    result = {
        "roadmap": "prune/roadmap.json", "criterion": road.criterion, "status": road.status,
        "steps": len(road.footprints) - 1, "accuracy": round(float(test["test_acc"]), 4),
        "val_accuracy": seed.accuracy, "goal": road.goal, "params": seed.params, "macs": seed.macs,
        "macs_fraction": round(seed.macs / vanilla.macs, 4), "params_fraction": round(seed.params / vanilla.params, 4),
        "seed_checkpoint": "prune/seed.ckpt", "seconds": round(seconds, 1),
        "start_val_accuracy": road.start_accuracy, "rejected_steps": len(road.rejected),
        # the stopping reason is `status`; the noise entry sizes the goal's margin against the split
        "val_size": road.eval_samples, "noise": road.noise(), "finetune": road.finetune,
    }
    st.write("result.json", result)
    plot_roadmap(road, run.out / "prune_roadmap.png", run.data["synthetic"])
    return {"summary": result}


@stage("grow")
def run_grow(run: Run) -> dict[str, Any]:
    """NestDNN freeze-&-grow from the prune stage's roadmap: the multi-capacity model + profiles."""
    from nestflex.capacity.profile import memory_report, profile_levels, switching_table

    a = run.args
    road_path = run.out / "prune" / "roadmap.json"
    if not road_path.exists() or not (run.out / "prune" / "result.json").exists():
        raise SystemExit(f"--stages: the roadmap {road_path} does not exist. HINT: run with --stages prune first")
    levels = min(a.grow_levels, len(Roadmap.load(road_path).footprints))
    if levels < a.grow_levels:
        print(f"grow: the roadmap has {levels} footprints; growing {levels} levels, not --grow-levels {a.grow_levels}")
    if levels < 2:
        raise SystemExit("grow: the roadmap has a single footprint (nothing was pruned); nothing to grow")
    st = run.stage("grow", {"prune": run.config("prune"), "levels": levels, "epochs_per_level": a.grow_epochs_per_level,
                            "lr": a.grow_lr, "init": a.grow_init, "train_samples": a.grow_train_samples, "seed": a.seed})
    if st.done("model.ckpt", "result.json"):
        result = st.read("result.json")
        return {"summary": result, "top": {"levels": result["levels"], "memory": result["memory"]}}
    resume = st.begin()
    epochs = (levels - 1) * a.grow_epochs_per_level
    module = ImageClassifier(**dict(run.baseline().hparams) | {"lr": a.grow_lr, "max_epochs": epochs,
                                                               "restart_epochs": a.grow_epochs_per_level})
    grower = FreezeAndGrow(road_path, levels=levels, epochs_per_level=a.grow_epochs_per_level, init=a.grow_init,
                           dirpath=st.dir)
    dm = run.dm if not a.grow_train_samples else data_module(a, max_train_samples=a.grow_train_samples)[0]
    pl.seed_everything(a.seed, workers=True)
    trainer = st.trainer(a, [grower], epochs, resume, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    run.modules["grow"] = module
    run.dm.setup("test")
    net = module.model.cpu()
    # test split: the levels were trained and evaluated (capacity.json) on train/validation only
    rows = profile_levels(net, run.dm.test_dataloader(), batch_sizes=(1, 64), repeats=a.grow_latency_repeats)
    memory = memory_report(net)
    st.write("profile.json", {"levels": rows, "memory": memory, "switching": switching_table(net, repeats=3),
                              "machine": machine()})
    memory = {k: memory[k] for k in ("multi_capacity_mb", "independent_mb", "largest_level_mb", "ratio_to_largest")}
    result = {"steps": list(grower.plan.steps), "epochs_per_level": a.grow_epochs_per_level, "init": a.grow_init,
              "levels": rows, "memory": memory, "seconds": round(seconds, 1), "capacity": "grow/capacity.json",
              "profile": "grow/profile.json", "checkpoint": "grow/model.ckpt"}
    st.write("result.json", result)
    return {"summary": result, "top": {"levels": rows, "memory": memory}}


@stage("exits")
def run_exits(run: Run) -> dict[str, Any]:
    """Progressive exits (SPINN/SDN): train, calibrate on validation, report on test."""
    from nestflex.exits.report import evaluate_exits, exits_summary, plot_tradeoff

    a, dm = run.args, run.dm
    source, holder = run.exit_backbone()
    st = run.stage("exits", {"baseline": run.config("baseline"), "backbone": source,
                             "positions": parse_positions(a.exit_positions), "head": a.exit_head, "mode": a.exit_mode,
                             "epochs": a.exit_epochs, "lr": a.exit_lr, "batch_size": a.batch_size, "seed": a.seed})
    if st.done("model.ckpt", "train.json"):
        module = MultiExitClassifier.load_from_checkpoint(st.dir / "model.ckpt", map_location="cpu", weights_only=True)
        trained = st.read("train.json")
    else:
        resume = st.begin()
        pl.seed_everything(a.seed, workers=True)
        backbone = _largest(holder)
        module = MultiExitClassifier(a.model, num_classes=dm.num_classes, width=a.width, positions=st.config["positions"],
                                     head=a.exit_head, mode=a.exit_mode, lr=a.exit_lr, max_epochs=a.exit_epochs,
                                     backbone=backbone, input_shape=dm.input_shape)
        trainer = st.trainer(a, [OverthinkingSchedule()], a.exit_epochs, resume)
        start = time.perf_counter()
        trainer.fit(module, datamodule=dm, ckpt_path=resume)
        trained = {"epochs": a.exit_epochs, "train_seconds": round(time.perf_counter() - start, 1)}
        trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
        st.write("train.json", trained)
    dm.setup("fit")
    net = module.model.cpu()
    calibration, test = evaluate_exits(net, dm.val_dataloader(), dm.test_dataloader(), confidence=a.exit_confidence,
                                       fallback=a.exit_fallback)
    st.write("calibration.json", calibration)
    st.write("test.json", test)
    run.modules["exits"] = module
    summary = {"head": a.exit_head, "mode": a.exit_mode,
               "backbone_source": "baseline" if source == "baseline" else "grow (largest level)",
               **trained, **exits_summary(net, calibration, test), "calibration": "exits/calibration.json",
               "test_profile": "exits/test.json", "checkpoint": "exits/model.ckpt"}
    other = test["sweep_other_fallback"]
    plot_tradeoff({f"{a.exit_mode}, {a.exit_head} heads, fallback {a.exit_fallback}": test["sweep"],
                   f"{a.exit_mode}, {a.exit_head} heads, fallback {other['fallback']}": other["sweep"]},
                  test["final_accuracy"], run.out / "exits_tradeoff.png", f"{a.model} x{a.width}: early exits",
                  synthetic=run.data["synthetic"],
                  marks={"lossless thresholds (validation), fallback final": test["at_thresholds"]})
    return {"summary": summary}


@stage("flex")
def run_flex(run: Run) -> dict[str, Any]:
    """FlexDNN exits on the exits stage's backbone: rank, search, plan (FlexDNNExits); measured on test."""
    from safetensors.torch import load_file

    from nestflex.exits import build_flex_network
    from nestflex.pruning import accuracy

    a, dm = run.args, run.dm
    source, holder = run.exit_backbone()
    n_plan, n_cal = a.flex_val_samples, a.flex_calibration_samples
    st = run.stage("flex", {"baseline": run.config("baseline"), "backbone": source,
                            "positions": parse_positions(a.flex_positions), "exits_per_location": a.flex_exits_per_location,
                            "base_width": a.flex_base_width, "epochs": a.flex_epochs, "train_samples": a.flex_train_samples,
                            "val_samples": n_plan, "calibration_samples": n_cal, "rate_tolerance": a.flex_rate_tolerance,
                            "seed": a.seed, "calibration_folds": 5})
    dm.setup("fit")
    if not st.done("report.json", "spec.json"):
        st.begin()
        n_train = len(dm.train_dataset) if a.flex_train_samples is None else a.flex_train_samples
        config = {"locations": st.config["positions"], "exits_per_location": a.flex_exits_per_location,
                  "base_width": a.flex_base_width, "epochs": a.flex_epochs, "rate_tolerance": a.flex_rate_tolerance,
                  "rank_samples": min(1000, n_plan), "fit_samples": min(2000, n_train), "seed": a.seed,
                  "calibration_folds": 5}
        flex = FlexDNNExits(dirpath=st.dir, config=config, calibration_fraction=n_cal / (n_plan + n_cal),
                            train_samples=a.flex_train_samples, val_samples=n_plan + n_cal)
        callback_trainer(a, [flex]).fit(copy.deepcopy(holder), datamodule=dm)  # trains nothing; FlexDNN runs at the end
    spec, report = st.read("spec.json"), st.read("report.json")
    plan, shipped = report["plan"], report.get("calibration", {})
    summary: dict[str, Any] = {
        "kept_locations": plan["kept_locations"], "thresholds": spec["thresholds"], "confidence": spec["confidence"],
        "candidates": [c["location"] for c in report["candidates"]],
        "validation": {k: plan[k] for k in ("accuracy", "mean_macs", "mean_macs_fraction")},
        "calibration": {k: shipped[k] for k in ("split", "samples", "accuracy", "mean_macs", "mean_macs_fraction")
                        if k in shipped},
        "backbone_macs": report["backbone_macs"],
        "min_filters": {r["location"]: {k: r[k] for k in ("filters", "min_filters", "min_filters_split") if k in r}
                        for r in report["ranking"]},
        "operating_points": len(report.get("profile", {}).get("operating_points", [])),
        "seconds": report["seconds"], "spec": "flex/spec.json", "report": "flex/report.json",
    }
    if spec["exits"]:
        net = build_flex_network(_largest(holder).eval(), spec)
        net.load_state_dict(load_file(st.dir / "model.safetensors"))
        test = evaluate_flex(net, spec, dm.test_dataloader())
        summary.update(accuracy=test["accuracy"], mean_macs=test["mean_macs"], mean_macs_fraction=test["mean_macs_fraction"],
                       backbone_accuracy=test["final_accuracy"], exit_rate=test["exit_rate"],
                       checkpoint="flex/model.safetensors")
    else:  # no exit pays for itself: the plan is the backbone alone, and the summary says what that gives
        acc = accuracy(_largest(holder).eval(), dm.test_dataloader())
        summary.update(accuracy=acc, mean_macs=report["backbone_macs"], mean_macs_fraction=1.0, backbone_accuracy=acc,
                       exit_rate=[])
    return {"summary": summary}


def _largest(module: ImageClassifier) -> torch.nn.Module:
    """A plain copy of the module's network (its largest level when grown): exits train on it and
    later stages still need the module as it was."""
    net = module.model.cpu()
    return extract_level(net, num_levels(net) - 1) if num_levels(net) else copy.deepcopy(net)


@stage("profile")
def run_profile(run: Run) -> dict[str, Any]:
    """Split quantisation (accuracy, bytes, codec time per <split, bitwidth>) and per-layer precision profiles."""
    from nestflex.profiling import DEFAULT_PRECISIONS, profile_layer_precision, profile_split_quantization
    from nestflex.profiling.plots import plot_layer_precision, plot_split_quantization

    a, net = run.args, run.baseline().model.cpu()
    base = run.config("baseline")
    # validation split: thresholds, bitwidths and precisions are chosen on it, never on the test set
    run.dm.setup("fit")
    st = run.stage("profile", {"baseline": base, "samples": a.profile_samples, "codec": "blosc_lz4"})
    if not st.done("split_quantization.json"):
        st.begin()
        st.write("split_quantization.json",
                 profile_split_quantization(net, run.dm.val_dataloader(), max_samples=a.profile_samples))
    profile = st.read("split_quantization.json")
    plot_split_quantization(profile, run.out / "split_quantization.png", synthetic=run.data["synthetic"])
    splits = {}
    for row in profile["splits"]:
        bits = row["lowest_bits"]["1"]
        ratio = next(r["ratio"] for r in row["per_bits"] if r["bits"] == bits)
        splits[row["name"]] = {"bits": bits, "compression_ratio": round(ratio, 2)}
    config = {"baseline": base, "samples": a.profile_samples, "calibration_samples": a.precision_calibration,
              "budget_points": a.precision_budget, "precisions": list(DEFAULT_PRECISIONS), "batch_sizes": [64, 1],
              "threads": a.precision_threads}
    path, config_path = st.dir / "layer_precision.json", st.dir / "layer_precision_config.json"
    if path.exists() and config_path.exists() and read_json(config_path) == config:
        print(f"profile: reusing {path} (same configuration)")
    else:  # one thread by default: steadier per-layer timings on a busy 2-core machine
        write_json(path, profile_layer_precision(
            net, run.dm.val_dataloader(), precisions=config["precisions"], budget_points=a.precision_budget,
            max_samples=a.profile_samples, calibration_samples=a.precision_calibration,
            batch_sizes=config["batch_sizes"], threads=a.precision_threads or None))
        write_json(config_path, config)
    prec = read_json(path)
    plot_layer_precision(prec, run.out / "layer_precision.png", synthetic=run.data["synthetic"])
    assign, bs = prec["assignment"], str(prec["optimised_batch_size"])
    precision = {
        "budget_points": assign["budget_points"], "batch_size": prec["optimised_batch_size"], "counts": assign["counts"],
        "float32_accuracy": prec["reference"]["accuracy"], "accuracy": assign["accuracy"],
        "drop_points": assign["drop_points"], "float32_latency_ms": round(prec["reference"]["latency_ms"][bs], 3),
        "latency_ms": round(assign["latency_ms"][bs], 3), "speedup": round(assign["speedup"][bs], 2),
        "samples": prec["samples"], "torch_threads": prec["machine"]["torch_threads"], "fallback": assign["fallback"],
        "profile": "profile/layer_precision.json",
    }
    return {"summary": {"float_accuracy": profile["float_accuracy"], "samples": profile["samples"],
                        "profile": "profile/split_quantization.json", "splits": splits, "precision": precision}}


@stage("export")
def run_export(run: Run) -> dict[str, Any]:
    """The deployment bundle (BundleExporter): levels, exits, FlexDNN exits, profiles, ONNX."""
    out, source, holder = run.out, *run.exit_backbone()
    grow = out / "grow" / "profile.json"
    exits = out / "exits" / "model.ckpt" if (out / "exits" / "calibration.json").exists() else None
    if exits is not None and read_json(out / "exits" / "config.json")["backbone"] != source:
        print(f"export: skipping {exits} (trained on another backbone). HINT: rerun --stages exits")
        exits = None
    flex = out / "flex"
    if not (flex / "config.json").exists() or read_json(flex / "config.json")["backbone"] != source:
        flex = None
    profiles = {name: out / "profile" / f"{name}.json" for name in ("split_quantization", "layer_precision")}
    exporter = BundleExporter(
        dirpath=out, filename="bundle.nfx", exits=exits, calibration=out / "exits" / "calibration.json" if exits else None,
        flex=flex, levels=read_json(grow)["levels"] if source != "baseline" else None,
        switching=read_json(grow).get("switching") if source != "baseline" else None,
        split_profile=profiles["split_quantization"] if profiles["split_quantization"].exists() else None,
        precision_profile=profiles["layer_precision"] if profiles["layer_precision"].exists() else None,
        model_info={"name": run.args.model, "width": run.args.width, "data": run.dm.name, "synthetic": run.data["synthetic"]})
    callback_trainer(run.args, [exporter]).fit(holder, datamodule=run.dm)  # trains nothing; exports at the end
    return {"summary": {"bundle": "bundle.nfx", **{k: v for k, v in exporter.result.items() if k != "bundle"}}}


def data_module(a: argparse.Namespace, **overrides: Any):
    """The DataModule the flags ask for, and the line saying which data it is and why."""
    kwargs = dict(download=a.download, batch_size=a.batch_size, num_workers=a.num_workers,
                  max_train_samples=a.max_train_samples, val_size=a.val_size, seed=a.seed,
                  train_size=a.synthetic_train_size, test_size=a.synthetic_test_size) | overrides
    return resolve_data(a.data, a.data_dir, **kwargs)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dm, message = data_module(args)
    print(message)
    summary_path = out / "summary.json"
    summary: dict[str, Any] = read_json(summary_path) if summary_path.exists() else {}
    data = {"name": dm.name, "synthetic": bool(dm.synthetic), "seed": args.seed, "source": message}
    if dm.synthetic:
        data.update(train_size=dm.train_size, test_size=dm.test_size)
    run = Run(args, dm, data)
    summary.update(data=data, model={"name": args.model, "width": args.width, "num_classes": dm.num_classes,
                                     "input_shape": list(dm.input_shape)}, machine=machine())
    # wall seconds per stage: what it took when it ran (a reused stage keeps its earlier time and is
    # listed in `reused`); `seconds` is this invocation's wall time
    timing: dict[str, Any] = {"stages": {}, "seconds": 0.0, "reused": []}
    start = time.perf_counter()
    for i, name in enumerate(args.stage_list, 1):
        print(f"== stage {i}/{len(args.stage_list)}: {name}")
        t0, run.opened = time.perf_counter(), None
        result = STAGES[name](run)
        summary[SUMMARY_KEYS.get(name, name)] = result["summary"]
        summary.update(result.get("top", {}))  # keys a stage also puts at the top level (grow: levels, memory)
        seconds = time.perf_counter() - t0
        timing["stages"][name] = run.opened.record_seconds(seconds) if run.opened else round(seconds, 1)
        if run.opened is not None and run.opened.reused:
            timing["reused"].append(name)
        timing["seconds"] = round(time.perf_counter() - start, 1)
        summary["timing"] = timing
        write_json(summary_path, summary)  # after every stage: a crash later keeps what is done
        print(f"== stage {name} done in {seconds:.0f} s ({timing['seconds']:.0f} s so far)")
    print(f"summary: {summary_path}")
    print_summary(summary, out)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
