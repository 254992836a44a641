"""``OverthinkingSchedule``: the Lightning callback that drives the SDN loss weights.

Thin by design: before every training batch it asks :func:`~nestflex.exits.loss.tau_schedule`
for the weights at ``trainer.global_step`` of ``trainer.estimated_stepping_batches`` and sets them
on the module (``pl_module.loss_weights``), then logs them as ``tau/<exit>``. The weights are a
function of the step, so a resumed run continues the schedule exactly with no saved state.

Works with any LightningModule that has ``exit_positions`` (``C_i`` of each early exit) and a
settable ``loss_weights`` (one per exit, final last), e.g. :class:`~nestflex.exits.MultiExitClassifier`.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from nestflex.deploy.exits import ExitError
from nestflex.exits.loss import WEIGHTINGS, loss_weights

__all__ = ["OverthinkingSchedule"]


class OverthinkingSchedule(Callback):
    """Set the multi-exit loss weights from the training step (SDN's overthinking-aware loss).

    Args:
        start: the weight every early exit starts from (SDN: 0.01).
        weighting: ``overthinking`` (the tau schedule) or, for ablations, ``equal`` (all 1).
        total_steps: length of the schedule in optimizer steps; ``None`` uses
            ``trainer.estimated_stepping_batches``.
        log: log each weight as ``tau/<exit name>`` every step.

    Raises:
        ExitError: an argument out of range (message names it, with the valid choices).

    Examples:
        >>> from nestflex.exits import MultiExitClassifier
        >>> module = MultiExitClassifier("resnet20", width=0.25, positions=(0.3, 0.6))
        >>> trainer = pl.Trainer(fast_dev_run=True, callbacks=[OverthinkingSchedule()], logger=False,
        ...                      accelerator="cpu", enable_progress_bar=False, enable_model_summary=False)
        >>> import torch
        >>> data = torch.utils.data.DataLoader(
        ...     torch.utils.data.TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))), batch_size=4)
        >>> trainer.fit(module, data)  # doctest: +ELLIPSIS
        >>> module.loss_weights  # step 0 of 1: every early exit at `start`
        [0.01, 0.01, 1.0]
    """

    def __init__(
        self,
        start: float = 0.01,
        weighting: str = "overthinking",
        total_steps: int | None = None,
        log: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0.0 < start <= 1.0:
            raise ExitError(
                f"`start` must be a number in (0, 1], got {start!r}. HINT: SDN starts every exit at 0.01"
            )
        if weighting not in WEIGHTINGS:
            raise ExitError(f"`weighting` must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        if total_steps is not None and (
            isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1
        ):
            raise ExitError(f"`total_steps` must be an int >= 1 or None, got {total_steps!r}")
        self.start = float(start)
        self.weighting = weighting
        self.total_steps = total_steps
        self.log = log

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(start=self.start, weighting=self.weighting)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        missing = [a for a in ("exit_positions", "loss_weights") if not hasattr(pl_module, a)]
        if missing:
            raise ExitError(
                f"`OverthinkingSchedule` needs a module with `exit_positions` and `loss_weights`; "
                f"`{type(pl_module).__name__}` lacks {', '.join(f'`{m}`' for m in missing)}. "
                f"HINT: use nestflex.exits.MultiExitClassifier or add both attributes"
            )

    def _total(self, trainer: pl.Trainer) -> int:
        total = self.total_steps if self.total_steps is not None else trainer.estimated_stepping_batches
        if total == float("inf"):
            raise ExitError(
                "`OverthinkingSchedule` cannot tell how long training runs (estimated_stepping_batches is inf). "
                "HINT: set Trainer(max_epochs=...) or max_steps, or pass `total_steps`"
            )
        return max(1, int(total))

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        weights = loss_weights(
            self.weighting, trainer.global_step, self._total(trainer), pl_module.exit_positions, self.start
        )
        pl_module.loss_weights = weights
        if self.log:
            names = getattr(pl_module, "exit_names", None) or [f"exit{k}" for k in range(len(weights))]
            for name, w in zip(names, weights):
                pl_module.log(f"tau/{name}", w, on_step=True, on_epoch=False, batch_size=1)
