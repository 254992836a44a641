"""How one tensor's channel dim moves through shape ops: reshapes and flattens, permutes and
transposes, reductions over other dims, views that read a layer's rows as blocks, unbind and
indexing; whether a view states its channel size so that it follows pruning."""

from __future__ import annotations

import math
import operator
from dataclasses import replace

import torch
from torch import fx, nn

from nestflex.graph.groups._spaces import ChannelInfo, UnionFind


def is_size_query(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op == "call_function" and node.target is getattr:
        return node.args[1] in ("shape", "device", "dtype", "ndim")
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, fx.Node) and is_size_query(src)
    return False


def qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', '')}"


def op_name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def reshaped(node: fx.Node, src: fx.Node, src_info: ChannelInfo, shape: tuple[int, ...]) -> ChannelInfo | None:
    """Classify a shape-changing pass-through by the shapes themselves (not the op name)."""
    in_shape = src.meta.get("shape")
    if in_shape is None or reduces_channels(node, src_info, len(in_shape)):
        return None
    if src_info.heads:  # (dropout, softmax over keys, identity q/k norms): the same shape only
        return src_info if tuple(shape) == tuple(in_shape) else None
    if src_info.constant:
        # a parameter viewed for broadcasting (``gamma.reshape(1, -1, 1, 1)``): the channels are
        # its one dim of more than one entry before and after (it has no batch dim to confuse)
        before = [i for i, n in enumerate(in_shape) if n != 1]
        after = [i for i, n in enumerate(shape) if n != 1]
        if before == [src_info.dim] and len(after) == 1 and shape[after[0]] == in_shape[src_info.dim]:
            return src_info.at(after[0])
        if tuple(shape) == tuple(in_shape):
            return src_info
        last = len(in_shape) - 1
        if src_info.dim == last and len(shape) >= 2 and shape[-1] == in_shape[-1]:
            return src_info.at(len(shape) - 1)  # ``cls_token.expand(B, -1, -1)``
        return None
    if src_info.dim != 1 and tuple(shape) == tuple(in_shape):
        return src_info  # elementwise, or a softmax over another dim (selective kernels' paths)
    if src_info.dim != 1 and src_info.factor == 1 and src_info.parts is None:
        kept = reduced_dim(node, src_info.dim, len(in_shape))
        if kept is not None:
            return src_info.at(kept)
    if src_info.dim != 1:
        # channels last: a reshape that keeps the last dim keeps every row of channels whole
        # (row-major), whatever it does to the dims before (tokens, windows folded into dim 0)
        last = len(in_shape) - 1
        if src_info.dim == last and src_info.factor == 1 and len(shape) >= 2 and shape[-1] == in_shape[-1]:
            return src_info.at(len(shape) - 1)
        return None
    if len(shape) >= 2 and shape[:2] == in_shape[:2] and (len(shape) == len(in_shape) or src_info.factor == 1):
        # channel dim kept: activations, pools, mean over H,W with keepdim, ...
        if len(shape) == 2 and len(in_shape) > 2:
            return src_info.with_factor(1)  # global pooling without keepdim: (N, C)
        return src_info
    if len(shape) == 2 and len(in_shape) > 2 and shape[0] == in_shape[0]:
        spatial = math.prod(in_shape[2:])
        if shape[1] == in_shape[1] * spatial:  # flatten(1) of (N, C, ...): channel-major
            return src_info.with_factor(src_info.factor * spatial)
    return None

def index_other_dims(index: tuple, src_info: ChannelInfo, ndim: int) -> ChannelInfo | None:
    """``x[...]`` of a tensor whose channels are not on dim 1 (tokens ``(N, T, C)``): integers and
    slices on the other dims, nothing on the channels (ViT's class token ``x[:, 0]``); the
    channels move left by the integers before them."""
    if src_info.factor != 1 or src_info.parts is not None or not index:
        return None
    if index[0] != slice(None) and not src_info.heads:  # heads: q, k, v = qkv[0], qkv[1], qkv[2]
        return None
    own = [src_info.dim] + ([src_info.head[0]] if src_info.head is not None else [])
    for i, ix in enumerate(index):
        if ix is Ellipsis or ix is None or isinstance(ix, bool) or not isinstance(ix, (int, slice)):
            return None
        if i in own and ix != slice(None):
            return None
    if ndim <= max(own):
        return None
    ints = [i for i, ix in enumerate(index) if isinstance(ix, int)]
    head = src_info.head
    if head is not None:
        head = (head[0] - sum(i < head[0] for i in ints), head[1])
    return replace(src_info, dim=src_info.dim - sum(i < src_info.dim for i in ints), head=head)


