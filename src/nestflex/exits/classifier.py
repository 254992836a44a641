"""``MultiExitClassifier``: the LightningModule that trains a :class:`MultiExitNetwork`.

Two modes:

* ``joint`` (SPINN, SDN "SDN training"): backbone and heads trained together from scratch (or
  from the backbone's current weights) with ``L = sum_i tau_i L_i``.
* ``exits_only`` (SDN "IC-only"): the backbone is frozen (no gradients, and kept in eval mode so
  its BatchNorm statistics do not move) and only the heads learn.

The loss weights live in ``loss_weights`` (one per exit, final last; all 1 until something sets
them); the :class:`~nestflex.exits.OverthinkingSchedule` callback sets them every step.
Optimiser and learning-rate schedule are the baseline's (:class:`nestflex.training.ImageClassifier`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_warn
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from nestflex.deploy.exits import ExitError
from nestflex.exits.loss import multi_exit_loss
from nestflex.exits.model import MultiExitNetwork
from nestflex.exits.placement import Position
from nestflex.graph import DEFAULT_INPUT_SHAPE, check_input_shape, input_shape_of
from nestflex.models import create_model
from nestflex.training import ImageClassifier

__all__ = ["MODES", "MultiExitClassifier"]

MODES: tuple[str, ...] = ("joint", "exits_only")


class MultiExitClassifier(pl.LightningModule):
    """Multi-exit training of a registry model (or a given backbone) with per-exit metrics.

    Args:
        model_name: backbone from :func:`nestflex.models.list_models` (or ``timm:<name>``); used
            to rebuild the network from a checkpoint. Default ``vgg16``; with a ``backbone`` of
            your own leave it out: the checkpoint then records the backbone's class, and loading
            it asks for ``backbone=`` instead of rebuilding a wrong network.
        num_classes: classifier outputs.
        width: channel multiplier of the backbone.
        positions: exit positions (MACs fractions in (0, 1) and/or split point names). ``None``
            (default): SPINN's six, or, on a backbone with fewer places for exits, one at each,
            with a warning (:func:`~nestflex.exits.placement.default_positions`); positions
            given explicitly must fit (an ``ExitError`` says where exits can go).
        head: exit head name (:func:`~nestflex.exits.heads.list_heads`); register custom heads by
            name so checkpoints can rebuild them. ``None`` (default): chosen by each exit's layout
            (``sdn`` on feature maps, ``token`` on a transformer's token stream).
        head_kwargs: extra head arguments.
        mode: ``joint`` or ``exits_only``.
        lr: peak learning rate (linear warm-up over the first epoch, then cosine to 0), as
            :class:`~nestflex.training.ImageClassifier`'s.
        momentum: SGD momentum.
        weight_decay: L2 penalty on weights (not on BatchNorm or biases).
        max_epochs: length of the cosine schedule; match ``Trainer(max_epochs=...)``.
        backbone: start from this module (e.g. a trained baseline) instead of a fresh
            ``model_name``; it is used as is, not copied. Not saved in hyperparameters: loading a
            checkpoint rebuilds ``model_name`` (or takes ``backbone=`` again) and then loads the
            weights. In ``joint`` mode it is put in training mode (a backbone left in eval mode
            would train on frozen BatchNorm statistics), with a warning.
        backbone_class: recorded automatically (the class of a ``backbone`` given without
            ``model_name``); do not pass it.
        input_shape: per-sample ``(C, H, W)`` of the data (a DataModule's ``input_shape``); the
            network is traced at it and a fresh ``model_name`` gets ``C`` input channels. Default:
            the backbone's own (:func:`nestflex.graph.input_shape_of`; a grown network records
            it), else, for a fresh ``model_name``, ``(3, 32, 32)``; a backbone of your own without
            one needs it (an error says so). Saved
            (resolved) in the hyperparameters, so a checkpoint rebuilds the same input. Batches of
            another shape raise.

    Raises:
        ExitError: an unknown ``mode`` or head type, an argument out of range, positions that do
            not fit the backbone, a backbone of your own without an ``input_shape``, or
            ``num_classes`` other than the backbone's logits.
        GraphError: the backbone cannot be traced, or its input does not match ``input_shape``.

    Logged: ``train_loss``, ``train_loss_<exit>`` (unweighted, per exit), ``val_loss``,
    ``val_acc`` (final exit), ``val_acc_<exit>`` per early exit, and the same for test.

    Examples:
        >>> module = MultiExitClassifier("resnet20", width=0.25, positions=(0.3, 0.6), mode="exits_only")
        >>> [tuple(z.shape) for z in module(torch.randn(2, 3, 32, 32))]
        [(2, 10), (2, 10), (2, 10)]
        >>> sum(p.requires_grad for p in module.model.backbone.parameters())
        0
    """

    def __init__(
        self,
        model_name: str | None = None,
        num_classes: int = 10,
        width: float = 1.0,
        positions: Sequence[Position] | None = None,
        head: str | None = None,
        head_kwargs: Mapping[str, Any] | None = None,
        mode: str = "joint",
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        max_epochs: int = 10,
        backbone: nn.Module | None = None,
        input_shape: Sequence[int] | None = None,
        backbone_class: str | None = None,
    ) -> None:
        super().__init__()
        if backbone is None and model_name is None and backbone_class is not None:
            raise ExitError(
                f"this MultiExitClassifier was trained on a backbone of your own ({backbone_class}), which a checkpoint "
                f"cannot rebuild. HINT: pass it again: MultiExitClassifier.load_from_checkpoint(path, "
                f"backbone={backbone_class}(...))"
            )
        if backbone is not None and model_name is None:
            backbone_class = type(backbone).__name__
        elif backbone is None:
            model_name = model_name or "vgg16"
        if mode not in MODES:
            raise ExitError(
                f"`mode` must be one of {', '.join(MODES)}, got {mode!r}. HINT: `exits_only` trains heads on a "
                f"frozen pre-trained backbone, `joint` trains everything"
            )
        if head is not None and not isinstance(head, str):
            raise ExitError(
                f"`head` must be a registered head name, got {type(head).__name__}. "
                f"HINT: register it with `nestflex.exits.register_head(name)` so checkpoints can rebuild it"
            )
        for arg, value, ok in (
            ("lr", lr, lr > 0),
            ("momentum", momentum, 0 <= momentum < 1),
            ("weight_decay", weight_decay, weight_decay >= 0),
            ("max_epochs", max_epochs, isinstance(max_epochs, int) and max_epochs >= 1),
        ):
            if not ok:
                raise ExitError(f"`{arg}` is out of range, got {value!r}")
        self.save_hyperparameters(ignore=["backbone"])
        self.hparams.model_name, self.hparams.backbone_class = model_name, backbone_class
        if backbone is not None and input_shape is None and getattr(backbone, "input_shape", None) is None:
            raise ExitError(
                f"MultiExitClassifier cannot tell the per-sample input shape of the backbone {type(backbone).__name__} "
                f"(it has no `input_shape` attribute), and exit positions are measured at it. HINT: pass "
                f"`input_shape=(C, H, W)` (a DataModule's `input_shape`, or `tuple(batch[0].shape[1:])`)"
            )
        shape = input_shape_of(backbone, input_shape) if backbone is not None else tuple(input_shape or DEFAULT_INPUT_SHAPE)
        self.hparams.input_shape = shape  # resolved: the checkpoint must rebuild this input, not the default
        if backbone is None:
            backbone = create_model(model_name, num_classes=num_classes, width=width, in_chans=shape[0])
            backbone.input_shape = shape
        self.model = MultiExitNetwork(backbone, positions=positions, head=head, head_kwargs=head_kwargs,
                                      input_shape=shape)
        if self.model.num_classes != num_classes:
            raise ExitError(
                f"`num_classes`={num_classes} but the backbone returns {self.model.num_classes} logits"
            )
        if mode == "exits_only":
            self.model.backbone.requires_grad_(False)
            self.model.backbone.eval()
        else:
            self._train_backbone()
        self.loss_weights: list[float] = [1.0] * self.model.num_exits
        self.val_acc = nn.ModuleList(
            MulticlassAccuracy(num_classes, average="micro") for _ in range(self.model.num_exits)
        )
        self.test_acc = nn.ModuleList(
            MulticlassAccuracy(num_classes, average="micro") for _ in range(self.model.num_exits)
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape the network is traced at."""
        return self.model.input_shape

    @property
    def exit_positions(self) -> list[float]:
        """``C_i`` of each early exit: its tap's fraction of the backbone MACs."""
        return list(self.model.positions)

    @property
    def exit_names(self) -> list[str]:
        return list(self.model.exit_names)

    def _train_backbone(self) -> None:
        """Joint mode trains the backbone: modules left in eval mode (BatchNorm on running statistics,
        dropout off) would train wrongly and silently, so they are switched back, with a warning."""
        frozen = [n or type(m).__name__ for n, m in self.model.backbone.named_modules() if not m.training]
        if frozen:
            rank_zero_warn(f"MultiExitClassifier(mode='joint'): the backbone had {len(frozen)} module(s) in eval mode "
                           f"({', '.join(frozen[:3])}{', ...' if len(frozen) > 3 else ''}); switched to training mode so "
                           f"BatchNorm learns from the batches. HINT: mode='exits_only' trains the heads on a frozen "
                           f"backbone")
            self.model.backbone.train()

    def on_train_start(self) -> None:
        if self.hparams.mode == "joint":
            self._train_backbone()  # the backbone may have been put in eval mode after construction

    def train(self, mode: bool = True) -> "MultiExitClassifier":
        super().train(mode)
        if self.hparams.mode == "exits_only":
            self.model.backbone.eval()  # frozen BatchNorm statistics: the backbone is not trained
        return self

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        check_input_shape(self.input_shape, x, f"{type(self).__name__} (train)")
        loss, per_exit = multi_exit_loss(self.model(x), y, self.loss_weights)
        self.log("train_loss", loss, prog_bar=True)
        for name, value in zip(self.exit_names, per_exit):
            self.log(f"train_loss_{name}", value, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def _eval_step(self, batch, metrics: nn.ModuleList, stage: str) -> None:
        x, y = batch[0], batch[1]
        check_input_shape(self.input_shape, x, f"{type(self).__name__} ({stage})")
        logits = self.model(x)
        loss, _ = multi_exit_loss(logits, y, self.loss_weights)
        self.log(f"{stage}_loss", loss, prog_bar=True, sync_dist=True)
        for k, (name, metric, z) in enumerate(zip(self.exit_names, metrics, logits)):
            metric(z, y)
            final = k == len(logits) - 1
            self.log(
                f"{stage}_acc" if final else f"{stage}_acc_{name}",
                metric,
                on_step=False,
                on_epoch=True,
                prog_bar=final,
            )

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_acc, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_acc, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        # one optimiser definition for every nestflex stage: the baseline's (SGD + Nesterov,
        # one-cycle cosine, no decay on BN/bias); frozen parameters never get a gradient, so SGD
        # skips them
        return ImageClassifier.configure_optimizers(self)
