"""The finder: one walk over a shape-annotated fx graph that assigns every node's channels to a
space, ties and locks spaces by the rules of :mod:`._shapes`, :mod:`._joins` and
:mod:`._attention`, and collects the spaces tied together into :class:`ChannelGroup` records."""

from __future__ import annotations

import operator
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from nestflex.graph.groups._attention import attention_product, is_attention_product, merge_heads, split_heads
from nestflex.graph.groups._joins import CAT_FUNCTIONS, concatenated, joined, sliced, stacked
from nestflex.graph.groups._shapes import (
    constant_dim,
    drop_dim,
    is_size_query,
    is_unbind,
    is_view,
    moved_dim,
    normalised_channel_dim,
    normalises_channels,
    op_name,
    qualname,
    read_as_blocks,
    reshaped,
    size_source,
    sizes_follow,
    unbind_dim,
    view_sizes,
)
from nestflex.graph.groups._spaces import ChannelInfo, UnionFind
from nestflex.graph.groups.records import ChannelGroup, Layout, Member

__all__ = ["find_groups", "WEIGHT_STANDARDISING_CONVS", "CHANNEL_STATISTIC_NORMS"]


#: conv classes whose forward standardises the weight over its input channels (timm's weight
#: standardisation, NF-ResNet's ``ScaledStdConv2d``): each output channel's weight is centred and
#: scaled by its own mean and variance over (inputs x kernel), so its outputs prune exactly (the
#: per-output ``gain`` joins the group); removing an input channel changes the mean and variance of
#: every kept weight, so their inputs prune only with ``approximate=True``
WEIGHT_STANDARDISING_CONVS = frozenset({"StdConv2d", "StdConv2dSame", "ScaledStdConv2d", "ScaledStdConv2dSame"})

#: modules that normalise over the channels with one statistic per sample and scale each channel
#: by its own ``weight``/``bias``, matched by class name (the library need not be imported): timm's
#: ConvNeXt-V2 ``GlobalResponseNorm`` divides each channel by the mean over channels of the
#: response norms. LayerNorm (and timm's/torchvision's channels-first ``LayerNorm2d``) and
#: ``GroupNorm(1, C)`` are recognised by type. Pruning such channels changes the statistic:
#: with ``approximate=True`` only
CHANNEL_STATISTIC_NORMS = frozenset({"GlobalResponseNorm"})


_ACT_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid,
    nn.Tanh, nn.Identity, nn.Dropout, nn.Dropout2d, nn.MaxPool2d, nn.AvgPool2d,
    nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d,
)
_PASS_FUNCTIONS = {
    F.relu, F.relu6, F.hardtanh, F.leaky_relu, F.gelu, F.silu, F.hardswish, F.hardsigmoid,
    F.dropout, F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d,
    torch.relu, torch.sigmoid, torch.tanh, torch.flatten, torch.reshape, F.softmax, torch.softmax,
    torch.sum, torch.mean, torch.amax,
}
_PASS_METHODS = {
    "relu", "relu_", "sigmoid", "tanh", "contiguous", "clone", "float", "to", "flatten", "view",
    "reshape", "mean", "sum", "amax", "softmax", "expand",
}
#: functions of other libraries that scale whole samples (or the whole batch) and keep every
#: channel where it is, matched by qualified name so the library need not be imported:
#: torchvision's stochastic depth (an fx-wrapped call in EfficientNet, ConvNeXt, Swin...)
_PASS_FUNCTION_NAMES = {"torchvision.ops.stochastic_depth.stochastic_depth"}
_JOIN_FUNCTIONS = {operator.add, operator.iadd, operator.mul, operator.imul, operator.sub, torch.add, torch.mul}
_JOIN_METHODS = {"add", "add_", "mul", "mul_", "sub", "sub_"}


