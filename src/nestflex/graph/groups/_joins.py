"""How tensors combine: elementwise joins tie their channel spaces (residual adds), a
concatenation along the channels makes a composite tensor of parts (a :class:`Layout`), a
channel slice keeps whole parts, a stack ties its inputs and moves the channel dim."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import fx

from nestflex.graph.groups._shapes import index_other_dims
from nestflex.graph.groups._spaces import ChannelInfo, UnionFind


def broadcast_channels(operand: tuple[int, ...], out: tuple[int, ...], dim: int = 1) -> int:
    """Size of ``operand``'s dim that broadcasting aligns with ``out``'s channel dim ``dim`` (1 if none).

    Shapes align from the right, so a 0-d scale or a shorter operand may have no such dim.
    """
    i = len(operand) - len(out) + dim
    return operand[i] if 0 <= i < len(operand) else 1


def joined(node: fx.Node, info: dict, uf: UnionFind, shape: tuple[int, ...], composite) -> ChannelInfo | None:
    """Elementwise op: tensors of equal channel count share one space; broadcast ones pass.

    Concatenated operands join part by part when their parts have the same widths; a
    concatenated operand and a plain one cannot be matched (None: the caller locks them)."""
    srcs = [a for a in node.all_input_nodes if info.get(a) is not None]
    if not srcs:
        return None
    # the channel dim of the operands of full rank (a 1-d bias or a scalar says nothing)
    dims = {info[a].dim for a in srcs if len(a.meta["shape"]) == len(shape) and a.meta["shape"][info[a].dim] != 1}
    if len(dims) != 1:
        return None
    d = dims.pop()
    full = [a for a in srcs if len(a.meta["shape"]) == len(shape) and info[a].dim == d and a.meta["shape"][d] == shape[d]]
    if not full or any(info[a].factor != info[full[0]].factor for a in full):
        return None
    aligned = []  # parameters of lower rank whose channels broadcasting aligns: ``x * gamma`` on tokens
    for a in srcs:
        n = broadcast_channels(a.meta["shape"], shape, d) if a not in full else 1
        if n == 1:
            continue
        i = info[a]
        if not (i.constant and n == shape[d] and len(a.meta["shape"]) - len(shape) + d == i.dim and i.factor == 1
                and i.parts is None and not i.heads):
            return None
        aligned.append(a)
    first = info[full[0]]
    if aligned and (first.parts is not None or first.heads or first.factor != 1):
        return None
    if first.parts is not None or any(info[a].parts is not None for a in full):
        widths = [tuple(w for _, w in info[a].parts) if info[a].parts else None for a in full]
        if any(w != widths[0] for w in widths):
            return None
        parts = list(first.parts)
        for a in full[1:]:
            parts = [(uf.union(sp, other), w) for (sp, w), (other, _) in zip(parts, info[a].parts)]
        return composite(parts, first.factor) if d == 1 else None
    if any((info[a].head, info[a].attention) != (first.head, first.attention) for a in full):
        return None  # heads and plain channels, or two attentions' heads
    space = first.space
    for a in full[1:] + aligned:
        space = uf.union(space, info[a].space)
    # broadcast operands with a channel dim of 1 (e.g. per-sample scales) carry no channels; the
    # result is a constant only when every operand with channels is one
    return replace(first, space=space, dim=d, constant=all(info[a].constant for a in full + aligned))


CAT_FUNCTIONS = {torch.cat, torch.concat, torch.concatenate}


def cat_dim(node: fx.Node, ndim: int) -> int | None:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("axis", 0))
    return dim % ndim if isinstance(dim, int) else None


def concatenated(node: fx.Node, info: dict, uf: UnionFind, shape: tuple[int, ...], composite) -> ChannelInfo | None:
    """``torch.cat``: along the channels, a composite of the inputs' parts; along any other dim,
    the inputs share their channels (one space, like an add)."""
    tensors = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = cat_dim(node, len(shape))
    if not isinstance(tensors, (list, tuple)) or dim is None:
        return None
    if any(not isinstance(t, fx.Node) or info.get(t) is None or t.meta.get("shape") is None for t in tensors):
        return None
    channel_dims = {info[t].dim for t in tensors}
    if channel_dims != {1}:
        # channels elsewhere (tokens): a concatenation along another dim shares them, one along
        # them is not mapped (locked)
        d = channel_dims.pop() if len(channel_dims) == 1 else None
        return joined(node, info, uf, shape, composite) if d is not None and dim != d else None
    if dim != 1:
        if any(t.meta["shape"][1] != shape[1] for t in tensors):
            return None
        return joined(node, info, uf, shape, composite)
    if any(info[t].factor != 1 for t in tensors):
        return None  # concatenated flattened features: the layout of each part's features is lost
    parts: list[tuple[int, int]] = []
    for t in tensors:
        parts.extend(info[t].parts or [(info[t].space, t.meta["shape"][1])])
    return composite(parts)


def sliced(node: fx.Node, src: fx.Node, src_info: ChannelInfo, shape: tuple[int, ...], composite, lock) -> ChannelInfo | None:
    """``x[...]`` of a tensor: indexing that keeps the channel dim whole passes the channels.

    A channel slice ``x[:, a:b]`` has constant bounds. ``x[:, :b]`` with ``b`` >= the width stays
    the identity as channels are pruned (GhostNet's ``out[:, :oup]``). Otherwise the slice must
    keep whole parts of a concatenation; the parts up to ``b`` are locked (pruning them would
    move what the bounds select) and the parts after it stay free."""
    in_shape = src.meta.get("shape")
    index = node.args[1]
    index = index if isinstance(index, tuple) else (index,)
    if in_shape is not None and src_info.dim != 1:
        return index_other_dims(index, src_info, len(in_shape))
    if in_shape is None or len(index) == 0 or index[0] != slice(None) or len(shape) != len(in_shape):
        return None
    if len(index) < 2 or index[1] in (slice(None), Ellipsis):
        return src_info if shape[1] == in_shape[1] else None
    ch = index[1]
    if not isinstance(ch, slice) or ch.step not in (None, 1) or src_info.factor != 1:
        return None
    if any(b is not None and not isinstance(b, int) for b in (ch.start, ch.stop)):
        return None  # bounds computed in the forward (PiT's x[:, :num_tokens]): not followed, locked
    if ch.start in (None, 0) and isinstance(ch.stop, int) and ch.stop >= in_shape[1]:
        return src_info
    start, stop, _ = ch.indices(in_shape[1])
    kept, offset = [], 0
    for sp, w in src_info.parts or [(src_info.space, in_shape[1])]:
        if start <= offset and offset + w <= stop:
            kept.append((sp, w))
        if offset < stop:
            lock(sp, f"`{node.name}` slices channels [{start}:{stop}] of a concatenation")
        offset += w
    if sum(w for _, w in kept) != stop - start:
        return None  # the slice cuts through a space
    return composite(kept) if len(kept) > 1 else ChannelInfo(kept[0][0])

def stacked(node: fx.Node, info: dict, uf: UnionFind, shape: tuple[int, ...]) -> ChannelInfo | None:
    """``torch.stack`` of tensors with their channels on one dim: they share them (like an add),
    and a new dim before the channels moves them right (selective kernels stack their paths)."""
    tensors = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int) or not tensors:
        return None
    infos = [info.get(t) if isinstance(t, fx.Node) else None for t in tensors]
    if any(i is None or i.factor != 1 or i.parts is not None or i.heads for i in infos):
        return None
    if len({i.dim for i in infos}) != 1 or len({t.meta.get("shape") for t in tensors}) != 1:
        return None
    c, d = infos[0].dim, dim % len(shape)
    space = infos[0].space
    for i in infos[1:]:
        space = uf.union(space, i.space)
    return ChannelInfo(space, dim=c + 1 if d <= c else c)