def size_source(arg) -> tuple[fx.Node, int] | None:
    """``(tensor, dim)`` when ``arg`` is ``t.shape[dim]`` or ``t.size(dim)`` of a node."""
    if not isinstance(arg, fx.Node):
        return None
    if arg.op == "call_method" and arg.target == "size" and len(arg.args) == 2 and isinstance(arg.args[1], int):
        return arg.args[0], arg.args[1]
    if arg.op == "call_function" and arg.target is operator.getitem and isinstance(arg.args[1], int):
        src = arg.args[0]
        if isinstance(src, fx.Node) and src.op == "call_function" and src.target is getattr and src.args[1] == "shape":
            return src.args[0], arg.args[1]
        if isinstance(src, fx.Node) and src.op == "call_method" and src.target == "size" and len(src.args) == 1:
            return src.args[0], arg.args[1]
    return None


def sizes_follow(node: fx.Node, out: ChannelInfo, info: dict, uf: UnionFind) -> bool:
    """A ``view``/``reshape`` states the size of the channel dim: it must follow pruning. ``-1``
    does; another tensor's size (``c`` of ``n, c, h, w = x.shape``) does when the two share their
    channels, so the spaces are tied (like an add); a constant does not (False: the caller locks)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in ("view", "reshape", "expand") or out.parts is not None or out.factor != 1:
        return True
    sizes = list(node.args[1:])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = list(sizes[0])
    if len(sizes) <= out.dim:
        return False
    entry = sizes[out.dim]
    if entry == -1:
        return True
    source = size_source(entry)
    if source is None:
        return False
    t, k = source
    other = info.get(t)
    if other is None or other.parts is not None or other.factor != 1 or other.dim != k % len(t.meta["shape"]):
        return False
    uf.union(out.space, other.space)
    return True


def reduces_channels(node: fx.Node, src_info: ChannelInfo, ndim: int) -> bool:
    """A ``mean``/``sum``/``amax`` over the channel dim (or over everything), or a softmax across
    the channels (each output depends on every channel)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in ("mean", "sum", "amax", "softmax"):
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None:
        return True
    dims = dims if isinstance(dims, (list, tuple)) else (dims,)
    return any(not isinstance(x, int) or x % ndim == src_info.dim for x in dims)


#: LayerNorm subclasses that normalise a channels-first map over its channels (dim 1) by permuting
#: it to channels-last around the norm: timm's and torchvision's ConvNeXt ``LayerNorm2d``
CHANNELS_FIRST_LAYER_NORMS = frozenset({"LayerNorm2d"})


def normalises_channels(mod: nn.Module, src_info: ChannelInfo, shape: tuple[int, ...]) -> bool:
    """A LayerNorm whose normalised dims include the channels (a ``LayerNorm2d`` on dim 1
    channels included), or a GroupNorm on dim 1 channels."""
    if isinstance(mod, nn.GroupNorm):
        return src_info.dim == 1
    if type(mod).__name__ in CHANNELS_FIRST_LAYER_NORMS and src_info.dim == 1:
        return True
    return src_info.dim >= len(shape) - len(mod.normalized_shape)


def normalised_channel_dim(mod: nn.Module, src_info: ChannelInfo, shape: tuple[int, ...]) -> bool:
    """Whether a norm over the channels keeps one ``weight``/``bias`` entry per channel and one
    statistic per sample (or per position) over exactly these channels, so that pruning a channel
    removes its entries and changes the statistic, nothing else (``approximate=True``): a LayerNorm
    over the channels alone (the last dim, or dim 1 for a ``LayerNorm2d``), ``GroupNorm(1, C)``, or
    a module of ``CHANNEL_STATISTIC_NORMS`` whose ``channel_dim`` is the channels (timm's GRN).
    Anything else (a LayerNorm over ``(C, H, W)``, GroupNorm with several groups) stays locked."""
    if src_info.factor != 1 or src_info.heads:
        return False
    width = shape[src_info.dim]
    if isinstance(mod, nn.GroupNorm):
        return src_info.dim == 1 and mod.num_groups == 1 and mod.num_channels == width
    if isinstance(mod, nn.LayerNorm):
        if tuple(mod.normalized_shape) != (width,):
            return False
        first = type(mod).__name__ in CHANNELS_FIRST_LAYER_NORMS
        return src_info.dim == (1 if first else len(shape) - 1)
    dim = getattr(mod, "channel_dim", None)
    weight = getattr(mod, "weight", None)
    return (isinstance(dim, int) and dim % len(shape) == src_info.dim and isinstance(weight, torch.Tensor)
            and tuple(weight.shape) == (width,))


def constant_dim(shape: tuple[int, ...]) -> int:
    """The channel dim of a parameter or buffer read by the forward (a layer scale ``(C,)``, a
    class token ``(1, 1, C)``, a position embedding ``(1, T, C)``): its only dim of more than one
    entry, else its last (tokens and channels-last maps keep the channels last). Only a guess until
    an elementwise op aligns it with a tensor's channels (:func:`~._joins.joined` checks that)."""
    big = [i for i, n in enumerate(shape) if n != 1]
    return big[0] if len(big) == 1 else len(shape) - 1

