"""``FilterPruning``: NestDNN's iterative filter pruning as a Lightning callback.

Add it to an existing ``Trainer``; the user's ``LightningModule`` stays as it is (its
``forward`` must map images to logits). Every ``epochs_per_step`` epochs the callback

1. evaluates the retrained model (top-1 on the validation dataloader) and records a
   :class:`~nestflex.pruning.roadmap.Footprint` if it meets the goal, else rolls the module
   back to the last footprint that did and stops training (in the budget mode, ``target_macs``
   or ``target_cost``, every step is recorded with its accuracy, and training stops once the
   MACs, or the cost, reach the target);
2. ranks the channels of every prunable group with the criterion and physically prunes the
   least important ones (tensors shrink; MACs and params fall), carrying optimizer state.

All decisions happen at the *start* of an epoch, so a checkpoint written at the end of an epoch
holds a consistent state (weights, optimizer, roadmap, RNG), and ``trainer.fit(...,
ckpt_path=...)`` continues the same roadmap. Ranking and evaluation never draw from the global
RNG, which the callback saves and restores with its state.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from nestflex._io import write_json
from nestflex._trainer import infer_input_shape
from nestflex.errors import PruningError
from nestflex.graph import StructureGraph, checked_batches, input_shape_of, trace
from nestflex.graph.surgery import resize_like, state_for
from nestflex.profiling.latency import LatencyTable
from nestflex.pruning._arguments import check_arguments, check_resumed_mode
from nestflex.pruning._lookup import network_attr, train_dataset
from nestflex.pruning._optim import prune_with_optimizers
from nestflex.pruning._rng import _rng_state, _set_rng_state
from nestflex.pruning.budget import COST_DIGITS, Budget, make_budget
from nestflex.pruning.cost import CostModel, cost_allocation, get_cost
from nestflex.pruning.decision import (PairedDecision, check_pairable, confirm_seed, describe_verdict,
                                       paired_decision)
from nestflex.pruning.evaluate import accuracy, trainer_eval_loader
from nestflex.pruning.importance import Importance, get_importance
from nestflex.pruning.roadmap import Footprint, Roadmap
from nestflex.pruning.sensitivity import allocation_weights, sensitivity_profile
from nestflex.pruning.step import budget_scale, decide_step, plan_step, shrink

__all__ = ["FilterPruning", "load_pruned"]

#: the allocation only needs each layer's tolerance, so it profiles fewer points than the benchmark
ALLOCATION_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)
#: how many times an unconfirmed seed gives way to the footprint before it (``confirm``)
CONFIRM_BACKOFFS = 3


def load_pruned(module: torch.nn.Module, checkpoint: str | Path) -> torch.nn.Module:
    """Load a pruned checkpoint (a footprint, the seed) into an unpruned ``module``.

    The checkpoint's names are matched to the module's
    (:func:`~nestflex.graph.surgery.state_for`). The module's tensors are first resized to the
    checkpoint's shapes, then the weights load. Only tensors are read (``weights_only=True``).

    Args:
        module: the LightningModule that was pruned, or its plain network; resized and loaded
            in place.
        checkpoint: path of the pruned checkpoint (a Lightning ``.ckpt`` or a plain
            ``state_dict`` file).

    Returns:
        ``module`` itself, now pruned to the checkpoint's shapes.

    Raises:
        PruningError: a missing checkpoint, or one that does not hold ``module``'s tensors.
    """
    path = Path(checkpoint)
    if not path.exists():
        raise PruningError(f"checkpoint {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state_for(module, state.get("state_dict", state))
    if state is None:
        raise PruningError(f"checkpoint {path} does not hold the tensors of {type(module).__name__}. HINT: pass the "
                           f"module that was pruned, or the network it holds")
    resize_like(module, state)
    module.load_state_dict(state)
    return module


class FilterPruning(Callback):
    """Iterative filter pruning to a seed model, recorded as a roadmap (NestDNN §3.2).

    Args:
        criterion: importance criterion name (``trr``, ``l1``, ``l2``, ``random``) or an
            :class:`~nestflex.pruning.Importance`.
        goal: minimum top-1 accuracy in [0, 1] every kept footprint must meet.
        max_drop: or: the largest accuracy drop from the starting model (0.01 = one point).
        target_macs: or, the budget mode: prune until the model has at most this fraction of the
            starting model's MACs, in (0, 1). Every step is kept whatever its accuracy (no
            recovery epochs, retries or back-off: those judge accuracy) and the roadmap records
            each footprint's accuracy; a step that would go below the target is scaled down to
            land at it (:func:`~nestflex.pruning.budget_scale`). The roadmap's ``mode`` is
            ``macs`` and its status ``target_reached`` once there. Exactly one of ``goal``,
            ``max_drop``, ``target_macs`` and ``target_cost``; the accuracy goal (NestDNN's) is
            the usual mode.
        target_cost: or, the budget mode in the cost model's units: as ``target_macs``, but until
            the model's cost under ``cost`` (e.g. a latency table's predicted milliseconds on the
            device it was measured on) is at most this fraction of the starting model's, in
            (0, 1). Needs ``cost``; the roadmap's ``mode`` is ``cost``.
        epochs_per_step: retraining epochs after each pruning step.
        step: share of a group's channels removed per step by the most tolerant group (others
            in proportion to their tolerance, see ``allocation``), in (0, 1).
        allocation: ``sensitivity`` (per-layer budget from a sensitivity profile of the starting
            model, computed once) or ``uniform`` (every group loses ``step`` of its channels).
        sensitivity_drop: accuracy drop that defines a layer's tolerance in the profile.
        fractions: fractions profiled per layer for the allocation.
        sensitivity_batches: validation batches per point of the sensitivity profile.
        max_steps: stop after this many kept steps even if the goal still holds (or the MACs
            target is not reached yet).
        recover_epochs: a retrained step that misses the goal first gets up to this many more
            retraining epochs, one at a time, before it counts as broken (NestDNN prunes until
            the model can no longer meet the goal *after retraining*; one short retraining
            often lands a fraction of a point low by chance: ``benchmarks/pruning/prune_noise.py``).
        finetune_epochs: once the roadmap ends, train the seed this many more epochs (the usual
            final fine-tuning after pruning: every step had only ``epochs_per_step`` of
            retraining). The fine-tuned weights replace the seed's footprint when they still
            meet the goal and do not fall below it; the roadmap records both accuracies. Needs
            that many epochs left in the Trainer's ``max_epochs``.
        backoff: after a step breaks the goal, roll back to the seed and retry with half the
            step, at most this many times in a row (0: the first broken step ends the roadmap).
            Momentum restarts for the parameters of a retried step.
        retry_budget: retry after at most this many broken steps over the whole roadmap (``None``:
            no bound besides ``backoff``); the next broken step ends it. Each rejected try costs
            a full retraining, so this bounds the pruning time of a roadmap that keeps landing
            a fraction of a point under the goal (the recipe uses 3: docs/pruning.md#time).
        min_channels: channels every group keeps.
        round_to: keep channel counts at multiples of this (8 or 16 suit CPU SIMD lanes and
            GPU tiles; the levels grown from the roadmap inherit them): each group's kept count
            is the multiple nearest to the width the unrounded schedule gives it, which the
            footprints record as ``targets`` (:func:`~nestflex.pruning.plan_step`). 1: no rounding.
        snap: which of the widths a group may take (a multiple of ``round_to``, or a width the
            ``cost`` model says is faster) its unrounded target becomes: ``nearest`` (default; every
            committed result was made with it) or ``up``, the smallest at or above the target,
            so a group drops to a faster width only once the schedule has reached it
            (docs/pruning.md#cost-macs-or-measured-latency).
        step_cap: with ``cost``, the most of the model's cost one step may cut, as a multiple of
            ``step`` (2.0: a 5% step cuts at most 10% of the cost); groups past it wait for the
            next step, the most overdue first (:func:`~nestflex.pruning.plan_step`'s ``max_cut``).
            Where many groups share a width they reach their next fast width in the same step,
            and the roadmap jumps past the levels between. ``None`` (default): no cap.
        eval_batches: validation batches per evaluation (``None``: all).
        dirpath: where ``roadmap.json``, ``sensitivity.json``, ``seed.ckpt`` and the footprint
            checkpoints go (default ``<default_root_dir>/pruning``).
        ranking_data: dataset the criterion ranks on (default: the training dataloader's).
        eval_dataloader: loader for evaluations (default: the validation dataloader).
        criterion_kwargs: passed to the criterion factory (e.g. ``{"triplets": 1000}``).
        input_shape: per-sample input shape the module is traced at (MACs, params, groups);
            default: inferred from the module and the Trainer's data
            (:func:`nestflex._trainer.infer_input_shape`: the module's ``input_shape``, its
            ``example_input_array``, the DataModule's ``input_shape``, else the first training
            batch). Evaluation batches of another shape raise ``GraphError``.
        network: attribute of the LightningModule that holds the network (``"model"`` for
            :class:`~nestflex.training.ImageClassifier`); the roadmap names layers relative to
            it and records it, so the roadmap and its checkpoints apply to the module or the
            plain network alike. Default: the one child module that holds every traced layer,
            else the module itself.
        decision: how the accuracy-goal mode judges a retrained step. ``threshold`` (default;
            every committed result was made with it): kept when its measured accuracy is at
            least the goal. ``paired``: broken only when the one-sided upper confidence bound of
            its accuracy difference to the start model, on the same validation images, is below
            ``-(start - goal)`` (:func:`~nestflex.pruning.paired_decision`), so a step the split
            cannot tell from the goal is kept; each footprint records the statistics
            (``decision``). Needs a deterministic evaluation loader and one process (no DDP).
            The budget mode judges no step, so takes only ``threshold``.
        confidence: the paired rule's one-sided confidence, in (0.5, 1): a step whose true
            accuracy is exactly at the goal is rejected about ``1 - confidence`` of the time.
        cost: what a step saves: ``None`` (NestDNN's allocation, MACs), ``"macs"``, a
            :class:`~nestflex.pruning.CostModel` or a :class:`~nestflex.profiling.LatencyTable`; with
            one, steps go by cost saved per accuracy risked, at the widths it says are worth having
            (:func:`~nestflex.pruning.cost_allocation`; not with ``round_to`` > 1; docs/pruning.md#cost).
        approximate: also prune the groups :func:`~nestflex.graph.trace` offers with ``approximate=True``
            (a LayerNorm-normalised residual stream, GRN channels, weight-standardised inputs): their
            statistics change, so pruned no longer equals masked; steps are still judged on accuracy
            and the roadmap replays with it (docs/pruning.md#approximate). ``False`` (default): locked.
        confirm: ``None`` (default), or a confidence in (0.5, 1): once the roadmap ends (and the seed
            is fine-tuned), the seed stays only when the paired lower bound of its accuracy difference
            to the start model is within the goal (:func:`~nestflex.pruning.confirm_seed`); else the
            footprint before it becomes the seed, fine-tuned (where epochs are left) and judged, at
            most ``CONFIRM_BACKOFFS`` times, the last one kept whatever its verdict (each recorded in
            ``roadmap.confirm``). As ``paired``: a deterministic evaluation loader, one process; needs
            a goal below the start (``max_drop`` > 0), not the budget mode.

    Example::

        trainer = pl.Trainer(max_epochs=40, callbacks=[FilterPruning("trr", max_drop=0.01)])
        trainer.fit(module, datamodule=dm)      # module ends as the seed model
        # the budget mode: half the MACs, whatever the accuracy (the roadmap records it)
        trainer = pl.Trainer(max_epochs=40, callbacks=[FilterPruning("trr", target_macs=0.5)])
    """

    def __init__(
        self,
        criterion: str | Importance = "trr",
        goal: float | None = None,
        max_drop: float | None = None,
        target_macs: float | None = None,
        target_cost: float | None = None,
        epochs_per_step: int = 1,
        step: float = 0.25,
        allocation: str = "sensitivity",
        sensitivity_drop: float = 0.02,
        fractions: Sequence[float] = ALLOCATION_FRACTIONS,
        max_steps: int | None = None,
        recover_epochs: int = 1,
        finetune_epochs: int = 0,
        backoff: int = 2,
        retry_budget: int | None = None,
        min_channels: int = 1,
        round_to: int = 1,
        snap: str = "nearest",
        step_cap: float | None = None,
        eval_batches: int | None = None,
        sensitivity_batches: int | None = 4,
        dirpath: str | os.PathLike | None = None,
        ranking_data: Any = None,
        eval_dataloader: Any = None,
        criterion_kwargs: dict[str, Any] | None = None,
        input_shape: Sequence[int] | None = None,
        network: str | None = None,
        decision: str = "threshold",
        confidence: float = 0.9,
        cost: str | CostModel | LatencyTable | None = None,
        approximate: bool = False,
        confirm: float | None = None,
    ) -> None:
        check_arguments(goal=goal, max_drop=max_drop, target_macs=target_macs, target_cost=target_cost,
                        epochs_per_step=epochs_per_step, step=step, sensitivity_drop=sensitivity_drop,
                        max_steps=max_steps, recover_epochs=recover_epochs, finetune_epochs=finetune_epochs,
                        backoff=backoff, retry_budget=retry_budget, min_channels=min_channels, round_to=round_to,
                        eval_batches=eval_batches, sensitivity_batches=sensitivity_batches, snap=snap,
                        allocation=allocation, decision=decision, confidence=confidence, approximate=approximate,
                        step_cap=step_cap, cost=cost, confirm=confirm)
        self.step_cap = None if step_cap is None else float(step_cap)
        self.approximate = approximate
        self.decision, self.confidence = decision, float(confidence)
        self.confirm = None if confirm is None else float(confirm)
        self.cost = get_cost(cost) if cost is not None else None
        if self.cost is not None and round_to > 1:
            raise PruningError(f"`cost`={self.cost.name!r} chooses each group's widths; `round_to`={round_to} would "
                               f"too. HINT: leave `round_to` at 1 with a cost model")
        self.criterion = get_importance(criterion, **(criterion_kwargs or {}))
        self.goal, self.max_drop = goal, max_drop
        # None in the accuracy mode; the budget's measure otherwise (MACs, or the cost model's units)
        self.budget: Budget | None = make_budget(target_macs, target_cost, self.cost)
        self.target_macs = self.budget.target if target_macs is not None else None
        self.target_cost = self.budget.target if target_cost is not None else None
        self.mode = self.budget.mode if self.budget else "accuracy"
        self.epochs_per_step, self.step, self.allocation = epochs_per_step, float(step), allocation
        self.sensitivity_drop, self.fractions = sensitivity_drop, tuple(fractions)
        self.max_steps, self.min_channels, self.backoff = max_steps, min_channels, backoff
        self.retry_budget = retry_budget
        self.recover_epochs, self.finetune_epochs, self.round_to = recover_epochs, finetune_epochs, round_to
        self.snap = snap
        self.eval_batches, self.sensitivity_batches = eval_batches, sensitivity_batches
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.ranking_data, self.eval_dataloader = ranking_data, eval_dataloader
        # validated now (raises GraphError naming `input_shape`); None: each module's own, at use
        self.input_shape = input_shape_of(torch.nn.Module(), input_shape) if input_shape is not None else None
        if network is not None and not isinstance(network, str):
            raise PruningError(f"`network` must be an attribute name such as 'model', got {network!r}")
        self.network = network
        self._reset()

    def _reset(self) -> None:
        self.roadmap: Roadmap | None = None
        self._kept: dict[str, list[int]] = {}
        self._targets: dict[str, int] = {}  # unrounded width per group (round_to > 1)
        self._weights: dict[str, float] = {}
        self._step_index = 0
        self._step_start = 0
        self._pending = False
        self._done = False
        self._scale = 1.0  # halved by each retry after a broken step
        self._retries = 0
        self._recovered = 0  # extra retraining epochs the pending step has had
        self._finetune_until: int | None = None  # epoch the seed's fine-tuning ends at, while it runs
        self._finetunes = True  # whether the seed is fine-tuned (not when the roadmap ran out of epochs)
        self._eval_samples = 0  # samples of the last evaluation
        self._last_hits: torch.Tensor | None = None  # per-sample correct flags of the last evaluation (paired)
        self._start_hits: torch.Tensor | None = None  # ... of the start model, what every step is paired with
        self._scores: dict[int, torch.Tensor] | None = None  # valid for the current weights only
        self._traced_shape: tuple[int, ...] | None = None
        self._found_network = ""  # until the roadmap records it

    @property
    def state_key(self) -> str:
        key = {"criterion": self.criterion.name, "goal": self.goal, "max_drop": self.max_drop}
        if self.budget is not None:  # the accuracy mode keeps the key its checkpoints were saved under
            key[self.budget.arg] = self.budget.target
        return self._generate_state_key(**key)

    # ------------------------------------------------------------------ hooks (routing only)
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "pruning"
        if stage == "fit":
            # Resuming: Lightning loads the checkpoint's (pruned) weights into the unpruned module
            # before any callback hook sees the checkpoint, so the module itself resizes its
            # tensors to the incoming shapes first. Armed only until training starts.
            self._resize_hook = pl_module.register_load_state_dict_pre_hook(_resize_before_load)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._disarm()

    def _disarm(self) -> None:
        if getattr(self, "_resize_hook", None) is not None:
            self._resize_hook.remove()
            self._resize_hook = None

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._advance(trainer, pl_module, final=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._advance(trainer, pl_module, final=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        crit = getattr(self.criterion, "state_dict", None)
        return {
            "mode": self.mode,
            "target_macs": self.target_macs,
            "target_cost": self.target_cost,
            "roadmap": self.roadmap.to_dict() if self.roadmap else None,
            "kept": self._kept,
            "targets": self._targets,
            "weights": self._weights,
            "step_index": self._step_index,
            "step_start": self._step_start,
            "pending": self._pending,
            "done": self._done,
            "scale": self._scale,
            "retries": self._retries,
            "recovered": self._recovered,
            "finetune_until": self._finetune_until,
            "finetunes": self._finetunes,
            "start_hits": self._start_hits,
            "criterion": crit() if crit else None,
            "rng": _rng_state(),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_resumed_mode(state, {"mode": self.mode, "target_macs": self.target_macs, "target_cost": self.target_cost})
        self._reset()
        self.roadmap = Roadmap.from_dict(state["roadmap"]) if state["roadmap"] else None
        self._kept = {k: list(v) for k, v in state["kept"].items()}
        self._targets = dict(state.get("targets") or {k: len(v) for k, v in self._kept.items()})
        self._weights = dict(state["weights"])
        self._step_index, self._step_start = state["step_index"], state["step_start"]
        self._pending, self._done = state["pending"], state["done"]
        self._scale, self._retries = state["scale"], state["retries"]
        self._recovered = state.get("recovered", 0)
        self._finetune_until = state.get("finetune_until")
        self._finetunes = state.get("finetunes", True)
        self._start_hits = state.get("start_hits")
        if state.get("criterion") is not None and hasattr(self.criterion, "load_state_dict"):
            self.criterion.load_state_dict(state["criterion"])
        _set_rng_state(state["rng"])

    # ------------------------------------------------------------------ the roadmap
    def _advance(self, trainer: pl.Trainer, pl_module: pl.LightningModule, final: bool) -> None:
        if self._done:
            trainer.should_stop = True
            return
        completed = trainer.current_epoch
        if self._finetune_until is not None:
            if final or completed >= self._finetune_until:
                self._finetunes = self._finetunes and not final  # no epoch follows: a back-off is judged at once
                self._finish_finetune(trainer, pl_module, completed)
            return
        if self.roadmap is None:
            if final:
                return
            self._start(trainer, pl_module)
        elif self._pending and completed - self._step_start >= self.epochs_per_step + self._recovered:
            self._finish_step(trainer, pl_module, completed)
        if self._done or self._finetune_until is not None:  # ended, maybe fine-tuning the seed: no more steps
            return
        on_target = not self._pending and self._on_target()
        if final:
            reached = self.max_steps is not None and len(self.roadmap.footprints) - 1 >= self.max_steps and not self._pending
            status = "target_reached" if on_target else "max_steps" if reached else "max_epochs"
            self._stop(trainer, pl_module, status, finetune=False)
        elif not self._pending:
            max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
            if on_target:
                self._stop(trainer, pl_module, "target_reached")
            elif self.max_steps is not None and len(self.roadmap.footprints) - 1 >= self.max_steps:
                self._stop(trainer, pl_module, "max_steps")
            elif max_epochs is not None and completed + self.epochs_per_step > max_epochs:
                self._stop(trainer, pl_module, "max_epochs")  # a step that cannot finish retraining
            else:
                self._prune(trainer, pl_module, completed)

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.decision == "paired" or self.confirm is not None:
            check_pairable(trainer.world_size, self._eval_loader(trainer),
                           "`decision`='paired'" if self.decision == "paired" else f"`confirm`={self.confirm}")
        start = self._evaluate(trainer, pl_module, self.eval_batches)
        self._start_hits = self._last_hits
        # the budget mode judges no step on accuracy: its goal is 0, which every footprint meets
        goal = self.goal if self.goal is not None else 0.0 if self.max_drop is None else max(0.0, start - self.max_drop)
        if goal > start:
            raise PruningError(
                f"`goal`={goal:.4f} is above the starting accuracy {start:.4f}; no footprint could meet it. "
                "HINT: lower `goal`, or train the model first"
            )
        graph = self._trace(trainer, pl_module)
        groups = graph.prunable_groups
        if not groups:
            raise PruningError(
                f"{type(pl_module).__name__} has no prunable channel group (all are locked: "
                f"{'; '.join(f'{g.name}: {g.reason}' for g in graph.groups) or 'no conv/linear'})"
            )
        network = self._found_network = network_attr(pl_module, graph, self.network)
        self.roadmap = Roadmap(
            model=type(pl_module).__name__, criterion=self.criterion.name, goal=round(goal, 6),
            start_accuracy=round(start, 6), groups={self._name(g): g.width for g in groups}, network=network,
            input_shape=list(self._shape(trainer, pl_module)), eval_samples=self._eval_samples or None,
            mode=self.mode, target_macs=self.target_macs, target_cost=self.target_cost, approximate=self.approximate,
        )
        noise = self.roadmap.noise()
        if noise and noise["warning"] and trainer.is_global_zero:
            warnings.warn(f"FilterPruning: {noise['warning']}", UserWarning, stacklevel=2)
        self._kept = {self._name(g): list(range(g.width)) for g in groups}
        self._targets = {self._name(g): g.width for g in groups}
        if self.allocation == "sensitivity":
            self._scores = self._rank(trainer, pl_module, graph)
            profile = sensitivity_profile(
                graph, self._scores, lambda m: self._evaluate(trainer, m, self.sensitivity_batches),
                self.fractions, self.criterion.name,
            )
            if trainer.is_global_zero:
                write_json(self.dirpath / "sensitivity.json", profile)
            ids = {g.id: self._name(g) for g in groups}
            self._weights = {ids[k]: w for k, w in allocation_weights(profile, self.sensitivity_drop).items()}
        else:
            self._weights = {self._name(g): 1.0 for g in groups}
        if self.cost is not None:  # cost saved per accuracy risked, at the widths the cost says are worth it
            ids = {g.id: self._name(g) for g in groups}
            weights, allowed = cost_allocation(graph, {i: self._weights[n] for i, n in ids.items()}, self.cost,
                                               self.step, self.min_channels)
            self._weights = {ids[i]: w for i, w in weights.items()}
            self.roadmap.cost = self.cost.describe() | {"snap": self.snap, "step_cap": self.step_cap,
                                                        "widths": {ids[i]: w for i, w in allowed.items()}}
        self.roadmap.allocation = {k: round(v, 4) for k, v in self._weights.items()}
        self._record(trainer, pl_module, graph, start, trainer.current_epoch)
        if self.budget is not None:
            b, spent = self.budget, self.budget.of(self.roadmap.footprints[0])
            rank_zero_info(f"pruning: start accuracy {start:.4f}, {graph.macs():,} MACs; budget mode: target "
                           f"{b.target:g} of {b.describe()} ({b.amount(b.limit(spent))} of {b.amount(spent)} "
                           f"{b.unit}), every step kept whatever its accuracy")
        else:
            rank_zero_info(f"pruning: start accuracy {start:.4f}, goal {goal:.4f}, {graph.macs():,} MACs")

    def _prune(self, trainer: pl.Trainer, pl_module: pl.LightningModule, completed: int) -> None:
        graph = self._trace(trainer, pl_module)
        scores = self._scores if self._scores is not None else self._rank(trainer, pl_module, graph)
        self._scores = None
        names = {g.id: self._name(g) for g in graph.prunable_groups if self._name(g) in self._kept}
        group_scores = {i: scores[i] for i in names}
        weights = {i: self._weights[n] for i, n in names.items()}
        targets = {i: self._targets[n] for i, n in names.items()}

        allowed = {i: self.roadmap.cost["widths"].get(n) for i, n in names.items()} if self.roadmap.cost else None

        def plan_at(step: float) -> dict[int, torch.Tensor]:
            capped = self.step_cap is not None  # the constructor refused a cap without a cost
            return plan_step(graph, group_scores, weights, step, self.min_channels, self.round_to, targets, allowed,
                             self.snap, price=(lambda w: self.cost(graph, w)) if capped else None,
                             max_cut=self.step_cap * step * self.cost(graph) if capped else None)

        step = self.step * self._scale
        if self.budget is not None:
            widths = graph.widths()
            share = budget_scale(lambda s: self.budget.price(graph, widths | {i: len(k) for i, k in
                                                                             plan_at(step * s).items()}),
                                 self._budget_limit())
            if share < 1.0:
                step *= share
                rank_zero_info(f"pruning: step {self._step_index + 1} scaled to {share:.3g} of the full step, "
                               f"so it lands at the target of {self.budget.describe()}")
        plan = plan_at(step)
        # with widths in steps (round_to, or a cost model's measured widths: on a CPU that runs convs
        # in blocks of 16 a 128-wide layer may have no faster width above 16) every group can be
        # waiting for its next width at once: its target moves on until one gets there, since a step
        # that prunes nothing is not the end of the roadmap; nothing is left once no target moves
        while not plan and (self.round_to > 1 or allowed) and self._shrink_targets(names.values(), step):
            targets.update({i: self._targets[n] for i, n in names.items()})
            plan = plan_at(step)
        if not plan:
            self._stop(trainer, pl_module, "nothing_left")
            return
        self._shrink_targets(names.values(), step)  # a group that waits for its width still moves its target
        for gid, keep in plan.items():
            old = self._kept[names[gid]]
            self._kept[names[gid]] = [old[i] for i in keep.tolist()]
        prune_with_optimizers(pl_module, graph, plan, trainer.optimizers)
        self._rewrap(trainer, pl_module)
        self._step_index += 1
        self._step_start = completed
        self._pending = True
        rank_zero_info(f"pruning: step {self._step_index} pruned to "
                       f"{self._trace(trainer, pl_module).macs():,} MACs; retraining")

    def _finish_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, completed: int) -> None:
        self._pending = False
        acc = self._evaluate(trainer, pl_module, self.eval_batches)
        graph = self._trace(trainer, pl_module)
        if self.budget is not None:  # the budget mode keeps every step; its accuracy is only recorded
            self._record(trainer, pl_module, graph, acc, completed)
            b = self.budget
            rank_zero_info(f"pruning: step {self._step_index} kept (budget mode), accuracy {acc:.4f}, "
                           f"{b.share(self.roadmap.seed, self.roadmap.footprints[0]):.4f} of {b.describe()} "
                           f"(target {b.target:g})")
            return
        paired = self._paired()
        decision = decide_step(acc, self.roadmap.goal, self._scale, self._retries, self.backoff,
                               self._recovered, self.recover_epochs, len(self.roadmap.rejected), self.retry_budget,
                               meets=None if paired is None else not paired.broken)
        verdict = describe_verdict(acc, self.roadmap.goal, paired)
        if decision.action == "recover":
            self._pending = True
            self._recovered += 1
            rank_zero_info(f"pruning: step {self._step_index} {verdict} misses the goal; "
                           f"retraining one more epoch ({self._recovered} of {self.recover_epochs}) before judging")
            return
        self._recovered = 0
        stats = paired.to_dict() if paired is not None else None
        if decision.action == "keep":
            self._record(trainer, pl_module, graph, acc, completed, stats)
            self._retries, self._scale = decision.retries, decision.scale
            rank_zero_info(f"pruning: step {self._step_index} kept, {verdict}")
            return
        self.roadmap.rejected.append(self._footprint(graph, acc, completed, checkpoint=None, decision=stats))
        rank_zero_info(f"pruning: step {self._step_index} broke the goal ({verdict}); not kept")
        if decision.action == "stop":
            if self.retry_budget is not None and len(self.roadmap.rejected) > self.retry_budget:
                rank_zero_info(f"pruning: the retry budget ({self.retry_budget} rejected tries) is spent; "
                               f"the roadmap ends at step {self.roadmap.seed.step}")
            self._stop(trainer, pl_module, decision.status)
            return
        self._retries, self._scale = decision.retries, decision.scale
        self._step_index = self.roadmap.seed.step
        self._rollback(trainer, pl_module)
        # the retry's smaller step starts from the seed's widths, not from the targets it recorded:
        # a target that already passed a width (waiting for it under `snap`) would take it again
        # whatever the step size, and every retry would prune the same plan (latency_roadmap seed 1)
        self._targets = {k: len(v) for k, v in self._kept.items()}
        self._save_roadmap(trainer)
        rank_zero_info(f"pruning: back to step {self._step_index}; retrying with step {self.step * self._scale:.4g}")

    def _paired(self) -> PairedDecision | None:
        """The paired rule's verdict on the last evaluation; ``None`` under the threshold rule."""
        if self.decision != "paired":
            return None
        return paired_decision(*self._pair("`decision`='paired'", self._last_hits), self.confidence)

    def _pair(self, arg: str, hits: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The start model's per-sample results, ``hits`` and the allowed drop, for a paired verdict."""
        if self._start_hits is None or hits is None:
            raise PruningError(f"{arg} has no per-sample results of the start model to pair with (a checkpoint from "
                               f"a run without it?). HINT: resume with the arguments the run started with")
        return self._start_hits, hits, max(self.roadmap.start_accuracy - self.roadmap.goal, 0.0)

    def _rollback(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Restore the seed footprint into the module; optimizers get the restored parameters."""
        names = {id(p): n for n, p in pl_module.named_parameters()}
        slots = [(opt, group, i, names.get(id(p))) for opt in trainer.optimizers
                 for group in opt.param_groups for i, p in enumerate(group["params"])]
        load_pruned(pl_module, self.dirpath / self.roadmap.seed.checkpoint)
        self._kept = self.roadmap.kept(self.roadmap.seed.step)
        self._targets = dict(self.roadmap.seed.targets or {k: len(v) for k, v in self._kept.items()})
        params = dict(pl_module.named_parameters())
        for opt, group, i, name in slots:
            if name is not None and params[name] is not group["params"][i]:
                opt.state.pop(group["params"][i], None)  # shapes changed: momentum restarts
                group["params"][i] = params[name]
        self._rewrap(trainer, pl_module)

    def _stop(self, trainer: pl.Trainer, pl_module: pl.LightningModule, status: str, finetune: bool = True) -> None:
        """End the roadmap; a pruned but unconfirmed step is rolled back to the seed, which is then
        fine-tuned when ``finetune_epochs`` asks for it and training goes on (``finetune``)."""
        if self._pending or status == "goal_broken":
            self._rollback(trainer, pl_module)
            self._pending = False
        self.roadmap.status = status
        self._save_roadmap(trainer)
        self._finetunes = finetune and status != "max_epochs"  # max_epochs: no epoch is left to train
        if self._finetune_room(trainer):
            self._finetune_until = trainer.current_epoch + self.finetune_epochs
            rank_zero_info(f"pruning: done ({status}); fine-tuning the seed (step {self.roadmap.seed.step}) "
                           f"for {self.finetune_epochs} epochs")
            return
        if not self._confirmed(trainer, pl_module, None):
            return
        self._done = True
        trainer.should_stop = True
        seed = self.roadmap.seed
        rank_zero_info(f"pruning: done ({status}); seed = step {seed.step}, accuracy {seed.accuracy:.4f}, {seed.macs:,} MACs"
                       + (self._budget_report() if self.budget is not None else ""))

    def _finish_finetune(self, trainer: pl.Trainer, pl_module: pl.LightningModule, completed: int) -> None:
        """Judge the fine-tuned seed: it replaces the seed's footprint unless it falls below the seed
        (then the seed's weights come back), even where both are under the goal (the paired rule)."""
        seed = self.roadmap.seed
        epochs = self.finetune_epochs - max(self._finetune_until - completed, 0)
        self._finetune_until = None
        acc = self._evaluate(trainer, pl_module, self.eval_batches)
        kept = acc >= seed.accuracy
        self.roadmap.finetune = {"epochs": epochs, "before": seed.accuracy, "after": round(acc, 6), "kept": kept}
        if kept:
            self._step_index = seed.step
            self.roadmap.footprints.pop()
            self._record(trainer, pl_module, self._trace(trainer, pl_module), acc, completed)
        else:
            self._rollback(trainer, pl_module)
            self._save_roadmap(trainer)
        rank_zero_info(f"pruning: fine-tuned seed at {acc:.4f} (was {seed.accuracy:.4f}); "
                       f"{'kept' if kept else 'the seed stays'}")
        if not self._confirmed(trainer, pl_module, self._last_hits if kept else None):
            return
        self._done = True
        trainer.should_stop = True

    def _finetune_room(self, trainer: pl.Trainer) -> bool:
        """Whether the seed is to be fine-tuned now: asked for, a pruned seed, and epochs left."""
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
        room = max_epochs is None or trainer.current_epoch + self.finetune_epochs <= max_epochs
        return bool(self._finetunes and self.finetune_epochs and room and self.roadmap.seed.step > 0)

    def _confirmed(self, trainer: pl.Trainer, pl_module: pl.LightningModule, hits: torch.Tensor | None) -> bool:
        """``confirm``'s verdict on the seed (``hits``: its per-sample results, else it is evaluated); an
        unconfirmed seed gives way to the footprint before it, fine-tuned first (``False``: training
        goes on, then this is asked again) where fine-tuning is on. ``True``: the roadmap is done."""
        while self.confirm is not None and self.roadmap.seed.step > 0:
            if hits is None:
                self._evaluate(trainer, pl_module, self.eval_batches)
                hits = self._last_hits
            seed, v = self.roadmap.seed, confirm_seed(*self._pair(f"`confirm`={self.confirm}", hits), self.confirm)
            self.roadmap.confirm = [*(self.roadmap.confirm or []),
                                    {"step": seed.step, "macs": seed.macs, "accuracy": seed.accuracy, **v.to_dict()}]
            rank_zero_info(f"pruning: seed step {seed.step} {'' if v.confirmed else 'not '}confirmed: {100 * v.estimate:+.2f} "
                           f"points, {100 * v.confidence:g}% lower bound {100 * v.lower:+.2f} vs {-100 * v.max_drop:+.2f}")
            if v.confirmed or sum(not c["confirmed"] for c in self.roadmap.confirm) > CONFIRM_BACKOFFS:
                break
            self.roadmap.footprints.pop()  # recorded under `confirm`; the footprint before it is the seed
            self._step_index, hits, self.roadmap.finetune = self.roadmap.seed.step, None, None  # not fine-tuned (yet)
            self._rollback(trainer, pl_module)
            self._copy_seed(trainer, self.roadmap.seed.checkpoint)
            self._save_roadmap(trainer)
            if self._finetune_room(trainer):  # fine-tuned, then judged again
                self._finetune_until = trainer.current_epoch + self.finetune_epochs
                return False
        self._save_roadmap(trainer)
        return True

    # ------------------------------------------------------------------ helpers
    def _shrink_targets(self, names: Iterable[str], step: float) -> bool:
        """Each group's unrounded target after one step (:func:`shrink`); whether any moved."""
        moved = False
        for name in names:
            new = shrink(self._targets[name], self._weights[name], step, self.min_channels)
            moved |= new != self._targets[name]
            self._targets[name] = new
        return moved

    def _budget_limit(self) -> float:
        return self.budget.limit(self.budget.of(self.roadmap.footprints[0]))

    def _on_target(self) -> bool:
        """The budget mode's stop: the last recorded footprint (the model, between steps) is within the budget."""
        return self.budget is not None and self.budget.reached(self.roadmap.seed, self.roadmap.footprints[0])

    def _budget_report(self) -> str:
        b, seed, start = self.budget, self.roadmap.seed, self.roadmap.footprints[0]
        reached = "reached" if b.reached(seed, start) else "NOT reached"
        return (f"; budget mode: {b.share(seed, start):.4f} of {b.describe()}, target {b.target:g} {reached}; "
                f"accuracy {seed.accuracy:.4f} (start {start.accuracy:.4f})")

    @staticmethod
    def _rewrap(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if isinstance(trainer.strategy.model, DistributedDataParallel):
            # DDP's buckets point at the old parameters: wrap the edited module afresh
            trainer.strategy.model = pl_module
            trainer.strategy.configure_ddp()

    def _footprint(self, graph: StructureGraph, acc: float, epoch: int, checkpoint: str | None,
                   decision: dict[str, Any] | None = None) -> Footprint:
        removed = {n: sorted(set(range(w)) - set(self._kept[n])) for n, w in self.roadmap.groups.items()}
        return Footprint(
            step=self._step_index, accuracy=round(acc, 6), params=graph.params(), macs=graph.macs(),
            widths={n: len(k) for n, k in self._kept.items()}, removed=removed, epoch=epoch, checkpoint=checkpoint,
            targets=dict(self._targets) if self.round_to > 1 or self.cost else None, decision=decision,
            cost=round(self.cost(graph), COST_DIGITS) if self.cost else None,
        )

    def _record(self, trainer, pl_module, graph, acc: float, epoch: int, decision: dict[str, Any] | None = None) -> None:
        rel = f"footprints/step_{self._step_index:03d}.ckpt"
        self._save_checkpoint(trainer, self.dirpath / rel)
        self.roadmap.footprints.append(self._footprint(graph, acc, epoch, rel, decision))
        self._copy_seed(trainer, rel)
        self._save_roadmap(trainer)

    def _copy_seed(self, trainer: pl.Trainer, rel: str) -> None:
        """``seed.ckpt`` becomes a copy of the footprint checkpoint ``rel`` (atomically)."""
        if trainer.is_global_zero:
            tmp = self.dirpath / "seed.ckpt.tmp"
            shutil.copyfile(self.dirpath / rel, tmp)
            os.replace(tmp, self.dirpath / "seed.ckpt")

    def _save_checkpoint(self, trainer: pl.Trainer, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        if trainer.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(tmp, weights_only=True)  # collective; rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, path)  # a crash never leaves a half-written footprint
        trainer.strategy.barrier("nestflex_footprint")

    def _save_roadmap(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero:
            self.roadmap.save(self.dirpath / "roadmap.json")

    def _dist(self, trainer: pl.Trainer) -> dict[str, Any]:
        if trainer.world_size == 1:
            return {}
        return {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "reduce": lambda t: trainer.strategy.reduce(t, reduce_op="sum"),
        }

    def _rank(self, trainer: pl.Trainer, pl_module: pl.LightningModule, graph: StructureGraph) -> dict[int, torch.Tensor]:
        data = None
        if self.criterion.needs_data:
            data = self.ranking_data if self.ranking_data is not None else train_dataset(trainer)
        groups = [g for g in graph.prunable_groups if self._name(g) in self._kept]
        return self.criterion(pl_module, graph, groups, data, **self._dist(trainer))

    def _trace(self, trainer: pl.Trainer, module: torch.nn.Module) -> StructureGraph:  # as this run prunes
        return trace(module, self._shape(trainer, module), approximate=self.approximate)

    def _shape(self, trainer: pl.Trainer, module: torch.nn.Module) -> tuple[int, ...]:
        if self._traced_shape is None:  # the same sources give the same shape after a resume
            self._traced_shape = infer_input_shape(trainer, module, self.input_shape, "FilterPruning")
        return self._traced_shape

    def _name(self, group) -> str:
        """A group's name relative to the network (the roadmap's naming)."""
        network = self.roadmap.network if self.roadmap is not None else self._found_network
        prefix = f"{network}." if network else ""
        return group.name[len(prefix):] if prefix and group.name.startswith(prefix) else group.name

    def _evaluate(self, trainer: pl.Trainer, model: torch.nn.Module, max_batches: int | None) -> float:
        if trainer.fast_dev_run:
            max_batches = 1
        # the first evaluation precedes the first trace: data of another shape fails before any pruning
        # (`model` may be a traced copy without `input_shape`: the shape is the LightningModule's)
        loader = checked_batches(self._eval_loader(trainer), self._shape(trainer, trainer.lightning_module),
                                 "FilterPruning")
        counts: list[int] = []
        hits: list[torch.Tensor] | None = [] if self.decision == "paired" or self.confirm is not None else None
        with torch.random.fork_rng(devices=[]):
            acc = accuracy(model, loader, max_batches=max_batches, counts=counts, hits=hits, **self._dist(trainer))
        self._eval_samples = counts[1]
        self._last_hits = hits[0] if hits else None
        return acc

    def _eval_loader(self, trainer: pl.Trainer):
        return trainer_eval_loader(trainer, self.eval_dataloader, "FilterPruning", PruningError)


def _resize_before_load(module, state_dict, prefix, *_: Any) -> None:
    if not prefix:  # the root call sees the whole state dict
        resize_like(module, state_dict)