def find_groups(gm: fx.GraphModule, root: nn.Module | None = None,
                approximate: bool = False) -> tuple[list[ChannelGroup], list[str]]:
    """Derive coupled channel groups from a shape-annotated GraphModule.

    Args:
        gm: the traced model, with ``node.meta["shape"]`` set on every node (as
            :func:`~nestflex.graph.trace` leaves it, after running an example input through).
        root: the model ``gm`` was traced from: the graph module keeps only the modules it
            calls, so the attributes of the others (an attention's ``num_heads``) are read from
            it. ``None`` reads them from ``gm``.
        approximate: also make prunable the groups that are locked only because pruning them
            changes a statistic over the channels (a LayerNorm over them, ``GroupNorm(1, C)``,
            ConvNeXt-V2's GRN, a weight-standardised conv's inputs): their
            :attr:`ChannelGroup.approximation` says what changes, and pruned no longer equals
            masked for them. ``False`` (default): such groups are locked, with that reason.

    Returns:
        ``(groups, unsupported)``: every group that has a producer, in trace order, and the ops
        that forced a lock (for reports).
    """
    uf = UnionFind()
    info: dict[fx.Node, ChannelInfo | None] = {}
    members: list[tuple[int, Member]] = []
    locked: dict[int, str] = {}
    inexact: list[tuple[int, str]] = []  # spaces that prune only approximately, and why
    unsupported: list[str] = []
    layouts: list[Layout] = []
    interleaved: list[tuple[int, int, str]] = []  # (space, blocks, grouped conv) of grouped convs
    retyped: dict[tuple[int, str], tuple[int, int]] = {}  # (space, qkv Linear) -> (blocks, head dim)
    scaled: list[tuple[fx.Node, int]] = []  # attention products whose MACs follow a head group's width
    modules = dict(gm.named_modules())
    owners = dict(root.named_modules()) if root is not None else modules

    def lock(space: int | ChannelInfo, reason: str) -> None:
        for sp in space.spaces if isinstance(space, ChannelInfo) else [space]:
            locked.setdefault(sp, reason)

    def changes_statistic(space: ChannelInfo, reason: str) -> None:
        inexact.extend((sp, reason) for sp in space.spaces)

    def attribute(node: fx.Node, shape) -> ChannelInfo | None:
        """A parameter or buffer the forward reads (a class token, a position embedding, a layer
        scale): a space of its own that an elementwise op may tie to a tensor's channels, its
        entries along :func:`constant_dim` a member. Anything else fx keeps (its tensor
        constants) is locked."""
        if shape is None:
            return None
        owner, _, attr = node.target.rpartition(".")
        mod = owners.get(owner)
        if not shape or mod is None or (attr not in mod._parameters and attr not in mod._buffers):
            return fresh(f"attribute `{node.target}`")
        out = replace(fresh(), dim=constant_dim(shape), constant=True)
        members.append((out.space, Member(owner, attr, out.dim, role="param")))
        return out

    def add(src: ChannelInfo, name: str, attr: str, dim: int, role: str) -> None:
        """Members of a consumer of ``src``: one, or one per part of a concatenated tensor."""
        if src.parts is None:
            members.append((src.space, Member(name, attr, dim, src.factor, role=role)))
            return
        for sp, _ in src.parts:
            members.append((sp, Member(name, attr, dim, src.factor, role=role, layout=src.layout)))

    def composite(parts: list[tuple[int, int]], factor: int = 1) -> ChannelInfo:
        layout = Layout(tuple(sp for sp, _ in parts), tuple(w for _, w in parts))
        layouts.append(layout)
        return ChannelInfo(-1, factor, tuple(parts), layout)

    def fresh(reason: str | None = None) -> ChannelInfo:
        s = uf.new()
        if reason:
            lock(s, reason)
        return ChannelInfo(s)

    def tensor_args(node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if info.get(a) is not None]

    def opaque(node: fx.Node, what: str) -> ChannelInfo | None:
        for a in tensor_args(node):
            lock(info[a], f"used by {what}")
        unsupported.append(what)
        return fresh(f"output of {what}") if node.meta.get("shape") is not None else None

    def produce(name: str, mod: nn.Module) -> ChannelInfo:
        """A conv/linear output: a new channel space owned by its weight rows, its bias, and any
        other per-output tensor a subclass holds (timm's ScaledStdConv2d ``gain``). Another
        tensor of the module with more than one element locks the space: its layout is unknown."""
        out = fresh()
        width = mod.weight.shape[0]
        for attr, t in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]:
            if attr in ("weight", "bias") or (t.dim() >= 1 and t.shape[0] == width):
                members.append((out.space, Member(name, attr, 0, role="out")))
            elif t.numel() > 1:
                lock(out.space, f"`{name}.{attr}` of shape {tuple(t.shape)} is not per output channel")
        return out

    for node in gm.graph.nodes:
        shape = node.meta.get("shape")
        if node.op == "placeholder":
            info[node] = fresh("model input")
            continue
        if node.op == "output":
            for a in tensor_args(node):
                lock(info[a], "model output")
            continue
        if node.op == "get_attr":
            info[node] = attribute(node, shape)
            continue
        if is_unbind(node) and isinstance(node.args[0], fx.Node) and info.get(node.args[0]) is not None \
                and info[node.args[0]].heads:
            src_info = info[node.args[0]]
            u = unbind_dim(node, len(node.args[0].meta["shape"]))
            if u is not None and u != src_info.dim and (src_info.head is None or u != src_info.head[0]):
                info[node] = replace(src_info, unbound=u)  # q, k, v = qkv.unbind(0)
                continue
        if shape is None or len(shape) < 2:
            # Size queries carry no channels. Anything else that leaves no channel dim (a
            # reduction over channels, a tuple result) loses track of them: lock the source.
            if not is_size_query(node):
                for a in tensor_args(node):
                    lock(info[a], f"reduced by `{node.name}`")
            info[node] = None
            continue
        src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        src_info = info.get(src) if src is not None else None

        if node.op == "call_module":
            mod = modules[node.target]
            name = node.target
            if isinstance(mod, nn.Conv2d) and src_info is not None and src_info.factor == 1 and src_info.dim == 1:
                if mod.groups == 1:
                    add(src_info, name, "weight", 1, "in")
                    if type(mod).__name__ in WEIGHT_STANDARDISING_CONVS:
                        changes_statistic(src_info, f"`{name}` ({type(mod).__name__}) standardises its weight over its "
                                                    "inputs: removing one changes the mean and variance of every kept "
                                                    "weight")
                    info[node] = produce(name, mod)
                elif mod.groups == mod.in_channels == mod.out_channels:
                    add(src_info, name, "weight", 0, "depthwise")
                    if mod.bias is not None:
                        add(src_info, name, "bias", 0, "depthwise")
                    info[node] = src_info.with_factor(1)
                elif src_info.parts is None:
                    # the weight's dim 1 is the position inside a block: one entry per channel
                    members.append((src_info.space, Member(name, "weight", 1, role="in")))
                    out = produce(name, mod)
                    interleaved += [(src_info.space, mod.groups, name), (out.space, mod.groups, name)]
                    info[node] = out
                else:
                    lock(src_info, f"grouped conv `{name}` reads a concatenation")
                    info[node] = fresh(f"grouped conv `{name}` reads a concatenation")
            elif isinstance(mod, nn.Linear) and src_info is not None and src_info.heads:
                # merged heads (factor d) feed the attention's output projection
                if src_info.head is None and src_info.dim == len(shape) - 1 and name == f"{src_info.attention}.proj":
                    add(src_info, name, "weight", 1, "in")
                else:
                    lock(src_info, f"attention heads of `{src_info.attention}` reach `{name}` (Linear), not its `proj`")
                info[node] = produce(name, mod).at(len(shape) - 1)
            elif isinstance(mod, nn.Linear) and src_info is not None and src_info.dim == len(shape) - 1 and (
                    len(shape) == 2 or (src_info.factor == 1 and src_info.parts is None)):
                # on the last dim: (N, C) features, (N, T, C) tokens, (N, H, W, C) channels-last
                add(src_info, name, "weight", 1, "in")
                info[node] = produce(name, mod).at(len(shape) - 1)
            elif isinstance(mod, nn.Linear) and src_info is not None and len(shape) > 2:
                # over another dim (MLP-Mixer's token mixing, or an input whose channel dim is
                # unknown): the source's channels stay a fixed dim of the output, its own are last
                lock(src_info, f"`{name}` (Linear) mixes a dim other than their channels")
                info[node] = produce(name, mod).at(len(shape) - 1)
            elif (isinstance(mod, (nn.LayerNorm, nn.GroupNorm)) or type(mod).__name__ in CHANNEL_STATISTIC_NORMS) \
                    and src_info is not None and normalised_channel_dim(mod, src_info, shape):
                # one statistic over the channels, then a weight and bias per channel
                for attr in ("weight", "bias"):
                    if isinstance(getattr(mod, attr, None), torch.Tensor):
                        add(src_info, name, attr, 0, "norm")
                changes_statistic(src_info, f"`{name}` ({type(mod).__name__}) normalises over the channels: "
                                            "removing one changes its statistics")
                info[node] = src_info
            elif isinstance(mod, (nn.LayerNorm, nn.GroupNorm)) and src_info is not None and normalises_channels(
                    mod, src_info, shape):
                lock(src_info, f"`{name}` ({type(mod).__name__}) normalises over the channels")
                info[node] = src_info
            elif isinstance(mod, _BatchNorm) and src_info is not None and src_info.dim == 1 and (
                    src_info.factor == 1 or len(shape) == 2):
                for attr in ("weight", "bias", "running_mean", "running_var"):
                    if getattr(mod, attr, None) is not None:
                        add(src_info, name, attr, 0, "norm")
                info[node] = src_info
            elif src_info is not None and (
                isinstance(mod, (_ACT_MODULES, nn.Flatten))
                or (isinstance(mod, nn.PReLU) and mod.num_parameters == 1)
            ):
                info[node] = reshaped(node, src, src_info, shape) or opaque(node, f"`{name}` ({type(mod).__name__})")
            else:
                info[node] = opaque(node, f"`{name}` ({type(mod).__name__})")
            continue

        target = node.target
        is_join = (node.op == "call_function" and target in _JOIN_FUNCTIONS) or (
            node.op == "call_method" and target in _JOIN_METHODS
        )
        if is_join:
            info[node] = joined(node, info, uf, shape, composite) or opaque(node, f"`{node.name}`")
            continue
        if node.op == "call_function" and target is torch.stack:
            info[node] = stacked(node, info, uf, shape) or opaque(node, f"`{node.name}` (stack)")
            continue
        if node.op == "call_function" and target in CAT_FUNCTIONS:
            info[node] = concatenated(node, info, uf, shape, composite) or opaque(node, f"`{node.name}` (cat)")
            continue
        if node.op == "call_function" and target is operator.getitem and src_info is not None \
                and src_info.unbound is not None:
            info[node] = drop_dim(src_info, src_info.unbound) if isinstance(node.args[1], int) else opaque(
                node, f"`{node.name}` (an item of unbind)")
            continue
        if node.op == "call_function" and target is operator.getitem and src_info is not None:
            info[node] = sliced(node, src, src_info, shape, composite, lock) or opaque(
                node, f"`{node.name}` (a slice through the channels)")
            continue
        moved = moved_dim(node, src_info) if src_info is not None else None
        if moved is not None:
            info[node] = moved
            continue
        if is_attention_product(node):
            out = attention_product(node, info, uf, shape)
            if out is not None:
                scaled.append((node, out.space))
            info[node] = out or opaque(node, f"`{node.name}` ({op_name(node)})")
            continue
        is_pass = (
            node.op == "call_function" and (target in _PASS_FUNCTIONS or qualname(target) in _PASS_FUNCTION_NAMES)
        ) or (node.op == "call_method" and target in _PASS_METHODS)
        if is_pass and src_info is not None and is_view(node) and not src_info.heads:
            blocks = read_as_blocks(node, src, src_info, shape, modules)
            if blocks is not None:
                retyped[(src_info.space, src.target)] = (blocks, 1)
                info[src] = None  # the layer's own output is the blocks, not one channel each
                info[node] = src_info.at(2)
                continue
            split = split_heads(node, src, src_info, shape, modules, owners)
            if isinstance(split, str):
                lock(src_info, split)
            elif split is not None:
                heads, blocks = split
                retyped[(src_info.space, src.target)] = (blocks, heads.head[1])
                members.append((src_info.space, Member(heads.attention, "num_heads", 0, role="count")))
                info[src] = None  # the Linear's own output is now the heads' blocks, not one channel each
                info[node] = heads
                continue
        if is_pass and src_info is not None and src_info.heads and src_info.head is not None and is_view(node):
            merged = merge_heads(node, src, src_info, shape, owners)
            if isinstance(merged, str):
                lock(src_info, merged)
                info[node] = fresh(merged)
            else:
                out, attr = merged
                if attr:
                    members.append((out.space, Member(out.attention, attr, 0, out.factor, role="count")))
                info[node] = out
            continue
        if is_pass and src_info is not None:
            out = reshaped(node, src, src_info, shape)
            if out is not None and not sizes_follow(node, out, info, uf):
                out = None
            info[node] = out or opaque(node, f"`{node.name}` ({op_name(node)})")
            continue
        info[node] = opaque(node, f"`{node.name}` ({op_name(node)})")

    node_spaces = []
    for n, i in info.items():
        # a parameter is no response of the channels (criteria read responses from these nodes)
        if i is not None and i.factor == 1 and i.parts is None and n.op != "placeholder" and i.unbound is None \
                and not i.constant:
            node_spaces.append((n.name, i.space))
            n.meta["channel_dim"] = i.dim  # criteria read a response's channels here
    if approximate:
        _lock_stale_sizes(gm, info, uf, {uf.find(sp) for sp, _ in inexact}, lock)
    reasons: dict[int, list[str]] = {}
    for space, reason in inexact:
        if approximate:
            reasons.setdefault(uf.find(space), []).append(reason)
        else:
            lock(space, f"{reason} (pruned would not equal masked; `approximate=True` prunes it anyway)")
    # a residual stream passes through a norm per block: the first reason, and how many more
    approximations = {root: rs[0] + (f" (and {len(set(rs)) - 1} more such layers)" if len(set(rs)) > 1 else "")
                      for root, rs in reasons.items()}
    groups = _collect(gm, uf, members, locked, node_spaces, layouts, interleaved, retyped, scaled, approximations)
    return groups, unsupported