#: permute / transpose, as methods or functions: they move the channel dim
PERMUTES = {"permute", "transpose", "swapaxes", "swapdims"}


def moved_dim(node: fx.Node, src_info: ChannelInfo) -> ChannelInfo | None:
    """The channels after ``permute``/``transpose`` (None: not such an op, or not constant);
    attention heads move their head dim too."""
    perm = permutation(node, src_info)
    if perm is None:
        return None
    head = (perm.index(src_info.head[0]), src_info.head[1]) if src_info.head is not None else None
    return replace(src_info, dim=perm.index(src_info.dim), head=head)


def permutation(node: fx.Node, src_info: ChannelInfo) -> list[int] | None:
    """For a ``permute``/``transpose``: the source dim of each output dim."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if node.op not in ("call_method", "call_function") or name not in PERMUTES:
        return None
    if node.op == "call_function" and node.target not in (torch.permute, torch.transpose, torch.swapaxes,
                                                          torch.swapdims):
        return None
    shape = node.meta.get("shape")
    if shape is None or src_info.factor != 1:
        return None
    ndim, rest = len(shape), list(node.args[1:])
    if name == "permute":
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
        if len(dims) != ndim or not all(isinstance(x, int) for x in dims):
            return None
        return [x % ndim for x in dims]
    if len(rest) != 2 or not all(isinstance(x, int) for x in rest):
        return None
    perm = list(range(ndim))
    a, b = rest[0] % ndim, rest[1] % ndim
    perm[a], perm[b] = perm[b], perm[a]
    return perm


def reduced_dim(node: fx.Node, dim: int, ndim: int) -> int | None:
    """Where channel dim ``dim`` lands after a ``mean``/``sum``/``amax`` over other dims (None:
    not such a reduction). Callers rule out reductions over the channels first."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if name not in ("mean", "sum", "amax") or dims is None:
        return None
    dims = dims if isinstance(dims, (list, tuple)) else (dims,)
    if not all(isinstance(d, int) for d in dims):
        return None
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    return dim if keep else dim - sum(d % ndim < dim for d in dims)

def read_as_blocks(node: fx.Node, src: fx.Node, src_info: ChannelInfo, shape: tuple[int, ...], modules: dict) -> int | None:
    """``fc(x).view(B, k, C // k, H, W)``: a layer's output channels read as ``k`` blocks of ``C/k``
    (a selective kernel's per-path attention). Returns ``k``: channel ``j`` is entry ``j`` of every
    block of the layer's rows (:attr:`Member.copies`), and sits on dim 2. None when the view is
    not that, or states the block width as a constant (it would not follow pruning)."""
    in_shape = src.meta.get("shape")
    if (in_shape is None or src_info.dim != 1 or src_info.parts is not None or src_info.factor != 1
            or src.op != "call_module" or [u for u in src.users if not is_size_query(u)] != [node]
            or not isinstance(modules.get(src.target), (nn.Conv2d, nn.Linear))):
        return None
    if isinstance(modules[src.target], nn.Conv2d) and modules[src.target].groups != 1:
        return None
    if (len(shape) != len(in_shape) + 1 or shape[0] != in_shape[0] or tuple(shape[3:]) != tuple(in_shape[2:])
            or shape[1] < 2 or shape[1] * shape[2] != in_shape[1]):
        return None
    sizes = view_sizes(node)
    if len(sizes) != len(shape) or sizes[1] != shape[1]:
        return None
    width = sizes[2]  # -1, or the layer's own channel count // k: both follow pruning
    follows = width == -1 or (isinstance(width, fx.Node) and width.op == "call_function"
                              and width.target is operator.floordiv and width.args[1] == shape[1]
                              and size_source(width.args[0]) == (src, 1))
    return shape[1] if follows else None



def is_view(node: fx.Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return name in ("view", "reshape")


def is_unbind(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "unbind") or (
        node.op == "call_function" and node.target is torch.unbind)


def unbind_dim(node: fx.Node, ndim: int) -> int | None:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return dim % ndim if isinstance(dim, int) else None


def drop_dim(src_info: ChannelInfo, u: int) -> ChannelInfo:
    """An item of ``unbind(u)``: the dims after ``u`` move left."""
    head = src_info.head
    if head is not None:
        head = (head[0] - (u < head[0]), head[1])
    return replace(src_info, dim=src_info.dim - (u < src_info.dim), head=head, unbound=None)


def view_sizes(node: fx.Node) -> list:
    sizes = list(node.args[1:])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = list(sizes[0])
    return sizes
