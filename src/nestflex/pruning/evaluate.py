"""Top-1 accuracy of a model on a dataloader, shard-aware for data-parallel runs."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import nn

from nestflex.errors import PruningError

__all__ = ["accuracy", "trainer_eval_loader"]


def accuracy(
    model: nn.Module,
    loader: Iterable,
    *,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Fraction of samples whose argmax logit is the label, in eval mode without gradients.

    With ``world_size`` > 1 each rank takes every ``world_size``-th batch and ``reduce`` sums
    the (correct, total) counts, so every rank returns the same number. Train/eval flags are
    restored afterwards.

    Raises:
        PruningError: the loader yields no samples.

    Example:
        >>> net = nn.Linear(4, 2)
        >>> 0.0 <= accuracy(net, [(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))]) <= 1.0
        True
    """
    param = next(model.parameters())
    flags = {m: m.training for m in model.modules()}
    counts = torch.zeros(2, dtype=torch.float64, device=param.device)
    model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if max_batches is not None and i >= max_batches:
                    break
                if i % world_size != rank:
                    continue
                x, y = batch[0].to(param.device), batch[1].to(param.device)
                counts[0] += (model(x).argmax(1) == y).sum()
                counts[1] += y.numel()
    finally:
        for m, flag in flags.items():
            m.train(flag)
    if reduce is not None:
        counts = reduce(counts)
    if counts[1] == 0:
        raise PruningError("the evaluation dataloader yielded no samples. HINT: check the validation split")
    return float(counts[0] / counts[1])


def trainer_eval_loader(trainer: Any, explicit: Any, owner: str, error: type[Exception] = PruningError):
    """The loader a callback evaluates on: ``explicit`` if given, else the Trainer's validation one.

    Raises:
        ``error``: there is no single validation dataloader (none, or several).
    """
    if explicit is not None:
        return explicit
    if trainer.datamodule is not None:
        return trainer.datamodule.val_dataloader()
    if trainer.val_dataloaders is None:
        trainer.fit_loop.epoch_loop.val_loop.setup_data()
    loaders = trainer.val_dataloaders
    if loaders is None or isinstance(loaders, (list, tuple, dict)):
        raise error(
            f"{owner} evaluates on one validation dataloader and found "
            f"{'none' if loaders is None else type(loaders).__name__}. HINT: pass `eval_dataloader=`"
        )
    return loaders
