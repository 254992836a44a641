"""Coupled channel groups: which tensor dimensions must shrink, grow or move together.

Every node's output channel dimension (dim 1) belongs to a *channel space*. A conv or linear
creates a new space; BatchNorm, activations, pools, dropout and identity keep it; an elementwise
add/mul of two tensors ties their spaces together (residual connections); a depthwise conv keeps
its input's space; a flatten of ``(C, H, W)`` maps channel ``c`` to the ``H*W`` features
``c*H*W ... c*H*W + H*W - 1`` of the next linear. Spaces tied together form one
:class:`ChannelGroup` whose members are the parameter/buffer slices to edit.

A space is *locked* (not prunable) when it touches something the analysis cannot see through:
the model input or output, an opaque module, concatenation, a grouped (non-depthwise) conv, or
any op not listed below. Locking is always the safe answer: a locked group is simply not pruned.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["Member", "ChannelGroup", "find_groups"]


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
            statistics/affine) or ``depthwise`` (a depthwise conv, which is both).
    """

    module: str
    attr: str
    dim: int
    factor: int = 1
    role: str = "out"


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
    """

    id: int
    name: str
    width: int
    members: list[Member] = field(default_factory=list)
    prunable: bool = True
    reason: str = ""
    nodes: list[str] = field(default_factory=list)

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
    torch.relu, torch.sigmoid, torch.tanh, torch.flatten, torch.reshape,
}
_PASS_METHODS = {
    "relu", "relu_", "sigmoid", "tanh", "contiguous", "clone", "float", "to", "flatten", "view",
    "reshape", "mean", "sum", "amax",
}
_JOIN_FUNCTIONS = {operator.add, operator.iadd, operator.mul, operator.imul, operator.sub, torch.add, torch.mul}
_JOIN_METHODS = {"add", "add_", "mul", "mul_", "sub", "sub_"}


@dataclass
class _Info:
    """Channel layout of one node's output: its space and features per channel along dim 1."""

    space: int
    factor: int = 1


def find_groups(gm: fx.GraphModule) -> tuple[list[ChannelGroup], list[str]]:
    """Derive coupled channel groups from a shape-annotated GraphModule.

    Returns:
        ``(groups, unsupported)``: every group that has a producer, in trace order, and the ops
        that forced a lock (for reports).
    """
    uf = _UnionFind()
    info: dict[fx.Node, _Info | None] = {}
    members: list[tuple[int, Member]] = []
    locked: dict[int, str] = {}
    unsupported: list[str] = []
    modules = dict(gm.named_modules())

    def lock(space: int, reason: str) -> None:
        locked.setdefault(space, reason)

    def fresh(reason: str | None = None) -> _Info:
        s = uf.new()
        if reason:
            lock(s, reason)
        return _Info(s)

    def tensor_args(node: fx.Node) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if info.get(a) is not None]

    def opaque(node: fx.Node, what: str) -> _Info | None:
        for a in tensor_args(node):
            lock(info[a].space, f"used by {what}")
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
                lock(info[a].space, "model output")
            continue
        if node.op == "get_attr":
            info[node] = fresh(f"attribute `{node.target}`") if shape is not None else None
            continue
        if shape is None or len(shape) < 2:
            # Size queries carry no channels. Anything else that leaves no channel dim (a
            # reduction over channels, a tuple result) loses track of them: lock the source.
            if not _is_size_query(node):
                for a in tensor_args(node):
                    lock(info[a].space, f"reduced by `{node.name}`")
            info[node] = None
            continue
        src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        src_info = info.get(src) if src is not None else None

        if node.op == "call_module":
            mod = modules[node.target]
            name = node.target
            if isinstance(mod, nn.Conv2d) and src_info is not None and src_info.factor == 1:
                if mod.groups == 1:
                    if type(mod).__name__ in WEIGHT_STANDARDISING_CONVS:
                        lock(src_info.space, f"`{name}` ({type(mod).__name__}) standardises its weight over its inputs")
                    else:
                        members.append((src_info.space, Member(name, "weight", 1, role="in")))
                    info[node] = produce(name, mod)
                elif mod.groups == mod.in_channels == mod.out_channels:
                    members.append((src_info.space, Member(name, "weight", 0, role="depthwise")))
                    if mod.bias is not None:
                        members.append((src_info.space, Member(name, "bias", 0, role="depthwise")))
                    info[node] = _Info(src_info.space)
                else:
                    lock(src_info.space, f"grouped conv `{name}`")
                    info[node] = fresh(f"grouped conv `{name}`")
            elif isinstance(mod, nn.Linear) and src_info is not None and len(shape) == 2:
                members.append((src_info.space, Member(name, "weight", 1, src_info.factor, role="in")))
                info[node] = produce(name, mod)
            elif isinstance(mod, _BatchNorm) and src_info is not None and (src_info.factor == 1 or len(shape) == 2):
                for attr in ("weight", "bias", "running_mean", "running_var"):
                    if getattr(mod, attr, None) is not None:
                        members.append((src_info.space, Member(name, attr, 0, src_info.factor, role="norm")))
                info[node] = _Info(src_info.space, src_info.factor)
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
            info[node] = _join(node, info, uf, shape) or opaque(node, f"`{node.name}`")
            continue
        is_pass = (node.op == "call_function" and target in _PASS_FUNCTIONS) or (
            node.op == "call_method" and target in _PASS_METHODS
        )
        if is_pass and src_info is not None:
            info[node] = _reshape(node, src, src_info, shape) or opaque(node, f"`{node.name}` ({_op_name(node)})")
            continue
        info[node] = opaque(node, f"`{node.name}` ({_op_name(node)})")

    node_spaces = [(n.name, i.space) for n, i in info.items() if i is not None and i.factor == 1 and n.op != "placeholder"]
    return _collect(gm, uf, members, locked, node_spaces), unsupported


