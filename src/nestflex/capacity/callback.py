"""``FreezeAndGrow``: NestDNN's freeze-&-grow recovery as a Lightning callback.

Give it the roadmap of a pruning run and an *unpruned* module of the same architecture. At
``setup`` the callback nests the module in place (every weight stored once, channels in nested
order, switchable BatchNorm; level 0 = the seed footprint's weights). Then level ``k`` (1, 2,
..., K-1) trains for ``epochs_per_level`` epochs with every entry a smaller level uses frozen
bit-identically (:class:`~nestflex.capacity.freeze.LevelFreezer` restores them after every
optimizer step). The level is a pure function of the epoch, so ``trainer.fit(...,
ckpt_path=...)`` resumes mid-growth. At the end the module is at the largest level and
``<dirpath>/capacity.json`` records the plan and each level's validation accuracy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from typing_extensions import override

from nestflex._io import write_json
from nestflex._trainer import infer_input_shape
from nestflex.capacity.freeze import LevelFreezer
from nestflex.capacity.levels import LevelPlan, choose_levels, plan_levels
from nestflex.capacity.model import INITS, check_roadmap, roadmap_sources
from nestflex.capacity.nested import extract_level, is_nested, nest_, set_level
from nestflex.errors import CapacityError, PruningError
from nestflex.graph import checked_batches, input_shape_of, trace
from nestflex.pruning._rng import _rng_state, _set_rng_state
from nestflex.profiling.latency import LatencyTable
from nestflex.pruning.cost import CostModel, get_cost
from nestflex.pruning.evaluate import accuracy, trainer_eval_loader
from nestflex.pruning.roadmap import Roadmap, roadmap_network

__all__ = ["FreezeAndGrow", "level_of_epoch"]


def level_of_epoch(epoch: int, epochs_per_level: int) -> int:
    """The level trained during ``epoch`` (0-based): level 1 first, level 0 is the seed.

    Args:
        epoch: the training epoch, counted from 0.
        epochs_per_level: training epochs spent on each grown level (``>= 1``).

    Returns:
        The level index, ``1 + epoch // epochs_per_level``.
    """
    return 1 + epoch // epochs_per_level


class FreezeAndGrow(Callback):
    """Grow a multi-capacity model from a seed, level by level, freezing what exists (NestDNN §3.3).

    Args:
        roadmap: path of the pruning run's ``roadmap.json`` (its footprint checkpoints are read
            from the same directory).
        levels: number of descendants K, seed and vanilla model included, chosen evenly spaced
            in cost (:func:`~nestflex.capacity.levels.choose_levels`): MACs, the footprints'
            recorded cost when the roadmap was planned with one, or ``cost``.
        steps: or: the roadmap steps of the levels, seed first, ending with 0.
        epochs_per_level: training epochs of each grown level; give the trainer
            ``max_epochs = (levels - 1) * epochs_per_level``.
        init: where grown filters start: ``footprint`` (their values in the level's footprint
            checkpoint, i.e. before the following pruning steps removed them), ``vanilla``
            (the unpruned model's) or ``random`` (the module's own initialisation).
        eval_batches: validation batches per level evaluation (``None``: all).
        dirpath: where ``capacity.json`` goes (default ``<default_root_dir>/capacity``).
        eval_dataloader: loader for evaluations (default: the validation dataloader).
        input_shape: per-sample input shape for tracing; default: the module's ``input_shape``
            attribute (as :class:`~nestflex.training.ImageClassifier` has), else the shape the
            roadmap was traced at, else the Trainer's data
            (:func:`nestflex._trainer.infer_input_shape`). Evaluation batches of another shape
            raise ``GraphError``.
        cost: price the footprints with this cost model and space the levels in it:
            ``"macs"``, a :class:`~nestflex.pruning.CostModel` or a
            :class:`~nestflex.profiling.LatencyTable` (the measured time of each footprint on a
            target device, which need not be the one the roadmap was planned for). ``None``: the
            roadmap's recorded costs, else MACs.

    Example::

        module = ImageClassifier("vgg16", width=0.25, max_epochs=4, restart_epochs=1)
        trainer = pl.Trainer(max_epochs=4, callbacks=[FreezeAndGrow("runs/x/prune/roadmap.json", levels=5)])
        trainer.fit(module, datamodule=dm)      # module ends nested, at its largest level
    """

    def __init__(
        self,
        roadmap: str | os.PathLike,
        levels: int = 5,
        steps: Sequence[int] | None = None,
        epochs_per_level: int = 1,
        init: str = "footprint",
        eval_batches: int | None = None,
        dirpath: str | os.PathLike | None = None,
        eval_dataloader: Any = None,
        input_shape: Sequence[int] | None = None,
        cost: str | CostModel | LatencyTable | None = None,
    ) -> None:
        if not isinstance(levels, int) or isinstance(levels, bool) or levels < 2:
            raise CapacityError(f"`levels` must be an int >= 2 (the seed and the vanilla model at least), got {levels!r}")
        if not isinstance(epochs_per_level, int) or epochs_per_level < 1:
            raise CapacityError(f"`epochs_per_level` must be an int >= 1, got {epochs_per_level!r}")
        if init not in INITS:
            raise CapacityError(f"`init` must be one of {INITS}, got {init!r}")
        if eval_batches is not None and (not isinstance(eval_batches, int) or eval_batches < 1):
            raise CapacityError(f"`eval_batches` must be None or an int >= 1, got {eval_batches!r}")
        self.roadmap_path = Path(roadmap)
        self.levels, self.steps = levels, list(steps) if steps is not None else None
        self.epochs_per_level, self.init, self.eval_batches = epochs_per_level, init, eval_batches
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.eval_dataloader = eval_dataloader
        try:
            self.cost = get_cost(cost) if cost is not None else None
        except PruningError as e:
            raise CapacityError(str(e)) from None
        # validated now; None: the module's own, at use
        self.input_shape = input_shape_of(torch.nn.Module(), input_shape) if input_shape is not None else None
        self.plan: LevelPlan | None = None
        self.records: list[dict[str, Any]] = []
        self._freezer: LevelFreezer | None = None
        self._handles: list[Any] = []
        self._shape: tuple[int, ...] | None = None  # resolved by build()

    @property
    def state_key(self) -> str:
        return self._generate_state_key(roadmap=str(self.roadmap_path), levels=self.levels, init=self.init)

    # ------------------------------------------------------------------ hooks (routing only)
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "capacity"
        if stage != "fit" or is_nested(pl_module):
            return
        # before configure_optimizers and before a resumed checkpoint loads: both see the nested module
        self.plan = self.build(pl_module, trainer)
        set_level(pl_module, 1)

    def build(self, module: torch.nn.Module, trainer: pl.Trainer | None = None) -> LevelPlan:
        """Nest ``module`` (the LightningModule or its network) in place from the roadmap; returns
        the plan (pure routing to helpers)."""
        road = Roadmap.load(self.roadmap_path)
        self._shape = self._resolve_shape(module, road, trainer)
        check_roadmap(module, road, self._shape)
        net = roadmap_network(module, road)
        costs = self._costs(net, road) if self.cost is not None else None
        steps = self.steps if self.steps is not None else choose_levels(road, self.levels, costs)
        if len(steps) != self.levels:
            raise CapacityError(f"`steps` has {len(steps)} entries but `levels`={self.levels}")
        plan = plan_levels(road, steps, costs)
        nest_(net, plan, roadmap_sources(net, road, self.roadmap_path.parent, plan, self.init), self._shape)
        if getattr(net, "input_shape", None) is None:
            net.input_shape = self._shape  # extracted levels carry it: exits and export trace at the real shape
        rank_zero_info(f"freeze-&-grow: {plan.num_levels} levels at roadmap steps {list(plan.steps)}, "
                       f"MACs {list(plan.macs)}" + (f", costs {list(plan.costs)}" if plan.costs else ""))
        return plan

    def _costs(self, net: torch.nn.Module, road: Roadmap) -> dict[int, float]:
        """Each footprint's cost under ``cost``, priced on the unpruned network at its widths."""
        graph = trace(net, self._shape)
        ids = {g.name: g.id for g in graph.groups}
        return {f.step: self.cost(graph, {ids[n]: w for n, w in f.widths.items()}) for f in road.footprints}

    def _resolve_shape(self, module: torch.nn.Module, road: Roadmap, trainer: pl.Trainer | None) -> tuple[int, ...]:
        """The argument, the module's own, the shape the roadmap was traced at, else the data's."""
        if self.input_shape is not None or getattr(module, "input_shape", None) is not None:
            shape = input_shape_of(module, self.input_shape)
            if road.input_shape is not None and tuple(road.input_shape) != shape:
                raise CapacityError(
                    f"FreezeAndGrow traces at per-sample input_shape {shape}, but the roadmap was made at "
                    f"{tuple(road.input_shape)}: its MACs and levels would not describe this model. HINT: grow with "
                    f"the data the roadmap was pruned on (or pass `input_shape={tuple(road.input_shape)}`)")
            return shape
        if road.input_shape is not None:
            return tuple(road.input_shape)
        if trainer is None:
            raise CapacityError("FreezeAndGrow cannot tell the per-sample input shape: the roadmap records none "
                                "(version 1) and the module has no `input_shape`. HINT: pass `input_shape=(C, H, W)`")
        return infer_input_shape(trainer, module, None, "FreezeAndGrow")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        want = (self.plan.num_levels - 1) * self.epochs_per_level
        if trainer.max_epochs is not None and trainer.max_epochs > want:
            rank_zero_info(f"freeze-&-grow: max_epochs={trainer.max_epochs} > {want} epochs of growth; training stops at {want}")
        for opt in trainer.optimizers:
            self._handles.append(opt.register_step_post_hook(lambda *_: self._restore()))
        if not self.records:
            self._evaluate_level(trainer, pl_module, 0)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch
        level = level_of_epoch(epoch, self.epochs_per_level)
        if level >= self.plan.num_levels:
            trainer.should_stop = True
            return
        if self._freezer is None or self._freezer.level != level:
            self._enter(trainer, pl_module, level, fresh=epoch % self.epochs_per_level == 0)

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._freezer is not None:
            self._freezer.mask_gradients()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch
        if self._freezer is None or (epoch + 1) % self.epochs_per_level:
            return
        changed = self._freezer.changed()
        if changed:  # cannot happen unless something writes parameters outside the optimizer
            raise CapacityError(f"frozen entries of {changed} changed while level {self._freezer.level} trained")
        self._evaluate_level(trainer, pl_module, self._freezer.level, epoch + 1)
        if self._freezer.level == self.plan.num_levels - 1:
            trainer.should_stop = True

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.plan is not None:
            set_level(pl_module, self.plan.num_levels - 1)
            self._write(trainer)

    @override
    def state_dict(self) -> dict[str, Any]:
        # the RNG too: a resumed run must shuffle the next epoch as the uninterrupted one does
        return {"records": list(self.records), "rng": _rng_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))
        if "rng" in state_dict:
            _set_rng_state(state_dict["rng"])

    # ------------------------------------------------------------------ helpers
    def _restore(self) -> None:
        if self._freezer is not None:
            self._freezer.restore()

    def _enter(self, trainer: pl.Trainer, pl_module: pl.LightningModule, level: int, fresh: bool) -> None:
        set_level(pl_module, level)
        self._freezer = LevelFreezer(pl_module, level)
        if fresh:
            # a new level starts without the previous level's momentum (a resumed epoch in the
            # middle of a level keeps the optimizer state it was saved with)
            for opt in trainer.optimizers:
                opt.state.clear()
        rank_zero_info(f"freeze-&-grow: level {level} (roadmap step {self.plan.steps[level]}), "
                       f"{self._freezer.trainable:,} trainable entries")

    def _evaluate_level(self, trainer: pl.Trainer, pl_module: pl.LightningModule, level: int, epoch: int = 0) -> None:
        current = self._freezer.level if self._freezer is not None else 1
        set_level(pl_module, level)
        batches = 1 if trainer.fast_dev_run else self.eval_batches
        if self._shape is None:  # nested before this callback saw it
            self._shape = infer_input_shape(trainer, pl_module, self.input_shape, "FreezeAndGrow")
        shape = self._shape
        with torch.random.fork_rng(devices=[]):
            acc = accuracy(pl_module, checked_batches(self._eval_loader(trainer), shape, "FreezeAndGrow"),
                           max_batches=batches)
        graph = trace(extract_level(pl_module, level), shape)
        set_level(pl_module, current)
        self.records = [r for r in self.records if r["level"] != level] + [{
            "level": level, "step": self.plan.steps[level], "accuracy": round(acc, 6),
            "params": graph.params(), "macs": graph.macs(), "epoch": epoch,
        }]
        rank_zero_info(f"freeze-&-grow: level {level} validation accuracy {acc:.4f}")
        self._write(trainer)

    def _write(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero and self.plan is not None:
            write_json(self.dirpath / "capacity.json", {
                "roadmap": str(self.roadmap_path), "init": self.init, "epochs_per_level": self.epochs_per_level,
                "plan": plan_to_dict(self.plan), "levels": sorted(self.records, key=lambda r: r["level"]),
            })

    def _eval_loader(self, trainer: pl.Trainer):
        return trainer_eval_loader(trainer, self.eval_dataloader, "FreezeAndGrow", CapacityError)


def plan_to_dict(plan: LevelPlan) -> dict[str, Any]:
    d = {"steps": list(plan.steps), "macs": list(plan.macs), "order": plan.order, "widths": list(plan.widths)}
    return d | ({"costs": list(plan.costs)} if plan.costs is not None else {})
