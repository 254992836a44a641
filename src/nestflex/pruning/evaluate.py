"""Top-1 accuracy of a model on a dataloader, shard-aware for data-parallel runs."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

from nestflex.errors import PruningError

__all__ = ["accuracy", "accuracy_se", "trainer_eval_loader"]


def accuracy(
    model: nn.Module,
    loader: Iterable,
    *,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    counts: list[int] | None = None,
    hits: list[torch.Tensor] | None = None,
) -> float:
    """Fraction of samples whose argmax logit is the label, in eval mode without gradients.

    With ``world_size`` > 1 each rank takes every ``world_size``-th batch and ``reduce`` sums
    the (correct, total) counts, so every rank returns the same number. Train/eval flags are
    restored afterwards.

    Args:
        model: the classifier; batches are moved to the device of its first parameter.
        loader: iterable of ``(inputs, labels, ...)`` batches (a DataLoader).
        max_batches: evaluate at most the first this many batches of ``loader`` (counted over
            all ranks); ``None``: all.
        rank: this process's rank in the data-parallel group.
        world_size: number of data-parallel processes sharing the loader.
        reduce: sums a ``(2,)`` tensor of ``(correct, total)`` over ranks (e.g. an all-reduce);
            ``None``: no reduction (single process).
        counts: when given, a list whose contents are replaced with ``[correct, total]`` (the
            sample count sizes the noise of the figure: :func:`accuracy_se`).
        hits: when given, a list whose contents are replaced with one bool tensor (CPU) of
            per-sample correct flags in the loader's order (a paired comparison of two models on
            the same images: :func:`~nestflex.pruning.paired_decision`). Single process only.

    Returns:
        The top-1 accuracy, in [0, 1].

    Raises:
        PruningError: the loader yields no samples; ``hits`` with ``world_size`` > 1.

    Examples:
        >>> net = nn.Linear(4, 2)
        >>> 0.0 <= accuracy(net, [(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))]) <= 1.0
        True
    """
    if hits is not None and world_size > 1:
        raise PruningError("per-sample `hits` are not gathered across ranks (world_size="
                           f"{world_size}). HINT: evaluate on one process")
    param = next(model.parameters())
    flags = {m: m.training for m in model.modules()}
    tally = torch.zeros(2, dtype=torch.float64, device=param.device)
    seen: list[torch.Tensor] = []
    model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if max_batches is not None and i >= max_batches:
                    break
                if i % world_size != rank:
                    continue
                x, y = batch[0].to(param.device), batch[1].to(param.device)
                correct = model(x).argmax(1) == y
                tally[0] += correct.sum()
                tally[1] += y.numel()
                if hits is not None:
                    seen.append(correct.cpu())
    finally:
        for m, flag in flags.items():
            m.train(flag)
    if reduce is not None:
        tally = reduce(tally)
    if tally[1] == 0:
        raise PruningError("the evaluation dataloader yielded no samples. HINT: check the validation split")
    if counts is not None:
        counts[:] = [int(tally[0]), int(tally[1])]
    if hits is not None:
        hits[:] = [torch.cat(seen)]
    return float(tally[0] / tally[1])


def accuracy_se(acc: float, samples: int) -> float:
    """Binomial standard error of an accuracy measured on ``samples`` samples.

    The evaluation noise of one figure: two models compared on the same split differ by less
    noise than this times sqrt(2) (their errors are correlated), by more than zero.

    Examples:
        >>> round(accuracy_se(0.87, 5000), 4)
        0.0048
    """
    return math.sqrt(max(acc * (1.0 - acc), 0.0) / samples) if samples > 0 else float("inf")


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
