"""Attention heads as one channel group: the split of a ``qkv`` Linear into heads, the products
over heads (``q @ k.T``, ``attn @ v``, ``scaled_dot_product_attention``) and the merge into the
``proj`` Linear, in timm's ``Attention`` convention (see :mod:`nestflex.graph.groups`)."""

from __future__ import annotations

import math
import operator
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import fx, nn

from nestflex.graph.groups._shapes import view_sizes
from nestflex.graph.groups._spaces import ChannelInfo, UnionFind

#: attributes of an attention module that hold ``num_heads * head_dim``
ATTN_DIM_ATTRS = ("attn_dim", "all_head_dim")


def split_heads(node: fx.Node, src: fx.Node, src_info: ChannelInfo, shape: tuple[int, ...], modules: dict, owners: dict):
    """``qkv(x).reshape(B, N, [3,] H, d)``: the Linear's last dim split into ``H`` heads of ``d``.

    Returns ``(info, blocks)`` with the channels on the heads dim, ``None`` when this is no such
    split (the caller goes on), or a lock reason when it is one that breaks timm's convention."""
    in_shape = src.meta.get("shape")
    if (in_shape is None or src_info.parts is not None or src_info.factor != 1 or src_info.dim != len(in_shape) - 1
            or src.op != "call_module" or not isinstance(modules.get(src.target), nn.Linear) or len(src.users) != 1):
        return None
    lead = len(in_shape) - 1
    tail = shape[lead:]
    if shape[:lead] != in_shape[:lead] or len(tail) not in (2, 3) or math.prod(tail) != in_shape[-1]:
        return None
    heads_n, d = tail[-2], tail[-1]
    owner = src.target.rpartition(".")[0]
    attn = owners.get(owner)
    what = f"the heads of `{owner or type(attn).__name__}`"
    if heads_n < 2 or d < 2 or attn is None or getattr(attn, "num_heads", None) != heads_n:
        return None  # not a head split (or not a module that says how many heads it has)
    if getattr(attn, "head_dim", None) != d or not isinstance(getattr(attn, "proj", None), nn.Linear):
        return f"{what}: pruning them needs int `num_heads` and `head_dim` and a `proj` Linear (timm's Attention)"
    sizes = view_sizes(node)
    if len(sizes) != len(shape) or any(not isinstance(v, int) for v in sizes[lead:]):
        return f"{what}: `{node.name}` states the head sizes from other tensors"
    blocks = tail[0] if len(tail) == 3 else 1
    return ChannelInfo(src_info.space, dim=len(shape) - 2, head=(len(shape) - 1, d), attention=owner), blocks


def merge_heads(node: fx.Node, src: fx.Node, src_info: ChannelInfo, shape: tuple[int, ...], owners: dict):
    """``x.transpose(1, 2).reshape(B, N, H * d)``: heads and head dim merged back into one dim of
    ``H*d`` (a channel of ``factor`` d). Returns ``(info, count attribute or None)`` or a lock reason."""
    in_shape = src.meta["shape"]
    h, (inner, d) = src_info.dim, src_info.head
    what = f"the heads of `{src_info.attention}`"
    if inner != h + 1 or tuple(shape) != tuple(in_shape[:h]) + (in_shape[h] * d,) + tuple(in_shape[h + 2:]):
        return f"{what}: `{node.name}` reshapes them other than merging heads and head dims"
    if h != len(shape) - 1:
        return f"{what}: merged anywhere but the last dim at `{node.name}`"
    sizes = view_sizes(node)
    entry = sizes[h] if len(sizes) == len(shape) else None
    if entry == -1:
        return replace(src_info, factor=d, head=None), None
    attn = owners.get(src_info.attention)
    attr = next((a for a in ATTN_DIM_ATTRS if isinstance(entry, int) and getattr(attn, a, None) == entry), None)
    if attr is None:
        return f"{what}: `{node.name}` states their merged size as {entry!r}, not -1 or the module's `attn_dim`"
    return replace(src_info, factor=d, head=None), attr


SDPA = getattr(F, "scaled_dot_product_attention", None)
MATMULS = {operator.matmul, torch.matmul, torch.bmm}


def is_attention_product(node: fx.Node) -> bool:
    return (node.op == "call_function" and (node.target in MATMULS or node.target is SDPA)) or (
        node.op == "call_method" and node.target in ("matmul", "bmm"))


def attention_product(node: fx.Node, info: dict, uf: UnionFind, shape: tuple[int, ...]) -> ChannelInfo | None:
    """``q @ k.T``, ``attn @ v`` or ``scaled_dot_product_attention(q, k, v)`` over heads: the
    heads are a batch dim of the product, so each head's output reads only that head (the spaces
    of the operands join). Anything else (a mask, a product over the heads) gives None: locked."""
    if node.target is SDPA:
        q, k, v = (list(node.args) + [node.kwargs.get(n) for n in ("query", "key", "value")])[:3]
        extra = [a for a in node.all_input_nodes if a not in (q, k, v)]
        ops = [q, k, v]
    else:
        ops, extra = list(node.args[:2]), [a for a in node.all_input_nodes if a not in node.args[:2]]
    extra = [a for a in extra if a.meta.get("shape") is not None]  # a mask tensor; None or a flag is fine
    if extra or not all(isinstance(a, fx.Node) and info.get(a) is not None and info[a].heads for a in ops):
        return None
    ndim = len(shape)
    infos = [info[a] for a in ops]
    if any(len(a.meta["shape"]) != ndim or i.dim >= ndim - 2 or i.dim != infos[0].dim
           or i.attention != infos[0].attention for a, i in zip(ops, infos)):
        return None
    space = infos[0].space
    for i in infos[1:]:
        space = uf.union(space, i.space)
    d = next(i.head[1] for i in infos if i.head is not None) if any(i.head for i in infos) else None
    if node.target is SDPA:
        ok = all(i.head == (ndim - 1, d) for i in infos)
        return replace(infos[0], space=space) if ok else None
    a, b = infos
    # a @ b contracts a's last dim with b's second last: the head dim goes there, or stays in b's last
    if a.head == (ndim - 1, d) and b.head == (ndim - 2, d):
        return replace(a, space=space, head=None)
    if a.head is None and b.head == (ndim - 1, d):
        return replace(b, space=space)
    return None
