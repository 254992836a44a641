"""Surgery that keeps optimizers working: parameters swapped in place, state sliced alongside.

Surgery replaces every touched parameter by a smaller one. Building a new optimizer would lose
momentum and orphan the LR scheduler and Lightning's wrappers, which hold the optimizer object.
Instead the *same* optimizer object gets the new parameter in the old one's slot of its
``param_groups``, and every per-parameter state tensor of the old shape (SGD momentum, Adam
moments) is indexed with the same kept channels. The scheduler keeps stepping the same
optimizer, so its schedule continues where it was.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from nestflex.graph import ChannelGroup, StructureGraph
from nestflex.graph.surgery import prune_channels

__all__ = ["prune_with_optimizers"]


def _carry(optimizers: Sequence[torch.optim.Optimizer], old: nn.Parameter, new: nn.Parameter, dim: int, rows: torch.Tensor) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            for i, p in enumerate(group["params"]):
                if p is old:
                    group["params"][i] = new
        state = opt.state.pop(old, None)
        if state is None:
            continue
        opt.state[new] = {
            k: v.index_select(dim, rows.to(v.device)) if torch.is_tensor(v) and v.shape == old.shape else v
            for k, v in state.items()
        }


def _prune_group(model: nn.Module, group: ChannelGroup, keep: torch.Tensor, optimizers) -> None:
    keep = torch.sort(torch.as_tensor(keep, dtype=torch.long)).values
    before = {(m.module, m.attr): getattr(model.get_submodule(m.module), m.attr) for m in group.members}
    rows = {(m.module, m.attr): m.rows(group, keep) for m in group.members}  # at the widths before surgery
    prune_channels(model, group, keep)
    for m in group.members:
        old = before.pop((m.module, m.attr), None)
        if isinstance(old, nn.Parameter):
            _carry(optimizers, old, getattr(model.get_submodule(m.module), m.attr), m.dim, rows[(m.module, m.attr)])


def prune_with_optimizers(
    model: nn.Module,
    graph: StructureGraph,
    keep: Mapping[int, torch.Tensor],
    optimizers: Iterable[torch.optim.Optimizer] = (),
) -> None:
    """Physically prune groups (``keep``: group id -> channels to keep) and carry optimizer state."""
    optimizers = list(optimizers)
    for gid, idx in keep.items():
        g = graph.group(gid)
        if idx.numel() < g.width:
            _prune_group(model, g, idx, optimizers)
