#!/usr/bin/env python
"""End-to-end nestflex recipe: VGG on CIFAR-10 (or MNIST, or the embedded synthetic default).

    python recipes/vgg_cifar.py                      # defaults: synthetic data if no CIFAR-10
    python recipes/vgg_cifar.py --data cifar10 --data-dir ~/data --width 1 --epochs 160
    python recipes/vgg_cifar.py --data mnist --data-dir ~/mnist   # the four IDX files; 1x32x32 input
    python recipes/vgg_cifar.py --config my_run.yaml --epochs 2    # options from a file; flags override it

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

The options are one typed config, ``recipes/vgg_cifar_config.py`` (``--print-config`` shows them).
Resume and caching live in ``recipes/_run.py``: a stage whose configuration matches what an
earlier run left in ``--out`` is reused, a killed one resumes from its last checkpoint.
Everything lands in ``--out``: ``summary.json`` (documented in docs/recipes.md), plots, logs
and checkpoints.
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the recipes' own helpers, beside this file
from _config import parse_config  # noqa: E402
from _run import (Run, callback_trainer, data_module, largest_level, open_run, plot_curves,  # noqa: E402
                  plot_roadmap, run_stages)
from _summary import flex_summary, print_summary, profile_summary, prune_summary  # noqa: E402
from vgg_cifar_config import VggCifarConfig  # noqa: E402
from nestflex._machine import machine
from nestflex.callbacks import BundleExporter, FilterPruning, FlexDNNExits, FreezeAndGrow, OverthinkingSchedule
from nestflex.exits import MultiExitClassifier, evaluate_flex
from nestflex.exits.placement import parse_positions
from nestflex.graph import trace
from nestflex.pruning import Roadmap, load_pruned
from nestflex.pruning.callback import CONFIRM_BACKOFFS
from nestflex.training import ImageClassifier

#: summary.json key of each stage's results, where it differs from the stage name
SUMMARY_KEYS = {"profile": "quantization", "prune": "pruning", "flex": "flexdnn"}


def parse_args(argv: list[str] | None = None) -> VggCifarConfig:
    """The run's options: the defaults, then ``--config FILE``, then the flags."""
    return parse_config(VggCifarConfig, argv, description=__doc__)


def run_baseline(run: Run) -> dict[str, Any]:
    c, dm = run.cfg, run.dm
    st = run.stage("baseline", {"model": c.model, "width": c.width, "epochs": c.epochs, "batch_size": c.data.batch_size,
                                "lr": c.lr, "seed": c.seed, "data": run.data,
                                "max_train_samples": c.data.max_train_samples, "val_size": c.data.val_size})
    if st.done("model.ckpt", "result.json"):
        return {"summary": st.read("result.json")}
    resume = st.begin()
    pl.seed_everything(c.seed, workers=True)
    module = ImageClassifier(c.model, num_classes=dm.num_classes, width=c.width, lr=c.lr, max_epochs=c.epochs,
                             input_shape=dm.input_shape)
    trainer = st.trainer(c, [], c.epochs, resume)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    test = trainer.test(module, datamodule=dm, verbose=False)[0]
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    graph = trace(module.model.cpu(), dm.input_shape)
    result = {"accuracy": round(float(test["test_acc"]), 4), "params": graph.params(), "macs": graph.macs(),
              "epochs": c.epochs, "train_seconds": round(seconds, 1), "checkpoint": "baseline/model.ckpt"}
    st.write("result.json", result)
    run.modules["baseline"] = module
    plot_curves(run.out / "logs", "baseline", run.out / "baseline_curves.png", run.data["synthetic"])
    return {"summary": result}