def _is_size_query(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op == "call_function" and node.target is getattr:
        return node.args[1] in ("shape", "device", "dtype", "ndim")
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, fx.Node) and _is_size_query(src)
    return False


def _op_name(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _reshape(node: fx.Node, src: fx.Node, src_info: _Info, shape: tuple[int, ...]) -> _Info | None:
    """Classify a shape-changing pass-through by the shapes themselves (not the op name)."""
    in_shape = src.meta.get("shape")
    if in_shape is None:
        return None
    if len(shape) >= 2 and shape[:2] == in_shape[:2] and (len(shape) == len(in_shape) or src_info.factor == 1):
        # channel dim kept: activations, pools, mean over H,W with keepdim, ...
        if len(shape) == 2 and len(in_shape) > 2:
            return _Info(src_info.space, 1)  # global pooling without keepdim: (N, C)
        return _Info(src_info.space, src_info.factor)
    if len(shape) == 2 and len(in_shape) > 2 and shape[0] == in_shape[0]:
        spatial = math.prod(in_shape[2:])
        if shape[1] == in_shape[1] * spatial:  # flatten(1) of (N, C, ...): channel-major
            return _Info(src_info.space, src_info.factor * spatial)
    return None


def _broadcast_channels(operand: tuple[int, ...], out: tuple[int, ...]) -> int:
    """Size of ``operand``'s dim that broadcasting aligns with ``out``'s channel dim (1 if none).

    Shapes align from the right, so a 0-d scale or a shorter operand may have no such dim.
    """
    i = len(operand) - len(out) + 1
    return operand[i] if 0 <= i < len(operand) else 1


def _join(node: fx.Node, info: dict, uf: _UnionFind, shape: tuple[int, ...]) -> _Info | None:
    """Elementwise op: tensors of equal channel count share one space; broadcast ones pass."""
    srcs = [a for a in node.all_input_nodes if info.get(a) is not None]
    if not srcs:
        return None
    full = [a for a in srcs if len(a.meta["shape"]) == len(shape) and a.meta["shape"][1] == shape[1]]
    if not full or any(info[a].factor != info[full[0]].factor for a in full):
        return None
    for a in srcs:
        if a not in full and _broadcast_channels(a.meta["shape"], shape) != 1:
            return None
    space = info[full[0]].space
    for a in full[1:]:
        space = uf.union(space, info[a].space)
    # broadcast operands with a channel dim of 1 (e.g. per-sample scales) carry no channels
    return _Info(space, info[full[0]].factor)


def _collect(gm, uf, members, locked, node_spaces) -> list[ChannelGroup]:
    by_root: dict[int, list[Member]] = {}
    order: list[int] = []
    for space, m in members:
        root = uf.find(space)
        if root not in by_root:
            by_root[root] = []
            order.append(root)
        by_root[root].append(m)
    locked_roots: dict[int, str] = {}
    for space, reason in locked.items():
        locked_roots.setdefault(uf.find(space), reason)
    nodes_by_root: dict[int, list[str]] = {}
    for name, space in node_spaces:
        nodes_by_root.setdefault(uf.find(space), []).append(name)
    groups: list[ChannelGroup] = []
    for root in order:
        ms = by_root[root]
        producers = [m for m in ms if m.role in ("out", "depthwise")]
        if not any(m.role == "out" for m in ms):
            continue  # e.g. the model input: consumed, never produced
        first = producers[0]
        t = getattr(gm.get_submodule(first.module), first.attr)
        width = t.shape[first.dim] // first.factor
        reason = locked_roots.get(root, "")
        groups.append(
            ChannelGroup(
                id=len(groups), name=first.module, width=width, members=ms, prunable=not reason, reason=reason,
                nodes=nodes_by_root.get(root, []),
            )
        )
    return groups
