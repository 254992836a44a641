"""A plain image-classification LightningModule: the baseline every nestflex stage starts from.

Users with their own LightningModule do not need this; the nestflex callbacks work on any
module whose ``forward`` maps images to logits. The recipes use it so that a checkpoint holds
everything needed to rebuild the network (registry name, width, classes).
"""

from __future__ import annotations

from typing import Any, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from nestflex.errors import ModelError
from nestflex.graph import DEFAULT_INPUT_SHAPE, check_input_shape
from nestflex.models import create_model

__all__ = ["ImageClassifier"]


class ImageClassifier(pl.LightningModule):
    """Cross-entropy training of a registry model with SGD + cosine LR and top-1 accuracy.

    Args:
        model_name: a name from :func:`nestflex.models.list_models` (or ``timm:<name>``).
        num_classes: classifier outputs.
        width: channel multiplier.
        lr: peak learning rate (linear warm-up over the first epoch, then cosine to 0).
        momentum: SGD momentum.
        weight_decay: L2 penalty on weights (not on BatchNorm or biases).
        max_epochs: length of the cosine schedule; match ``Trainer(max_epochs=...)``.
        restart_epochs: instead of one cycle over ``max_epochs``, restart a cosine from ``lr``
            every ``restart_epochs`` epochs (fine-tuning after each pruning step gets its own
            full schedule).
        input_shape: per-sample ``(C, H, W)`` of the data (a DataModule's ``input_shape``): the
            network gets ``C`` input channels, and it and the module record the shape, so every
            callback traces them at it (:func:`nestflex.graph.input_shape_of`). Training,
            validation and test batches of another shape raise.

    Attributes:
        input_shape: the per-sample input shape, also set on ``model``.

    Raises:
        ModelError: an argument out of range.
        GraphError: (in a step) a batch whose samples are not ``input_shape``.

    Examples:
        >>> module = ImageClassifier("resnet20", width=0.25)
        >>> module(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 10])
        >>> ImageClassifier("vgg11", width=0.125, input_shape=(1, 32, 32)).model.features.conv1.in_channels
        1
    """

    def __init__(
        self,
        model_name: str = "vgg16",
        num_classes: int = 10,
        width: float = 1.0,
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        max_epochs: int = 10,
        restart_epochs: int | None = None,
        input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
    ) -> None:
        super().__init__()
        shape_ok = isinstance(input_shape, Sequence) and len(input_shape) == 3 and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in input_shape)
        for arg, value, ok in (
            ("lr", lr, lr > 0),
            ("momentum", momentum, 0 <= momentum < 1),
            ("weight_decay", weight_decay, weight_decay >= 0),
            ("max_epochs", max_epochs, isinstance(max_epochs, int) and max_epochs >= 1),
            ("restart_epochs", restart_epochs, restart_epochs is None or (isinstance(restart_epochs, int) and restart_epochs >= 1)),
            ("input_shape", input_shape, shape_ok),
        ):
            if not ok:
                hint = " HINT: a per-sample (C, H, W) of positive ints, e.g. (1, 32, 32)" if arg == "input_shape" else ""
                raise ModelError(f"`{arg}` is out of range, got {value!r}.{hint}")
        self.save_hyperparameters()
        self.input_shape: tuple[int, ...] = tuple(input_shape)
        self.model: nn.Module = create_model(model_name, num_classes=num_classes, width=width,
                                             in_chans=self.input_shape[0])
        # plain copies of the network (pruned, nested, extracted levels, exit backbones) trace at it too
        self.model.input_shape = self.input_shape
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _step(self, batch, metric, stage: str) -> torch.Tensor:
        x, y = batch[0], batch[1]
        check_input_shape(self.input_shape, x, f"{type(self).__name__} ({stage})")
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        metric(logits, y)
        self.log(f"{stage}_loss", loss, prog_bar=stage != "train", sync_dist=stage != "train")
        self.log(f"{stage}_acc", metric, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, self.train_acc, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, self.val_acc, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, self.test_acc, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        decay, no_decay = [], []
        for p in self.model.parameters():
            # BatchNorm scales and biases are 1-d; decaying them only hurts (He et al. 2019)
            (no_decay if p.ndim <= 1 else decay).append(p)
        opt = torch.optim.SGD(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            nesterov=True,
        )
        steps = self.trainer.estimated_stepping_batches if self._trainer is not None else 1000
        if self.hparams.get("restart_epochs"):
            per_epoch = max(1, int(steps) // max(1, self.trainer.max_epochs if self._trainer is not None else 1))
            sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
                opt, T_0=per_epoch * self.hparams.restart_epochs, eta_min=self.hparams.lr / 100
            )
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt,
            max_lr=self.hparams.lr,
            total_steps=max(2, int(steps)),
            pct_start=min(0.3, 1.0 / max(1, self.hparams.max_epochs)),
            anneal_strategy="cos",
            div_factor=10.0,
            final_div_factor=100.0,
            cycle_momentum=False,
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