def run_prune(run: Run) -> dict[str, Any]:
    """NestDNN filter pruning of the baseline: roadmap.json + the seed model."""
    c, p, base = run.cfg, run.cfg.prune, run.baseline()
    budget = None if p.retry_budget < 0 else p.retry_budget
    # as runs before --prune-round-to, --prune-target and --prune-target-cost: their defaults leave the stage's
    # config as it was
    options = {k: v for k, v in asdict(p).items()
               if (k, v) not in (("round_to", 1), ("target", None), ("target_cost", None), ("cost", "macs"),
                                 ("latency_table", None), ("latency_threads", 1), ("snap", "nearest"),
                                 ("step_cap", None), ("decision", "threshold"), ("confidence", 0.9),
                                 ("confirm", None))}
    if p.decision == "threshold":  # the bound's confidence judges nothing
        options.pop("confidence", None)
    if p.cost == "macs" and p.round_to == 1:  # any width may be taken: nothing to snap to
        options.pop("snap", None)
    st = run.stage("prune", {"baseline": run.config("baseline"), **options, "retry_budget": budget})
    # room for every step to be recovered and retried twice (the back-off), then the seed's fine-tuning;
    # the callback stops the Trainer when done
    epochs = (p.epochs_per_step + p.recover_epochs) * p.max_steps * 3 + p.finetune_epochs * (
        1 + (CONFIRM_BACKOFFS if p.confirm is not None else 0))  # each unconfirmed seed's successor is fine-tuned
    module = ImageClassifier(**dict(base.hparams) | {"lr": p.lr, "max_epochs": epochs,
                                                     "restart_epochs": p.epochs_per_step})
    if st.done("result.json", "roadmap.json", "seed.ckpt"):
        return {"summary": st.read("result.json")}
    resume = st.begin()
    module.model.load_state_dict(base.model.state_dict())
    pl.seed_everything(c.seed, workers=True)
    kwargs = {"triplets": p.triplets, "seed": c.seed} if p.criterion == "trr" else {}
    kwargs = {"seed": c.seed} if p.criterion == "random" else kwargs
    if p.target is not None:  # a MACs budget
        mode = {"target_macs": p.target}
    elif p.target_cost is not None:  # a budget in the latency table's time (the config checked --prune-cost)
        mode = {"target_cost": p.target_cost}
    else:  # the accuracy-goal mode (NestDNN's)
        mode = {"max_drop": p.max_drop / 100}
    cost = latency_table(run, st.dir) if p.cost == "latency" else None
    pruner = FilterPruning(p.criterion, **mode, step=p.step, epochs_per_step=p.epochs_per_step,
                           max_steps=p.max_steps, recover_epochs=p.recover_epochs, finetune_epochs=p.finetune_epochs,
                           retry_budget=budget, round_to=p.round_to, snap=p.snap, step_cap=p.step_cap, dirpath=st.dir,
                           criterion_kwargs=kwargs, cost=cost, confirm=p.confirm,
                           **({"decision": "paired", "confidence": p.confidence} if p.decision == "paired" else {}))
    trainer = st.trainer(c, [pruner], epochs, resume, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=run.dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    load_pruned(module, st.dir / "seed.ckpt")  # the module ends as the seed; stated here for a resumed run too
    road = Roadmap.load(st.dir / "roadmap.json")
    test = trainer.test(module, datamodule=run.dm, verbose=False)[0]
    result = prune_summary(road, test["test_acc"], seconds) | {"mode": road.mode, "target_macs": road.target_macs,
                                                                "target_cost": road.target_cost}
    if road.cost is not None:  # the seed's and the vanilla model's time as the table prices them
        result["cost"] = {k: road.cost[k] for k in road.cost if k != "widths"} | {
            "seed": road.seed.cost, "vanilla": road.footprints[0].cost, "table": "prune/latency_table.json"}
    st.write("result.json", result)
    plot_roadmap(road, run.out / "prune_roadmap.png", run.data["synthetic"])
    return {"summary": result}


def latency_table(run: Run, where: Path) -> Any:
    """The latency table the prune stage plans with: ``--latency-table`` (built on the device), else
    measured here on the baseline's layers; a copy is kept in the stage's folder either way."""
    from nestflex.profiling import LatencyTable
    from nestflex.pruning import build_latency_table

    p, path = run.cfg.prune, where / "latency_table.json"
    if p.latency_table is not None:
        table = LatencyTable.load(p.latency_table)
    elif path.is_file():  # a resumed stage measures nothing twice
        table = LatencyTable.load(path)
    else:
        net = run.baseline().model
        table = build_latency_table(net, net.input_shape, threads=p.latency_threads)
        print(f"prune: latency table of {len(table.entries)} layer shapes measured in {table.meta['seconds']} s")
    table.save(path)
    return table


def run_grow(run: Run) -> dict[str, Any]:
    """NestDNN freeze-&-grow from the prune stage's roadmap: the multi-capacity model + profiles."""
    from nestflex.capacity.profile import memory_report, profile_levels, switching_table

    c, g = run.cfg, run.cfg.grow
    road_path, levels = run.roadmap(g.levels)  # the prune stage's, and as many levels as it has (<= --grow-levels)
    st = run.stage("grow", {"prune": run.config("prune"), "levels": levels, "epochs_per_level": g.epochs_per_level,
                            "lr": g.lr, "init": g.init, "train_samples": g.train_samples, "seed": c.seed})
    if st.done("model.ckpt", "result.json"):
        result = st.read("result.json")
        return {"summary": result, "top": {"levels": result["levels"], "memory": result["memory"]}}
    resume = st.begin()
    epochs = (levels - 1) * g.epochs_per_level
    module = ImageClassifier(**dict(run.baseline().hparams) | {"lr": g.lr, "max_epochs": epochs,
                                                               "restart_epochs": g.epochs_per_level})
    grower = FreezeAndGrow(road_path, levels=levels, epochs_per_level=g.epochs_per_level, init=g.init, dirpath=st.dir)
    dm = run.dm if not g.train_samples else data_module(c, max_train_samples=g.train_samples)[0]
    pl.seed_everything(c.seed, workers=True)
    trainer = st.trainer(c, [grower], epochs, resume, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    seconds = time.perf_counter() - start
    trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
    run.modules["grow"] = module
    run.dm.setup("test")
    net = module.model.cpu()
    # test split: the levels were trained and evaluated (capacity.json) on train/validation only
    rows = profile_levels(net, run.dm.test_dataloader(), batch_sizes=(1, 64), repeats=g.latency_repeats)
    memory = memory_report(net)
    st.write("profile.json", {"levels": rows, "memory": memory, "switching": switching_table(net, repeats=3),
                              "machine": machine()})
    memory = {k: memory[k] for k in ("multi_capacity_mb", "independent_mb", "largest_level_mb", "ratio_to_largest")}
    result = {"steps": list(grower.plan.steps), "epochs_per_level": g.epochs_per_level, "init": g.init,
              "levels": rows, "memory": memory, "seconds": round(seconds, 1), "capacity": "grow/capacity.json",
              "profile": "grow/profile.json", "checkpoint": "grow/model.ckpt"}
    st.write("result.json", result)
    return {"summary": result, "top": {"levels": rows, "memory": memory}}


def run_exits(run: Run) -> dict[str, Any]:
    """Progressive exits (SPINN/SDN): train, calibrate on validation, report on test."""
    from nestflex.exits.report import evaluate_exits, exits_summary, plot_tradeoff

    c, e, dm = run.cfg, run.cfg.exits, run.dm
    source, holder = run.exit_backbone()
    st = run.stage("exits", {"baseline": run.config("baseline"), "backbone": source,
                             "positions": parse_positions(e.positions), "head": e.head, "mode": e.mode,
                             "epochs": e.epochs, "lr": e.lr, "batch_size": c.data.batch_size, "seed": c.seed})
    if st.done("model.ckpt", "train.json"):
        module = MultiExitClassifier.load_from_checkpoint(st.dir / "model.ckpt", map_location="cpu", weights_only=True)
        trained = st.read("train.json")
    else:
        resume = st.begin()
        pl.seed_everything(c.seed, workers=True)
        module = MultiExitClassifier(c.model, num_classes=dm.num_classes, width=c.width,
                                     positions=st.config["positions"], head=e.head, mode=e.mode, lr=e.lr,
                                     max_epochs=e.epochs, backbone=largest_level(holder), input_shape=dm.input_shape)
        trainer = st.trainer(c, [OverthinkingSchedule()], e.epochs, resume)
        start = time.perf_counter()
        trainer.fit(module, datamodule=dm, ckpt_path=resume)
        trained = {"epochs": e.epochs, "train_seconds": round(time.perf_counter() - start, 1)}
        trainer.save_checkpoint(st.dir / "model.ckpt", weights_only=True)
        st.write("train.json", trained)
    dm.setup("fit")
    net = module.model.cpu()
    calibration, test = evaluate_exits(net, dm.val_dataloader(), dm.test_dataloader(), confidence=e.confidence,
                                       fallback=e.fallback)
    st.write("calibration.json", calibration)
    st.write("test.json", test)
    run.modules["exits"] = module
    summary = {"head": e.head, "mode": e.mode,
               "backbone_source": "baseline" if source == "baseline" else "grow (largest level)",
               **trained, **exits_summary(net, calibration, test), "calibration": "exits/calibration.json",
               "test_profile": "exits/test.json", "checkpoint": "exits/model.ckpt"}
    other = test["sweep_other_fallback"]
    plot_tradeoff({f"{e.mode}, {e.head} heads, fallback {e.fallback}": test["sweep"],
                   f"{e.mode}, {e.head} heads, fallback {other['fallback']}": other["sweep"]},
                  test["final_accuracy"], run.out / "exits_tradeoff.png", f"{c.model} x{c.width}: early exits",
                  synthetic=run.data["synthetic"],
                  marks={"lossless thresholds (validation), fallback final": test["at_thresholds"]})
    return {"summary": summary}


def run_flex(run: Run) -> dict[str, Any]:
    """FlexDNN exits on the exits stage's backbone: rank, search, plan (FlexDNNExits); measured on test."""
    from safetensors.torch import load_file

    from nestflex.exits import build_flex_network
    from nestflex.pruning import accuracy

    c, f, dm = run.cfg, run.cfg.flex, run.dm
    source, holder = run.exit_backbone()
    st = run.stage("flex", {"baseline": run.config("baseline"), "backbone": source, **asdict(f),
                            "positions": parse_positions(f.positions), "seed": c.seed, "calibration_folds": 5})
    dm.setup("fit")
    if not st.done("report.json", "spec.json"):
        st.begin()
        n_train = len(dm.train_dataset) if f.train_samples is None else f.train_samples
        config = {"locations": st.config["positions"], "exits_per_location": f.exits_per_location,
                  "base_width": f.base_width, "epochs": f.epochs, "rate_tolerance": f.rate_tolerance,
                  "rank_samples": min(1000, f.val_samples), "fit_samples": min(2000, n_train), "seed": c.seed,
                  "calibration_folds": 5}
        n_val = f.val_samples + f.calibration_samples
        flex = FlexDNNExits(dirpath=st.dir, config=config, calibration_fraction=f.calibration_samples / n_val,
                            train_samples=f.train_samples, val_samples=n_val)
        callback_trainer([flex]).fit(copy.deepcopy(holder), datamodule=dm)  # trains nothing; FlexDNN runs at the end
    spec, report = st.read("spec.json"), st.read("report.json")
    summary = flex_summary(spec, report)
    if spec["exits"]:
        net = build_flex_network(largest_level(holder).eval(), spec)
        net.load_state_dict(load_file(st.dir / "model.safetensors"))
        test = evaluate_flex(net, spec, dm.test_dataloader())
        summary.update(accuracy=test["accuracy"], mean_macs=test["mean_macs"], mean_macs_fraction=test["mean_macs_fraction"],
                       backbone_accuracy=test["final_accuracy"], exit_rate=test["exit_rate"],
                       checkpoint="flex/model.safetensors")
    else:  # no exit pays for itself: the plan is the backbone alone, and the summary says what that gives
        acc = accuracy(largest_level(holder).eval(), dm.test_dataloader())
        summary.update(accuracy=acc, mean_macs=report["backbone_macs"], mean_macs_fraction=1.0, backbone_accuracy=acc,
                       exit_rate=[])
    return {"summary": summary}


def run_profile(run: Run) -> dict[str, Any]:
    """Split quantisation (accuracy, bytes, codec time per <split, bitwidth>) and per-layer precision profiles."""
    from nestflex.profiling import DEFAULT_PRECISIONS, profile_layer_precision, profile_split_quantization
    from nestflex.profiling.plots import plot_layer_precision, plot_split_quantization

    n, pr, net = run.cfg.profile.samples, run.cfg.precision, run.baseline().model.cpu()
    base = run.config("baseline")
    # validation split: thresholds, bitwidths and precisions are chosen on it, never on the test set
    run.dm.setup("fit")
    st = run.stage("profile", {"baseline": base, "samples": n, "codec": "blosc_lz4"})
    if not st.done("split_quantization.json"):
        st.begin()
        st.write("split_quantization.json", profile_split_quantization(net, run.dm.val_dataloader(), max_samples=n))
    split = st.read("split_quantization.json")
    plot_split_quantization(split, run.out / "split_quantization.png", synthetic=run.data["synthetic"])
    # a cache of its own: a new budget re-profiles the precisions, not the splits; one thread by default
    # (--precision-threads): steadier per-layer timings on a busy 2-core machine
    config = {"baseline": base, "samples": n, "calibration_samples": pr.calibration, "budget_points": pr.budget,
              "precisions": list(DEFAULT_PRECISIONS), "batch_sizes": [64, 1], "threads": pr.threads}
    prec = st.cached("layer_precision.json", config, lambda: profile_layer_precision(
        net, run.dm.val_dataloader(), precisions=config["precisions"], budget_points=pr.budget, max_samples=n,
        calibration_samples=pr.calibration, batch_sizes=config["batch_sizes"], threads=pr.threads or None))
    plot_layer_precision(prec, run.out / "layer_precision.png", synthetic=run.data["synthetic"])
    return {"summary": profile_summary(split, prec)}


def run_export(run: Run) -> dict[str, Any]:
    """The deployment bundle (BundleExporter): levels, exits, FlexDNN exits, profiles, ONNX."""
    source, holder = run.exit_backbone()
    exporter = BundleExporter(dirpath=run.out, filename="bundle.nfx", **run.bundle_parts(source), model_info={
        "name": run.cfg.model, "width": run.cfg.width, "data": run.dm.name, "synthetic": run.data["synthetic"]})
    callback_trainer([exporter]).fit(holder, datamodule=run.dm)  # trains nothing; exports at the end
    return {"summary": {"bundle": "bundle.nfx", **{k: v for k, v in exporter.result.items() if k != "bundle"}}}


#: the stages in the order ``--stages all`` runs them (vgg_cifar_config.STAGES)
STAGES = {"baseline": run_baseline, "prune": run_prune, "grow": run_grow, "exits": run_exits, "flex": run_flex,
          "profile": run_profile, "export": run_export}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_args(argv)
    run = open_run(cfg)
    run.summary.update(model={"name": cfg.model, "width": cfg.width, "num_classes": run.dm.num_classes,
                              "input_shape": list(run.dm.input_shape)}, machine=machine())
    summary = run_stages(run, STAGES, cfg.stage_list, SUMMARY_KEYS)
    print_summary(summary, run.out)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
