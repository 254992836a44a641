"""Where FilterPruning finds what it works on inside the user's LightningModule and Trainer."""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from nestflex.errors import PruningError
from nestflex.graph import StructureGraph

__all__ = ["network_attr", "train_dataset"]


def network_attr(module: torch.nn.Module, graph: StructureGraph, given: str | None) -> str:
    """The attribute holding the network: ``given``, else the one child holding every traced layer."""
    if given is not None:
        try:
            module.get_submodule(given)
        except AttributeError:
            raise PruningError(f"`network`={given!r}: {type(module).__name__} has no submodule {given!r}. HINT: "
                               f"pass the attribute that holds the network, e.g. 'model'") from None
        return given
    heads = {layer.name.split(".", 1)[0] for layer in graph.layers}
    if len(heads) == 1:
        (child,) = heads
        if isinstance(getattr(module, child, None), torch.nn.Module) and child in dict(module.named_children()):
            return child
    return ""


def train_dataset(trainer: pl.Trainer):
    loader = trainer.train_dataloader
    if loader is None and trainer.datamodule is not None:
        loader = trainer.datamodule.train_dataloader()
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise PruningError(
            f"cannot find the training dataset to rank on (train dataloader: {type(loader).__name__}). "
            "HINT: pass `ranking_data=` to FilterPruning"
        )
    return dataset
