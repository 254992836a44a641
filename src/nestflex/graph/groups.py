"""Coupled channel groups: which tensor dimensions must shrink, grow or move together.

Every node's output channel dimension (dim 1) belongs to a *channel space*. A conv or linear
creates a new space; BatchNorm, activations, pools, dropout and identity keep it; an elementwise
add/mul of two tensors ties their spaces together (residual connections); a depthwise conv keeps
its input's space; a flatten of ``(C, H, W)`` maps channel ``c`` to the ``H*W`` features
``c*H*W ... c*H*W + H*W - 1`` of the next linear. Spaces tied together form one
:class:`ChannelGroup` whose members are the parameter/buffer slices to edit.

A concatenation along the channels makes a *composite* tensor: its channels are the inputs'
channels one part after the other. A consumer of it (a conv's input, a norm, a depthwise conv, a
linear after a flatten) holds one member per part, each with a :class:`Layout` saying which parts
come before it; the offsets are read from the parts' current widths at surgery time, so pruning
one part moves the others' rows (Torch-Pruning's index mapping, DenseNet's and Inception's
blocks). A slice ``x[:, :b]`` that keeps every channel stays the identity as they are pruned; one
that keeps whole parts locks them (its bounds are constants) and leaves the later parts free.

A grouped (non-depthwise) conv with ``G`` groups reads its input in ``G`` blocks and writes its
output in ``G`` blocks; a group keeps the same number of channels in every block. Its input and
output spaces are *interleaved*: a group's channel ``j`` stands for channel ``j`` of every block
(``G`` physical channels, :attr:`Member.copies`), and the conv's weight is indexed on dim 1 by
the position inside a block. Pruning channel ``j`` removes it from every block, so the conv keeps
its ``G`` groups with narrower blocks (Torch-Pruning prunes grouped convs the same way:
``ch_groups``). ResNeXt and RegNet blocks prune this way.

Channels need not be dim 1. Each tensor's channel dim is followed through ``permute``,
``transpose`` and reshapes that keep it whole (the last dim of a token tensor ``(N, T, C)`` or of
a channels-last map ``(N, H, W, C)``, windows folded into the batch included), so a ``Linear`` on
the last dim consumes and produces channels like a 1x1 conv: a transformer's MLP hidden
channels (``fc1`` -> GELU -> ``fc2``) form a group. ``LayerNorm`` and ``GroupNorm`` normalise over
the channels (removing one changes every other's statistics), so they lock theirs.

``torch.stack`` of tensors that carry the same channels ties them (like an add) and moves the
channel dim right; ``sum``/``mean`` over other dims move it back. A layer whose output is read
as ``k`` blocks (``fc(x).view(B, k, C // k, H, W)``, a selective kernel's per-path attention)
holds channel ``j`` in row ``j`` of every block (:attr:`Member.copies` ``k``), so timm's
``SelectiveKernel`` prunes its paths with the attention that weighs them.

Attention heads are a unit. ``self.qkv(x).reshape(B, N, 3, H, d)`` splits a Linear's output
into blocks (q, k, v) of ``H`` heads of ``d`` dims; the heads are followed through the permute,
``unbind``/indexing into q, k and v, ``scaled_dot_product_attention`` or ``q @ k.T``, softmax,
``attn @ v``, and the reshape that merges them back into the last dim, into the Linear after
(``proj``). They form a group of width ``H``: a head is ``d`` consecutive rows of each block of
``qkv`` (:attr:`Member.copies` blocks, :attr:`Member.factor` ``d``) and ``d`` consecutive inputs
of ``proj``, and the module's ``num_heads`` (and ``attn_dim``) follow as *count* members. Whole
heads, not head dims, so the softmax scale (``d ** -0.5``, by default read off the tensors' size)
is unchanged and pruned equals masked exactly; Torch-Pruning's ``prune_num_heads``. This is
timm's ``Attention`` convention: the module has int ``num_heads`` and ``head_dim`` and a
``proj`` Linear; anything else (a per-head bias table, a mask, other names) locks the heads.

A space is *locked* (not prunable) when it touches something the analysis cannot see through:
the model input or output, an opaque module, a channel slice (its bounds are constants), a
composite tensor added to a plain one, a grouped conv fed by a concatenation or reaching one,
two grouped convs with different block counts on one space, or any op not listed below.
Locking is always the safe answer: a locked group is simply not pruned.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["Member", "Layout", "ChannelGroup", "find_groups"]


@dataclass(frozen=True)
class Member:
    """One tensor slice that belongs to a channel group.

    Attributes:
        module: qualified name of the owning module (``model.get_submodule(module)``).
        attr: parameter or buffer name on that module (``weight``, ``running_mean``...).
        dim: the dimension indexed by the group's channels.
        factor: consecutive entries per channel along ``dim`` (``H*W`` for a linear fed by a
            flatten of ``(C, H, W)``, else 1).
        role: ``out`` (produces the channels), ``in`` (consumes them), ``norm`` (per-channel
            statistics/affine), ``depthwise`` (a depthwise conv, which is both) or ``count`` (an
            int attribute of the module equal to ``width * factor``: an attention's ``num_heads``).
        layout: for a tensor fed by a concatenation, the parts of ``dim`` in order (this group is
            one or more of them); ``None`` when the group owns the whole dim.
        copies: blocks of an interleaved group (a grouped conv's ``G``): channel ``j`` is entry
            ``j`` of every block, block ``b`` starting at ``b * width``; 1 otherwise, and for a
            grouped conv's own weight on dim 1 (the position inside a block).
    """

    module: str
    attr: str
    dim: int
    factor: int = 1
    role: str = "out"
    layout: "Layout | None" = None
    copies: int = 1

    def rows(self, group: "ChannelGroup", idx: torch.Tensor, others: bool = True) -> torch.Tensor:
        """Entries along ``dim`` that channels ``idx`` of ``group`` hold in this tensor, at their
        offset in a concatenated dim; with ``others`` every other part is kept whole too (so the
        result selects along the whole dim, what surgery needs). An interleaved group's entries
        come block by block, each block in ``idx`` order."""
        if self.copies > 1:
            idx = (torch.arange(self.copies)[:, None] * group.width + idx[None, :]).flatten()
        own = (idx[:, None] * self.factor + torch.arange(self.factor)).flatten()
        if self.layout is None:
            return own
        rows, offset = [], 0
        for part in self.layout.parts:
            w = self.layout.width(part) * self.factor
            if part is group:
                rows.append(offset + own)
            elif others:
                rows.append(offset + torch.arange(w))
            offset += w
        return torch.cat(rows)

    def size(self, group: "ChannelGroup", widths: dict[int, int] | None = None) -> int:
        """Entries along ``dim`` when the groups have ``widths`` (default: their current widths)."""
        if self.layout is None:
            return (widths or {}).get(group.id, group.width) * self.factor * self.copies
        return sum(self.layout.width(p, widths) for p in self.layout.parts) * self.factor


class Layout:
    """The parts of a concatenated channel dim, in order: groups (whose widths change with
    surgery) or fixed widths (a part with no group, such as the model input). Shared by every
    member that indexes the same concatenated tensor; compared by identity."""

    def __init__(self, spaces: tuple[int, ...], widths: tuple[int, ...]) -> None:
        self._spaces, self._widths = spaces, widths
        self.parts: list["ChannelGroup | int"] = list(widths)

    def width(self, part: "ChannelGroup | int", widths: dict[int, int] | None = None) -> int:
        if isinstance(part, int):
            return part
        return (widths or {}).get(part.id, part.width)

    def __repr__(self) -> str:
        return "Layout(" + ", ".join(p if isinstance(p, int) else p.name for p in self.parts) + ")"


@dataclass
class ChannelGroup:
    """Channels that must be pruned, permuted or sliced together.

    Attributes:
        id: stable index (trace order of the first producer); unchanged by surgery.
        name: the first producing module, e.g. ``features.conv3``.
        width: current number of channels.
        members: every tensor slice indexed by these channels.
        prunable: ``False`` when the group is locked (see the module docstring).
        reason: why a group is locked.
        nodes: fx node names whose output carries these channels on dim 1, one value per
            channel (convs, norms, activations, adds, pools; not flattened views), in trace
            order. Importance criteria read the group's responses from them.
        copies: blocks of an interleaved group (see the module docstring): its nodes carry
            ``width * copies`` channels on dim 1, channel ``j`` of the group at ``b * width + j``.
    """

    id: int
    name: str
    width: int
    members: list[Member] = field(default_factory=list)
    prunable: bool = True
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    copies: int = 1

    def blocks(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """View ``t``'s ``width * copies`` entries on ``dim`` as ``(copies, width)``: a response's
        channels split into the group's blocks, so a per-channel statistic can be summed (or
        kept) over the blocks. Raises ValueError when ``dim`` has another size."""
        n = t.shape[dim]
        if n != self.width * self.copies:
            raise ValueError(f"group `{self.name}` has {self.width} channels x {self.copies} blocks, "
                             f"the tensor has {n} on dim {dim}")
        return t.unflatten(dim, (self.copies, self.width))

    @property
    def producers(self) -> list[str]:
        """Modules whose output channels are this group (convs, linears, depthwise convs)."""
        seen: list[str] = []
        for m in self.members:
            if m.role in ("out", "depthwise") and m.module not in seen:
                seen.append(m.module)
        return seen


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


#: conv classes whose forward standardises the weight over its input channels (timm's weight
#: standardisation): removing an input channel changes every kept weight, so their inputs are
#: locked; their outputs prune (per-output statistics, and the per-output ``gain`` joins the group)
WEIGHT_STANDARDISING_CONVS = frozenset({"StdConv2d", "StdConv2dSame", "ScaledStdConv2d", "ScaledStdConv2dSame"})


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
    "reshape", "mean", "sum", "amax", "softmax",
}
#: functions of other libraries that scale whole samples (or the whole batch) and keep every
#: channel where it is, matched by qualified name so the library need not be imported:
#: torchvision's stochastic depth (an fx-wrapped call in EfficientNet, ConvNeXt, Swin...)
_PASS_FUNCTION_NAMES = {"torchvision.ops.stochastic_depth.stochastic_depth"}
_JOIN_FUNCTIONS = {operator.add, operator.iadd, operator.mul, operator.imul, operator.sub, torch.add, torch.mul}
_JOIN_METHODS = {"add", "add_", "mul", "mul_", "sub", "sub_"}


@dataclass
class _Info:
    """Channel layout of one node's output: its space and features per channel along dim 1.

    A concatenation's output has ``parts``, ``(space, width)`` per input in order, and
    ``space`` -1: its channels belong to several spaces.
    """

    space: int
    factor: int = 1
    parts: tuple[tuple[int, int], ...] | None = None
    layout: Layout | None = None
    dim: int = 1  # where the channels are in the node's output
    head: tuple[int, int] | None = None  # heads: (where the head dim d is, d); None if the dim is gone
    unbound: int | None = None  # a tuple from unbind(dim): its items drop that dim
    attention: str | None = None  # heads: the attention module (owner of num_heads, head_dim, proj)

    @property
    def spaces(self) -> list[int]:
        return [sp for sp, _ in self.parts] if self.parts else [self.space]

    @property
    def heads(self) -> bool:
        return self.attention is not None

    def with_factor(self, factor: int) -> "_Info":
        return replace(self, factor=factor)

    def at(self, dim: int) -> "_Info":
        return replace(self, dim=dim)


def find_groups(gm: fx.GraphModule, root: nn.Module | None = None) -> tuple[list[ChannelGroup], list[str]]:
    """Derive coupled channel groups from a shape-annotated GraphModule.

    ``root`` is the traced model: the graph module keeps only the modules it calls, so the
    attributes of the others (an attention's ``num_heads``) are read from it.

    Returns:
        ``(groups, unsupported)``: every group that has a producer, in trace order, and the ops
        that forced a lock (for reports).
    """
    uf = _UnionFind()
    info: dict[fx.Node, _Info | None] = {}
    members: list[tuple[int, Member]] = []
    locked: dict[int, str] = {}
    unsupported: list[str] = []
    layouts: list[Layout] = []
    interleaved: list[tuple[int, int, str]] = []  # (space, blocks, grouped conv) of grouped convs
    retyped: dict[tuple[int, str], tuple[int, int]] = {}  # (space, qkv Linear) -> (blocks, head dim)
    scaled: list[tuple[fx.Node, int]] = []  # attention products whose MACs follow a head group's width
    modules = dict(gm.named_modules())
    owners = dict(root.named_modules()) if root is not None else modules

    def lock(space: int | _Info, reason: str) -> None:
        for sp in space.spaces if isinstance(space, _Info) else [space]:
            locked.setdefault(sp, reason)

    def add(src: _Info, name: str, attr: str, dim: int, role: str) -> None:
        """Members of a consumer of ``src``: one, or one per part of a concatenated tensor."""
        if src.parts is None:
            members.append((src.space, Member(name, attr, dim, src.factor, role=role)))
            return
        for sp, _ in src.parts:
            members.append((sp, Member(name, attr, dim, src.factor, role=role, layout=src.layout)))

    def composite(parts: list[tuple[int, int]], factor: int = 1) -> _Info:
        layout = Layout(tuple(sp for sp, _ in parts), tuple(w for _, w in parts))
        layouts.append(layout)
        return _Info(-1, factor, tuple(parts), layout)

    def fresh(reason: str | None = None) -> _Info:
        s = uf.new()
        if reason:
            lock(s, reason)
        return _Info(s)

    def tensor_args(node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if info.get(a) is not None]

    def opaque(node: fx.Node, what: str) -> _Info | None:
        for a in tensor_args(node):
            lock(info[a], f"used by {what}")
        unsupported.append(what)
        return fresh(f"output of {what}") if node.meta.get("shape") is not None else None

    def produce(name: str, mod: nn.Module) -> _Info:
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
            info[node] = fresh(f"attribute `{node.target}`") if shape is not None else None
            continue
        if _is_unbind(node) and isinstance(node.args[0], fx.Node) and info.get(node.args[0]) is not None \
                and info[node.args[0]].heads:
            src_info = info[node.args[0]]
            u = _unbind_dim(node, len(node.args[0].meta["shape"]))
            if u is not None and u != src_info.dim and (src_info.head is None or u != src_info.head[0]):
                info[node] = replace(src_info, unbound=u)  # q, k, v = qkv.unbind(0)
                continue
        if shape is None or len(shape) < 2:
            # Size queries carry no channels. Anything else that leaves no channel dim (a
            # reduction over channels, a tuple result) loses track of them: lock the source.
            if not _is_size_query(node):
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
                    if type(mod).__name__ in WEIGHT_STANDARDISING_CONVS:
                        lock(src_info, f"`{name}` ({type(mod).__name__}) standardises its weight over its inputs")
                    else:
                        add(src_info, name, "weight", 1, "in")
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
            elif isinstance(mod, (nn.LayerNorm, nn.GroupNorm)) and src_info is not None and _normalises_channels(
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
                info[node] = _reshape(node, src, src_info, shape) or opaque(node, f"`{name}` ({type(mod).__name__})")
            else:
                info[node] = opaque(node, f"`{name}` ({type(mod).__name__})")
            continue

        target = node.target
        is_join = (node.op == "call_function" and target in _JOIN_FUNCTIONS) or (
            node.op == "call_method" and target in _JOIN_METHODS
        )
        if is_join:
            info[node] = _join(node, info, uf, shape, composite) or opaque(node, f"`{node.name}`")
            continue
        if node.op == "call_function" and target is torch.stack:
            info[node] = _stack(node, info, uf, shape) or opaque(node, f"`{node.name}` (stack)")
            continue
        if node.op == "call_function" and target in _CAT_FUNCTIONS:
            info[node] = _concat(node, info, uf, shape, composite) or opaque(node, f"`{node.name}` (cat)")
            continue
        if node.op == "call_function" and target is operator.getitem and src_info is not None \
                and src_info.unbound is not None:
            info[node] = _drop_dim(src_info, src_info.unbound) if isinstance(node.args[1], int) else opaque(
                node, f"`{node.name}` (an item of unbind)")
            continue
        if node.op == "call_function" and target is operator.getitem and src_info is not None:
            info[node] = _slice(node, src, src_info, shape, composite, lock) or opaque(
                node, f"`{node.name}` (a slice through the channels)")
            continue
        moved = _moved_dim(node, src_info) if src_info is not None else None
        if moved is not None:
            info[node] = moved
            continue
        if _is_attention_product(node):
            out = _attention_product(node, info, uf, shape)
            if out is not None:
                scaled.append((node, out.space))
            info[node] = out or opaque(node, f"`{node.name}` ({_op_name(node)})")
            continue
        is_pass = (
            node.op == "call_function" and (target in _PASS_FUNCTIONS or _qualname(target) in _PASS_FUNCTION_NAMES)
        ) or (node.op == "call_method" and target in _PASS_METHODS)
        if is_pass and src_info is not None and _is_view(node) and not src_info.heads:
            blocks = _split_blocks(node, src, src_info, shape, modules)
            if blocks is not None:
                retyped[(src_info.space, src.target)] = (blocks, 1)
                info[src] = None  # the layer's own output is the blocks, not one channel each
                info[node] = src_info.at(2)
                continue
            split = _split_heads(node, src, src_info, shape, modules, owners)
            if isinstance(split, str):
                lock(src_info, split)
            elif split is not None:
                heads, blocks = split
                retyped[(src_info.space, src.target)] = (blocks, heads.head[1])
                members.append((src_info.space, Member(heads.attention, "num_heads", 0, role="count")))
                info[src] = None  # the Linear's own output is now the heads' blocks, not one channel each
                info[node] = heads
                continue
        if is_pass and src_info is not None and src_info.heads and src_info.head is not None and _is_view(node):
            merged = _merge_heads(node, src, src_info, shape, owners)
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
            out = _reshape(node, src, src_info, shape)
            if out is not None and not _sizes_follow(node, out, info, uf):
                out = None
            info[node] = out or opaque(node, f"`{node.name}` ({_op_name(node)})")
            continue
        info[node] = opaque(node, f"`{node.name}` ({_op_name(node)})")

    node_spaces = []
    for n, i in info.items():
        if i is not None and i.factor == 1 and i.parts is None and n.op != "placeholder" and i.unbound is None:
            node_spaces.append((n.name, i.space))
            n.meta["channel_dim"] = i.dim  # criteria read a response's channels here
    return _collect(gm, uf, members, locked, node_spaces, layouts, interleaved, retyped, scaled), unsupported


def _is_size_query(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op == "call_function" and node.target is getattr:
        return node.args[1] in ("shape", "device", "dtype", "ndim")
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, fx.Node) and _is_size_query(src)
    return False


def _qualname(fn) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', '')}"


def _op_name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _reshape(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...]) -> _Info | None:
    """Classify a shape-changing pass-through by the shapes themselves (not the op name)."""
    in_shape = src.meta.get("shape")
    if in_shape is None or _reduces_channels(node, src_info, len(in_shape)):
        return None
    if src_info.heads:  # (dropout, softmax over keys, identity q/k norms): the same shape only
        return src_info if tuple(shape) == tuple(in_shape) else None
    if src_info.dim != 1 and tuple(shape) == tuple(in_shape):
        return src_info  # elementwise, or a softmax over another dim (selective kernels' paths)
    if src_info.dim != 1 and src_info.factor == 1 and src_info.parts is None:
        kept = _reduced_dim(node, src_info.dim, len(in_shape))
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


def _broadcast_channels(operand: tuple[int, ...], out: tuple[int, ...], dim: int = 1) -> int:
    """Size of ``operand``'s dim that broadcasting aligns with ``out``'s channel dim ``dim`` (1 if none).

    Shapes align from the right, so a 0-d scale or a shorter operand may have no such dim.
    """
    i = len(operand) - len(out) + dim
    return operand[i] if 0 <= i < len(operand) else 1


def _join(node: fx.Node, info: dict, uf: _UnionFind, shape: tuple[int, ...], composite) -> _Info | None:
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
    for a in srcs:
        if a not in full and _broadcast_channels(a.meta["shape"], shape, d) != 1:
            return None
    first = info[full[0]]
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
    for a in full[1:]:
        space = uf.union(space, info[a].space)
    # broadcast operands with a channel dim of 1 (e.g. per-sample scales) carry no channels
    return replace(first, space=space, dim=d)


_CAT_FUNCTIONS = {torch.cat, torch.concat, torch.concatenate}


def _cat_dim(node: fx.Node, ndim: int) -> int | None:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("axis", 0))
    return dim % ndim if isinstance(dim, int) else None


def _concat(node: fx.Node, info: dict, uf: _UnionFind, shape: tuple[int, ...], composite) -> _Info | None:
    """``torch.cat``: along the channels, a composite of the inputs' parts; along any other dim,
    the inputs share their channels (one space, like an add)."""
    tensors = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = _cat_dim(node, len(shape))
    if not isinstance(tensors, (list, tuple)) or dim is None:
        return None
    if any(not isinstance(t, fx.Node) or info.get(t) is None or t.meta.get("shape") is None for t in tensors):
        return None
    channel_dims = {info[t].dim for t in tensors}
    if channel_dims != {1}:
        # channels elsewhere (tokens): a concatenation along another dim shares them, one along
        # them is not mapped (locked)
        d = channel_dims.pop() if len(channel_dims) == 1 else None
        return _join(node, info, uf, shape, composite) if d is not None and dim != d else None
    if dim != 1:
        if any(t.meta["shape"][1] != shape[1] for t in tensors):
            return None
        return _join(node, info, uf, shape, composite)
    if any(info[t].factor != 1 for t in tensors):
        return None  # concatenated flattened features: the layout of each part's features is lost
    parts: list[tuple[int, int]] = []
    for t in tensors:
        parts.extend(info[t].parts or [(info[t].space, t.meta["shape"][1])])
    return composite(parts)


def _slice(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...], composite, lock) -> _Info | None:
    """``x[...]`` of a tensor: indexing that keeps the channel dim whole passes the channels.

    A channel slice ``x[:, a:b]`` has constant bounds. ``x[:, :b]`` with ``b`` >= the width stays
    the identity as channels are pruned (GhostNet's ``out[:, :oup]``). Otherwise the slice must
    keep whole parts of a concatenation; the parts up to ``b`` are locked (pruning them would
    move what the bounds select) and the parts after it stay free."""
    in_shape = src.meta.get("shape")
    index = node.args[1]
    index = index if isinstance(index, tuple) else (index,)
    if in_shape is not None and src_info.dim != 1:
        return _index_other_dims(index, src_info, len(in_shape))
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
    return composite(kept) if len(kept) > 1 else _Info(kept[0][0])


def _index_other_dims(index: tuple, src_info: _Info, ndim: int) -> _Info | None:
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


def _size_source(arg) -> tuple[fx.Node, int] | None:
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


def _sizes_follow(node: fx.Node, out: _Info, info: dict, uf: _UnionFind) -> bool:
    """A ``view``/``reshape`` states the size of the channel dim: it must follow pruning. ``-1``
    does; another tensor's size (``c`` of ``n, c, h, w = x.shape``) does when the two share their
    channels, so the spaces are tied (like an add); a constant does not (False: the caller locks)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name not in ("view", "reshape") or out.parts is not None or out.factor != 1:
        return True
    sizes = list(node.args[1:])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = list(sizes[0])
    if len(sizes) <= out.dim:
        return False
    entry = sizes[out.dim]
    if entry == -1:
        return True
    source = _size_source(entry)
    if source is None:
        return False
    t, k = source
    other = info.get(t)
    if other is None or other.parts is not None or other.factor != 1 or other.dim != k % len(t.meta["shape"]):
        return False
    uf.union(out.space, other.space)
    return True


def _reduces_channels(node: fx.Node, src_info: _Info, ndim: int) -> bool:
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


def _normalises_channels(mod: nn.Module, src_info: _Info, shape: tuple[int, ...]) -> bool:
    """A LayerNorm whose normalised dims include the channels, or a GroupNorm on dim 1 channels."""
    if isinstance(mod, nn.GroupNorm):
        return src_info.dim == 1
    return src_info.dim >= len(shape) - len(mod.normalized_shape)


#: permute / transpose, as methods or functions: they move the channel dim
_PERMUTES = {"permute", "transpose", "swapaxes", "swapdims"}


def _moved_dim(node: fx.Node, src_info: _Info) -> _Info | None:
    """The channels after ``permute``/``transpose`` (None: not such an op, or not constant);
    attention heads move their head dim too."""
    perm = _permutation(node, src_info)
    if perm is None:
        return None
    head = (perm.index(src_info.head[0]), src_info.head[1]) if src_info.head is not None else None
    return replace(src_info, dim=perm.index(src_info.dim), head=head)


def _permutation(node: fx.Node, src_info: _Info) -> list[int] | None:
    """For a ``permute``/``transpose``: the source dim of each output dim."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if node.op not in ("call_method", "call_function") or name not in _PERMUTES:
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


def _reduced_dim(node: fx.Node, dim: int, ndim: int) -> int | None:
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


def _stack(node: fx.Node, info: dict, uf: _UnionFind, shape: tuple[int, ...]) -> _Info | None:
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
    return _Info(space, dim=c + 1 if d <= c else c)


def _split_blocks(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...], modules: dict) -> int | None:
    """``fc(x).view(B, k, C // k, H, W)``: a layer's output channels read as ``k`` blocks of ``C/k``
    (a selective kernel's per-path attention). Returns ``k``: channel ``j`` is entry ``j`` of every
    block of the layer's rows (:attr:`Member.copies`), and sits on dim 2. None when the view is
    not that, or states the block width as a constant (it would not follow pruning)."""
    in_shape = src.meta.get("shape")
    if (in_shape is None or src_info.dim != 1 or src_info.parts is not None or src_info.factor != 1
            or src.op != "call_module" or [u for u in src.users if not _is_size_query(u)] != [node]
            or not isinstance(modules.get(src.target), (nn.Conv2d, nn.Linear))):
        return None
    if isinstance(modules[src.target], nn.Conv2d) and modules[src.target].groups != 1:
        return None
    if (len(shape) != len(in_shape) + 1 or shape[0] != in_shape[0] or tuple(shape[3:]) != tuple(in_shape[2:])
            or shape[1] < 2 or shape[1] * shape[2] != in_shape[1]):
        return None
    sizes = _view_sizes(node)
    if len(sizes) != len(shape) or sizes[1] != shape[1]:
        return None
    width = sizes[2]  # -1, or the layer's own channel count // k: both follow pruning
    follows = width == -1 or (isinstance(width, fx.Node) and width.op == "call_function"
                              and width.target is operator.floordiv and width.args[1] == shape[1]
                              and _size_source(width.args[0]) == (src, 1))
    return shape[1] if follows else None



def _is_view(node: fx.Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return name in ("view", "reshape")


def _is_unbind(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "unbind") or (
        node.op == "call_function" and node.target is torch.unbind)


def _unbind_dim(node: fx.Node, ndim: int) -> int | None:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return dim % ndim if isinstance(dim, int) else None


def _drop_dim(src_info: _Info, u: int) -> _Info:
    """An item of ``unbind(u)``: the dims after ``u`` move left."""
    head = src_info.head
    if head is not None:
        head = (head[0] - (u < head[0]), head[1])
    return replace(src_info, dim=src_info.dim - (u < src_info.dim), head=head, unbound=None)


def _view_sizes(node: fx.Node) -> list:
    sizes = list(node.args[1:])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = list(sizes[0])
    return sizes


#: attributes of an attention module that hold ``num_heads * head_dim``
_ATTN_DIM_ATTRS = ("attn_dim", "all_head_dim")


def _split_heads(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...], modules: dict, owners: dict):
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
    sizes = _view_sizes(node)
    if len(sizes) != len(shape) or any(not isinstance(v, int) for v in sizes[lead:]):
        return f"{what}: `{node.name}` states the head sizes from other tensors"
    blocks = tail[0] if len(tail) == 3 else 1
    return _Info(src_info.space, dim=len(shape) - 2, head=(len(shape) - 1, d), attention=owner), blocks


def _merge_heads(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...], owners: dict):
    """``x.transpose(1, 2).reshape(B, N, H * d)``: heads and head dim merged back into one dim of
    ``H*d`` (a channel of ``factor`` d). Returns ``(info, count attribute or None)`` or a lock reason."""
    in_shape = src.meta["shape"]
    h, (inner, d) = src_info.dim, src_info.head
    what = f"the heads of `{src_info.attention}`"
    if inner != h + 1 or tuple(shape) != tuple(in_shape[:h]) + (in_shape[h] * d,) + tuple(in_shape[h + 2:]):
        return f"{what}: `{node.name}` reshapes them other than merging heads and head dims"
    if h != len(shape) - 1:
        return f"{what}: merged anywhere but the last dim at `{node.name}`"
    sizes = _view_sizes(node)
    entry = sizes[h] if len(sizes) == len(shape) else None
    if entry == -1:
        return replace(src_info, factor=d, head=None), None
    attn = owners.get(src_info.attention)
    attr = next((a for a in _ATTN_DIM_ATTRS if isinstance(entry, int) and getattr(attn, a, None) == entry), None)
    if attr is None:
        return f"{what}: `{node.name}` states their merged size as {entry!r}, not -1 or the module's `attn_dim`"
    return replace(src_info, factor=d, head=None), attr


_SDPA = getattr(F, "scaled_dot_product_attention", None)
_MATMULS = {operator.matmul, torch.matmul, torch.bmm}


def _is_attention_product(node: fx.Node) -> bool:
    return (node.op == "call_function" and (node.target in _MATMULS or node.target is _SDPA)) or (
        node.op == "call_method" and node.target in ("matmul", "bmm"))


def _attention_product(node: fx.Node, info: dict, uf: _UnionFind, shape: tuple[int, ...]) -> _Info | None:
    """``q @ k.T``, ``attn @ v`` or ``scaled_dot_product_attention(q, k, v)`` over heads: the
    heads are a batch dim of the product, so each head's output reads only that head (the spaces
    of the operands join). Anything else (a mask, a product over the heads) gives None: locked."""
    if node.target is _SDPA:
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
    if node.target is _SDPA:
        ok = all(i.head == (ndim - 1, d) for i in infos)
        return replace(infos[0], space=space) if ok else None
    a, b = infos
    # a @ b contracts a's last dim with b's second last: the head dim goes there, or stays in b's last
    if a.head == (ndim - 1, d) and b.head == (ndim - 2, d):
        return replace(a, space=space, head=None)
    if a.head is None and b.head == (ndim - 1, d):
        return replace(b, space=space)
    return None



def _collect(gm, uf, members, locked, node_spaces, layouts, interleaved, retyped, scaled) -> list[ChannelGroup]:
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
