"""Channel surgery on coupled groups: prune (keep indices), permute (reorder), slice (prefix).

All three are one operation, :func:`select_channels`: index every member tensor of a group with
the same channel indices. Pruning makes tensors physically smaller (real MAC/param savings);
permuting keeps the function unchanged (DESIGN.md invariant 2); slicing keeps a prefix, which is
how nested capacities are read out once channels are in nested order.

Surgery edits the model in place and replaces each touched tensor by a new one, so optimizers
holding the old parameters must be rebuilt (the pruning callback does this). Re-``trace`` the
model afterwards for the new widths; group ids do not change.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn

from nestflex.errors import GraphError
from nestflex.graph.groups import ChannelGroup
from nestflex.graph.structure import StructureGraph

__all__ = ["select_channels", "prune_channels", "permute_channels", "slice_channels", "prune_groups", "resize_like",
           "state_for"]

Indices = Sequence[int] | torch.Tensor


def _as_index(group: ChannelGroup, indices: Indices, arg: str) -> torch.Tensor:
    idx = torch.as_tensor(indices, dtype=torch.long).flatten()
    if idx.numel() == 0:
        raise GraphError(f"`{arg}` for group `{group.name}` is empty; a group keeps at least one channel")
    if idx.min() < 0 or idx.max() >= group.width:
        raise GraphError(
            f"`{arg}` for group `{group.name}` must lie in [0, {group.width}), got "
            f"min {int(idx.min())}, max {int(idx.max())}"
        )
    if torch.unique(idx).numel() != idx.numel():
        raise GraphError(f"`{arg}` for group `{group.name}` repeats channels: {idx.tolist()}")
    return idx


def select_channels(model: nn.Module, group: ChannelGroup, indices: Indices) -> None:
    """Keep channels ``indices`` of ``group``, in that order, in every member tensor.

    Each touched parameter or buffer is replaced by a new tensor (``requires_grad`` kept), the
    modules' size attributes (``out_channels``, ``num_features``, an attention's
    ``num_heads``...) follow, and ``group.width`` becomes ``len(indices)``.

    Args:
        model: the model to edit in place; the one ``group`` was traced from, as it is now.
        group: a channel group of ``model``'s current :class:`~nestflex.graph.StructureGraph`
            (``trace(model).group(...)``); it must be prunable.
        indices: the channels to keep, in their new order: a sequence of ints or an integer
            tensor (flattened), each in ``[0, group.width)``, non-empty and without repeats.

    Raises:
        GraphError: the group is locked, the indices are empty, out of range or repeated, or a
            member tensor does not have the size the group expects (the model was edited after
            ``group`` was traced: re-trace it).

    Examples:
        >>> from nestflex.graph import trace
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
        >>> group = trace(model).group("0")
        >>> select_channels(model, group, [5, 1, 2])
        >>> model[0].out_channels, model[1].num_features, model[3].in_channels, group.width
        (3, 3, 3, 3)
    """
    if not group.prunable:
        raise GraphError(f"channel group `{group.name}` is locked ({group.reason}); it cannot be edited")
    idx = _as_index(group, indices, "indices")
    touched: set[str] = set()
    done: set[tuple[str, str, int]] = set()
    for m in group.members:
        if (m.module, m.attr, m.dim) in done:
            continue  # a concatenation holding this group twice: one member's rows cover both parts
        done.add((m.module, m.attr, m.dim))
        module = model.get_submodule(m.module)
        old = getattr(module, m.attr)
        if m.role == "count":  # an int the forward reads (an attention's num_heads): it follows the width
            if old != m.size(group):
                raise GraphError(f"`{m.module}.{m.attr}` is {old}, the graph expects {m.size(group)}. "
                                 "HINT: re-trace the model after each surgery")
            setattr(module, m.attr, idx.numel() * m.factor)
            continue
        if old.shape[m.dim] != m.size(group):
            raise GraphError(
                f"`{m.module}.{m.attr}` has {old.shape[m.dim]} entries on dim {m.dim}, the graph expects "
                f"{m.size(group)}. HINT: re-trace the model after each surgery"
            )
        # a channel of a flattened (C, H, W) map owns `factor` consecutive features; a part of a
        # concatenation sits after the parts before it, at their current widths
        rows = m.rows(group, idx).to(old.device)
        new = old.detach().index_select(m.dim, rows).clone()
        if isinstance(old, nn.Parameter):
            setattr(module, m.attr, nn.Parameter(new, requires_grad=old.requires_grad))
        else:
            module._buffers[m.attr] = new
        touched.add(m.module)
    for name in touched:
        _sync_attributes(model.get_submodule(name))
    group.width = idx.numel()


def _sync_attributes(module: nn.Module) -> None:
    """Make a module's size attributes agree with its (edited) tensors."""
    if isinstance(module, nn.Conv2d):
        out_c, in_per_group = module.weight.shape[:2]
        if module.groups > 1 and module.groups == module.in_channels == module.out_channels:
            module.groups = module.in_channels = module.out_channels = out_c  # depthwise stays depthwise
        else:
            module.out_channels, module.in_channels = out_c, in_per_group * module.groups
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.modules.batchnorm._BatchNorm):
        ref = module.weight if module.weight is not None else module.running_mean
        module.num_features = ref.shape[0]
    elif isinstance(module, nn.LayerNorm) and module.weight is not None and len(module.normalized_shape) == 1:
        module.normalized_shape = (module.weight.shape[0],)  # pruned with approximate=True
    elif isinstance(module, nn.GroupNorm) and module.weight is not None:
        module.num_channels = module.weight.shape[0]


