"""What nestflex's callbacks read off a Lightning ``Trainer``: its one training or validation
loader, and the per-sample input shape of the data it fits on.

Kept in one place so every callback finds loaders and shapes the same way; a user's module and
data decide the shape, never a built-in default.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from nestflex.errors import GraphError
from nestflex.graph import input_shape_of

__all__ = ["fit_loader", "infer_input_shape", "network_attr", "single_loader"]


def single_loader(loader: Any, which: str, error: type[Exception], owner: str) -> Any:
    """One DataLoader out of what Lightning holds: a loader, a one-element list/dict, or a
    CombinedLoader of one (``None`` stays ``None``)."""
    loader = getattr(loader, "iterables", loader)  # CombinedLoader
    if isinstance(loader, dict):
        loader = list(loader.values())
    if isinstance(loader, (list, tuple)):
        if len(loader) > 1:
            raise error(f"`{owner}` needs one {which} loader, got {len(loader)}. HINT: fit with a single "
                        f"{which} DataLoader")
        loader = loader[0] if loader else None
    return loader


def fit_loader(trainer: Any, which: str, error: type[Exception], owner: str) -> Any:
    """The fit's ``train``/``val`` loader (the DataModule's or the one passed to ``fit``), or ``None``."""
    loader = trainer.train_dataloader if which == "train" else trainer.val_dataloaders
    if loader is None:  # not loaded yet, or validation switched off: ask the DataModule itself
        dm = getattr(trainer, "datamodule", None)
        try:
            loader = getattr(dm, f"{which}_dataloader")() if dm is not None else None
        except Exception:  # a DataModule without that split raises Lightning's own error
            loader = None
    return single_loader(loader, which, error, owner)


def _inputs(batch: Any) -> torch.Tensor | None:
    """The input tensor of a batch: the batch itself, or the first element of a tuple/list."""
    if isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    return batch if isinstance(batch, torch.Tensor) and batch.ndim >= 2 else None


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape[1:])


def infer_input_shape(
    trainer: Any,
    pl_module: nn.Module,
    input_shape: Sequence[int] | None = None,
    owner: str = "nestflex",
    network: nn.Module | None = None,
) -> tuple[int, ...]:
    """The per-sample input shape a callback traces ``pl_module`` at, from the first that exists:

    1. ``input_shape`` (the callback's argument);
    2. an ``input_shape`` attribute of the module or of its ``network``
       (:class:`~nestflex.training.ImageClassifier`, :class:`~nestflex.exits.MultiExitNetwork`);
    3. Lightning's ``example_input_array`` (a tensor, or a tuple whose first item is one);
    4. the DataModule's ``input_shape``;
    5. the first batch of the Trainer's training loader, else of its validation loader.

    A declared shape (1-3) that differs from the DataModule's is an error: MACs, split points and
    exit positions would be measured at a shape the model never sees.

    Raises:
        GraphError: no source gives a shape, or the declared and the data's shapes differ.
    """
    dm_shape = getattr(getattr(trainer, "datamodule", None), "input_shape", None)
    dm_shape = input_shape_of(nn.Module(), dm_shape) if dm_shape is not None else None
    declared, source = None, None
    if input_shape is not None:
        declared, source = input_shape_of(nn.Module(), input_shape), "`input_shape`"
    else:
        for holder in (pl_module, network):
            if holder is not None and getattr(holder, "input_shape", None) is not None:
                declared, source = input_shape_of(holder), f"`{type(holder).__name__}.input_shape`"
                break
    if declared is None:
        example = _inputs(getattr(pl_module, "example_input_array", None))
        if example is not None:
            declared, source = _shape(example), "`example_input_array`"
    if declared is not None:
        if dm_shape is not None and dm_shape != declared:
            raise GraphError(
                f"{owner}: {source} says the per-sample input is {declared}, but the DataModule's `input_shape` is "
                f"{dm_shape}. HINT: build the module for the data (e.g. `input_shape=datamodule.input_shape`)"
            )
        return declared
    if dm_shape is not None:
        return dm_shape
    for which in ("train", "val"):
        try:
            loader = fit_loader(trainer, which, GraphError, owner)
        except GraphError:
            loader = None
        if loader is None:
            continue
        x = _inputs(next(iter(loader), None))
        if x is not None:
            return _shape(x)
    raise GraphError(
        f"{owner} cannot tell the per-sample input shape of {type(pl_module).__name__}: no `input_shape` argument "
        f"or attribute, no `example_input_array`, and no batch from the Trainer's loaders. HINT: pass "
        f"`input_shape=(C, H, W)` or set `self.example_input_array` in the LightningModule"
    )


def network_attr(module: nn.Module, attr: str | None, error: type[Exception], owner: str) -> str:
    """The attribute of a LightningModule that holds its network: ``attr`` if given, else ``model``
    (nestflex's modules), else the one child module that has parameters.

    Raises:
        ``error``: ``attr`` names no submodule, or no single child holds the network.
    """
    if attr is not None:
        if not isinstance(getattr(module, attr, None), nn.Module):
            raise error(f"`attr`={attr!r}: {type(module).__name__} has no nn.Module attribute {attr!r}. HINT: pass "
                        f"the attribute that holds the network")
        return attr
    if isinstance(getattr(module, "model", None), nn.Module):
        return "model"
    holders = [name for name, child in module.named_children() if any(True for _ in child.parameters())]
    if len(holders) != 1:
        raise error(f"{owner} cannot tell which attribute of {type(module).__name__} holds the network (children with "
                    f"parameters: {holders or 'none'}). HINT: pass `attr=` naming it")
    return holders[0]