def _lock_stale_sizes(gm: fx.GraphModule, info: dict, uf: UnionFind, roots: set[int], lock) -> None:
    """Channels that prune only approximately are new to pruning: a forward may read their width
    (``B, N, C = x.shape``) and use it for other channels (CoaT's ``qkv.reshape(B, N, 3, h, C // h)``),
    which would go stale once the stream shrinks. Their width may only state the same channels'
    size in a view (tied to them, :func:`sizes_follow`); any other use locks them."""
    for n in gm.graph.nodes:
        source = size_source(n)
        t_info = info.get(source[0]) if source is not None else None
        if t_info is None or t_info.parts is not None or t_info.factor != 1:
            continue
        t, k = source
        if k % len(t.meta["shape"]) != t_info.dim or uf.find(t_info.space) not in roots:
            continue
        for u in n.users:
            u_info = info.get(u)
            sizes = view_sizes(u) if is_view(u) or (u.op == "call_method" and u.target == "expand") else []
            if not (u_info is not None and u_info.dim < len(sizes) and sizes[u_info.dim] is n
                    and uf.find(u_info.space) == uf.find(t_info.space)):
                lock(t_info, f"their width, read at `{n.name}`, sizes other channels at `{u.name}`")


def _collect(gm, uf, members, locked, node_spaces, layouts, interleaved, retyped, scaled,
             approximations) -> list[ChannelGroup]:
    locked_roots: dict[int, str] = {}
    for space, reason in locked.items():
        locked_roots.setdefault(uf.find(space), reason)
    # interleaved spaces: every member but a grouped conv's own dim-1 weight holds `blocks` copies
    blocks: dict[int, tuple[int, str]] = {}
    in_concat = {uf.find(sp) for layout in layouts for sp in layout._spaces}
    for space, g, conv in interleaved:
        root = uf.find(space)
        if root in blocks and blocks[root][0] != g:
            locked_roots.setdefault(root, f"grouped convs `{blocks[root][1]}` ({blocks[root][0]} groups) and "
                                          f"`{conv}` ({g} groups) share these channels")
        elif root in in_concat:
            locked_roots.setdefault(root, f"the blocks of grouped conv `{conv}` reach a concatenation")
        blocks.setdefault(root, (g, conv))
    in_block = {(space, conv) for space, _, conv in interleaved}
    by_root: dict[int, list[Member]] = {}
    order: list[int] = []
    for space, m in members:
        root = uf.find(space)
        if root not in by_root:
            by_root[root] = []
            order.append(root)
        if root in blocks and root not in locked_roots and not (m.role == "in" and m.dim == 1 and m.attr == "weight"
                                                                and (space, m.module) in in_block):
            m = replace(m, copies=blocks[root][0])
        if m.role == "out" and (space, m.module) in retyped:  # a qkv Linear: a head is d rows of every block
            copies, d = retyped[(space, m.module)]
            m = replace(m, copies=copies, factor=d)
        by_root[root].append(m)
    nodes_by_root: dict[int, list[str]] = {}
    for name, space in node_spaces:
        nodes_by_root.setdefault(uf.find(space), []).append(name)
    groups: list[ChannelGroup] = []
    group_of: dict[int, ChannelGroup] = {}
    for root in order:
        ms = by_root[root]
        producers = [m for m in ms if m.role in ("out", "depthwise")]
        if not any(m.role == "out" for m in ms):
            continue  # e.g. the model input: consumed, never produced
        first = producers[0]
        ref = next(m for m in ms if m.role == "out")  # a producer's own rows: never a concatenation's part
        t = getattr(gm.get_submodule(ref.module), ref.attr)
        width = t.shape[ref.dim] // (ref.factor * ref.copies)
        reason = locked_roots.get(root, "")
        groups.append(
            ChannelGroup(
                id=len(groups), name=first.module, width=width, members=ms, prunable=not reason, reason=reason,
                nodes=nodes_by_root.get(root, []),
                copies=blocks[root][0] if root in blocks and root not in locked_roots else 1,
                approximation="" if reason else approximations.get(root, ""),
            )
        )
        group_of[root] = groups[-1]
    for node, space in scaled:  # attention products: MACs proportional to the heads kept
        g = group_of.get(uf.find(space))
        if g is not None:
            node.meta["macs_group"] = (g.id, g.width)
    # each part of a concatenation is a group (whose width follows surgery) or a fixed width
    for layout in layouts:
        layout.parts = [group_of.get(uf.find(sp), w) for sp, w in zip(layout._spaces, layout._widths)]
    return groups