def prune_channels(model: nn.Module, group: ChannelGroup, keep: Indices) -> None:
    """Physically remove every channel of ``group`` not in ``keep`` (kept in ascending order).

    :func:`select_channels` with the indices sorted, so the kept channels keep their order.

    Args:
        model: the model to edit in place (the one ``group`` was traced from).
        group: a prunable channel group of ``model``'s current graph.
        keep: the channels to keep, in any order: ints or an integer tensor, each in
            ``[0, group.width)``, non-empty and without repeats.

    Raises:
        GraphError: as :func:`select_channels` (``keep`` named in the message).
    """
    idx = _as_index(group, keep, "keep")
    select_channels(model, group, torch.sort(idx).values)


def permute_channels(model: nn.Module, group: ChannelGroup, perm: Indices) -> None:
    """Reorder the channels of ``group``; the model computes the same function.

    Args:
        model: the model to edit in place (the one ``group`` was traced from).
        group: a prunable channel group of ``model``'s current graph.
        perm: the new order: a permutation of ``range(group.width)`` (ints or an integer
            tensor); new channel ``i`` is old channel ``perm[i]``.

    Raises:
        GraphError: ``perm`` is not a permutation of every channel, or as
            :func:`select_channels`.
    """
    idx = _as_index(group, perm, "perm")
    if idx.numel() != group.width:
        raise GraphError(f"`perm` for group `{group.name}` must have {group.width} entries, got {idx.numel()}")
    select_channels(model, group, idx)


def slice_channels(model: nn.Module, group: ChannelGroup, width: int) -> None:
    """Keep the first ``width`` channels of ``group``.

    Args:
        model: the model to edit in place (the one ``group`` was traced from).
        group: a prunable channel group of ``model``'s current graph.
        width: how many leading channels to keep, an int in ``[1, group.width]``.

    Raises:
        GraphError: ``width`` is out of range, or as :func:`select_channels`.
    """
    if not isinstance(width, int) or not 1 <= width <= group.width:
        raise GraphError(f"`width` for group `{group.name}` must be an int in [1, {group.width}], got {width!r}")
    select_channels(model, group, torch.arange(width))


def prune_groups(model: nn.Module, graph: StructureGraph, keep: Mapping[int | str, Indices]) -> None:
    """Prune several groups at once, with :func:`prune_channels` for each.

    Args:
        model: the model to edit in place (the one ``graph`` was traced from).
        graph: ``model``'s current structure graph; its groups' widths are updated, but its other
            fields (layers, MACs) are not: re-``trace`` the model for them.
        keep: for each group to prune, its id or name mapped to the channels to keep (as
            :func:`prune_channels`' ``keep``); groups not named are left as they are.

    Raises:
        GraphError: a key names no group of ``graph``, or as :func:`prune_channels`.

    Examples:
        >>> from nestflex.graph import trace
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 6, 3), nn.ReLU(), nn.Conv2d(6, 4, 3))
        >>> graph = trace(model)
        >>> prune_groups(model, graph, {"0": [0, 1, 2, 3], 1: [4, 5]})
        >>> trace(model).widths()
        {0: 4, 1: 2, 2: 4}
    """
    for key, idx in keep.items():
        prune_channels(model, graph.group(key), idx)


def state_for(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """``state_dict`` renamed to ``model``'s names, or ``None`` if it does not hold ``model``.

    A LightningModule's checkpoint names its network ``model.<...>`` (or whatever attribute holds
    it); the one prefix that makes the checkpoint's names cover every tensor of ``model`` is
    stripped, so the same checkpoint loads into the module or into the plain network.

    Examples:
        >>> net = nn.Linear(2, 3)
        >>> sorted(state_for(net, {"model.weight": net.weight, "model.bias": net.bias, "other": net.bias}))
        ['bias', 'weight']
    """
    own = [n for n in model.state_dict() if not n.endswith("num_batches_tracked")]
    if not own:
        return dict(state_dict)
    prefixes = {key[: len(key) - len(own[0])] for key in state_dict if key.endswith(own[0])}
    for prefix in sorted(prefixes, key=len):  # the plain names first, then the shortest prefix
        if prefix and not prefix.endswith("."):
            continue
        renamed = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if all(n in renamed for n in own):
            return renamed
    return None


def resize_like(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Give every parameter and buffer of ``model`` the shape it has in ``state_dict``.

    This rebuilds a pruned architecture from a checkpoint before its weights are loaded (the
    values are placeholders until ``load_state_dict``): a fresh model resumes a pruned run, and
    a pruned model rolls back to an earlier, larger footprint. Module size attributes
    (``out_channels``, ``num_features``, an attention's ``num_heads``...) follow the tensors.

    Args:
        model: the model to reshape in place; resized tensors are replaced by zeros of the new
            shape, with the model's dtype, device and ``requires_grad``.
        state_dict: tensors by ``model``'s own names (a LightningModule checkpoint's names are
            mapped with :func:`state_for` first); names the model lacks are skipped
            (``load_state_dict`` reports them).

    Returns:
        the names of the resized tensors.

    Raises:
        GraphError: a tensor has another number of dims in the model than in ``state_dict``.
    """
    changed: list[str] = []
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    for key, ref in state_dict.items():
        if key not in own:
            continue  # load_state_dict reports unexpected keys itself
        old = own[key]
        if old.shape == ref.shape:
            continue
        if old.dim() != ref.dim():
            raise GraphError(f"`{key}` has shape {tuple(old.shape)} in the model and {tuple(ref.shape)} in the checkpoint")
        owner, _, attr = key.rpartition(".")
        module = model.get_submodule(owner)
        new = torch.zeros(ref.shape, dtype=old.dtype, device=old.device)
        if isinstance(old, nn.Parameter):
            setattr(module, attr, nn.Parameter(new, requires_grad=old.requires_grad))
        else:
            module._buffers[attr] = new
        _sync_attributes(module)
        changed.append(key)
    for owner in {k.rpartition(".")[0].rpartition(".")[0] for k in changed}:
        _sync_heads(model.get_submodule(owner))
    return changed


def _sync_heads(module: nn.Module) -> None:
    """An attention whose ``proj`` was resized from a checkpoint: ``num_heads`` (and ``attn_dim``)
    follow its inputs, ``head_dim`` each (timm's convention, the one the graph prunes heads in)."""
    proj, head_dim = getattr(module, "proj", None), getattr(module, "head_dim", None)
    if not isinstance(proj, nn.Linear) or not isinstance(head_dim, int) or not isinstance(
            getattr(module, "num_heads", None), int):
        return
    module.num_heads = proj.in_features // head_dim
    for attr in ("attn_dim", "all_head_dim"):
        if isinstance(getattr(module, attr, None), int):
            setattr(module, attr, proj.in_features)
