"""The structure graph of a model: layers with MACs/params, coupled channel groups, cut points.

``trace(model)`` is the entry point. The graph is a read-only description: surgery
(``nestflex.graph.surgery``) edits the *model*, after which ``trace`` again gives the new graph
with the same group ids.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from nestflex.errors import GraphError
from nestflex.graph._sizes import recomputable
from nestflex.graph._tokens import channels_last, input_dependent, stream_ends
from nestflex.graph._tracer import propagate_shapes, trace_module
from nestflex.graph.groups import ChannelGroup, find_groups

__all__ = [
    "DEFAULT_INPUT_SHAPE",
    "Layer",
    "CutPoint",
    "SplitPoint",
    "StructureGraph",
    "check_input_shape",
    "checked_batches",
    "input_shape_of",
    "trace",
]

#: Per-sample input a model is traced at when neither the caller nor the model says otherwise
#: (CIFAR's 3x32x32).
DEFAULT_INPUT_SHAPE: tuple[int, int, int] = (3, 32, 32)

#: activations after which a model can be cut (and an exit placed): a block's non-linearity.
#: ReLU maps are sparse and compress best; the others (SiLU in EfficientNet, Hardswish in
#: MobileNet-v3...) are cut points too when a conv or a batch norm feeds them a spatial map, so
#: the tensor is channels-first (a GELU after a Linear on channels-last or token tensors is not,
#: until the graph models those layouts); the codec and profilers measure what each cut costs. Gates
#: (sigmoid, hard-sigmoid, tanh) are not cut points: they scale another tensor inside a block.
_RELUS = (nn.ReLU, nn.ReLU6)
_CUT_ACTS = (*_RELUS, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Hardswish, nn.Mish)
_RELU_FUNCTIONS = (F.relu, torch.relu, F.relu6)
_CUT_FUNCTIONS = (*_RELU_FUNCTIONS, F.leaky_relu, F.elu, F.gelu, F.silu, F.hardswish, F.mish)


@dataclass(frozen=True)
class Layer:
    """A compute layer (conv or linear) with its per-sample cost.

    Attributes:
        name: qualified module name.
        kind: ``conv`` or ``linear``.
        macs: multiply-accumulates per sample.
        params: parameters of the module.
        out_shape: per-sample output shape (no batch dim).
        spatial: output positions per sample, so ``macs == weight.numel() * spatial``.
    """

    name: str
    kind: str
    macs: int
    params: int
    out_shape: tuple[int, ...]
    spatial: int

    @property
    def activations(self) -> int:
        """Output elements per sample (the activation memory this layer writes)."""
        return math.prod(self.out_shape)


@dataclass(frozen=True)
class CutPoint:
    """A place to cut the model in two: after a block's activation (ReLU outputs are sparse; other
    activations count when a conv or a batch norm feeds them), after a residual add of two
    spatial maps that no activation follows (ConvNeXt's and PoolFormer's blocks end there), or on
    a transformer's residual stream after each block: tokens ``(N, T, C)`` in ViT, DeiT, Mixer and
    ResMLP, channels-last maps in Swin (``nestflex.graph._tokens``).

    Early exits attach at cut points, and split inference cuts the model at one
    (:func:`~nestflex.graph.cut.cut_model`); a bundle ships the ones it offers for split inference
    as :class:`nestflex.deploy.bundle.split_records.SplitPoint` records.

    Attributes:
        name: the activation's module name (or fx node name for functional activations and adds).
        node: fx node name.
        index: position in execution order.
        tensors: ``(node name, per-sample shape)`` of every tensor that crosses the cut, in
            execution order; skip connections are included.
        numel: elements per sample that cross the cut.
        macs_before: MACs per sample up to and including this point.
        macs_fraction: ``macs_before / total MACs``.
        layout: how the cut tensor holds its channels: ``channels_first`` (a ``(C, H, W)`` map),
            ``tokens`` (``(T, C)``, a transformer's residual stream) or ``channels_last``
            (``(H, W, C)``, Swin's); exit heads are chosen by it.
    """

    name: str
    node: str
    index: int
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    numel: int
    macs_before: int
    macs_fraction: float
    layout: str = "channels_first"


#: the name of :class:`CutPoint` before issue 39 (the bundle's split inference record is
#: :class:`nestflex.deploy.bundle.split_records.SplitPoint`, another class)
SplitPoint = CutPoint


@dataclass
class StructureGraph:
    """What nestflex knows about a model's structure.

    Attributes:
        gm: the fx GraphModule (shares the model's submodules).
        input_shape: example input shape used for tracing (batch of 1).
        layers: compute layers in execution order.
        groups: coupled channel groups, ids stable under surgery.
        cut_points: where the model can be cut (exits attach, split inference cuts), in execution
            order; :attr:`split_points` is the same list.
        opaque: modules fx could not trace, with the reason.
        unsupported: ops that locked channel groups.
        op_macs: MACs per sample of every other node that computes any (fx node name: MACs):
            attention matrix products, functional ``F.linear``/``F.conv2d``,
            ``nn.MultiheadAttention``, 1-d convs, opaque modules; counted by
            ``torch.utils.flop_counter`` at trace time. They do not change with group widths (each
            such op locks the channels it reads, ``nestflex.graph.groups``), except the products
            over attention heads in :attr:`op_groups`.
        op_groups: nodes of :attr:`op_macs` whose MACs are proportional to a group's width
            (fx node name: ``(group id, width at trace)``): ``q @ k.T``, ``attn @ v`` and fused
            attention over a group of heads.
    """

    gm: fx.GraphModule
    input_shape: tuple[int, ...]
    layers: list[Layer]
    groups: list[ChannelGroup]
    cut_points: list[CutPoint]
    opaque: dict[str, str] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    op_macs: dict[str, int] = field(default_factory=dict)
    op_groups: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def prunable_groups(self) -> list[ChannelGroup]:
        return [g for g in self.groups if g.prunable]

    def group(self, key: int | str) -> ChannelGroup:
        """A group by id or by name (its first producer module).

        Raises:
            GraphError: no such group (the message lists the names).
        """
        for g in self.groups:
            if g.id == key or g.name == key:
                return g
        raise GraphError(f"no channel group {key!r}; groups: {', '.join(g.name for g in self.groups)}")

    @property
    def split_points(self) -> list[CutPoint]:
        """:attr:`cut_points`, by its name before issue 39."""
        return self.cut_points

    def cut_point(self, name: str) -> CutPoint:
        """A cut point by module or node name.

        Raises:
            GraphError: no such cut point (the message lists them).
        """
        for s in self.cut_points:
            if name in (s.name, s.node):
                return s
        raise GraphError(f"no split point {name!r}; split points: {', '.join(s.name for s in self.cut_points)}")

    def split_point(self, name: str) -> CutPoint:
        """:meth:`cut_point`, by its name before issue 39."""
        return self.cut_point(name)

    def param_shapes(self, widths: Mapping[int, int] | None = None) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter if each group ``g`` had ``widths[g]`` channels."""
        widths = dict(widths or {})
        for gid, w in widths.items():
            self.group(gid)  # raises on an unknown id
            if not isinstance(w, int) or w < 1:
                raise GraphError(f"`widths[{gid}]` must be a positive int, got {w!r}")
        shapes = {n: list(p.shape) for n, p in self.gm.named_parameters()}
        for g in self.groups:
            for m in g.members:
                # a concatenated dim changes when any of its parts does
                if g.id not in widths and (m.layout is None or not any(
                        not isinstance(p, int) and p.id in widths for p in m.layout.parts)):
                    continue
                key = f"{m.module}.{m.attr}" if m.module else m.attr
                if key in shapes:
                    shapes[key][m.dim] = m.size(g, widths)
        return {k: tuple(v) for k, v in shapes.items()}

    def macs(self, widths: Mapping[int, int] | None = None) -> int:
        """MACs per sample, now or with the given group widths: the conv and linear layers' (which
        follow the widths) plus :attr:`op_macs` (which do not, but for attention products over
        heads: :attr:`op_groups`)."""
        if not widths:
            return sum(layer.macs for layer in self.layers) + sum(self.op_macs.values())
        shapes = self.param_shapes(widths)
        ops = 0
        for name, macs in self.op_macs.items():
            gid, width = self.op_groups.get(name, (None, 0))
            ops += macs // width * widths[gid] if gid in widths else macs
        return sum(math.prod(shapes[f"{layer.name}.weight"]) * layer.spatial for layer in self.layers) + ops

    def params(self, widths: Mapping[int, int] | None = None) -> int:
        """Number of parameters, now or with the given group widths."""
        return sum(math.prod(s) for s in self.param_shapes(widths).values())

    def response_nodes(self, key: int | str | ChannelGroup) -> list[str]:
        """fx nodes whose outputs are the group's *responses*: what the next layers consume.

        These are the activations (ReLU...) in the group's channel space: after BatchNorm's
        per-channel rescaling and after the non-linearity, so a channel's values are on the scale
        the rest of the network sees. A residual group has one per block. Groups without an
        activation (a linear feeding the output, say) fall back to their last node.
        """
        g = key if isinstance(key, ChannelGroup) else self.group(key)
        by_name = {n.name: n for n in self.gm.graph.nodes}
        acts = [n for n in g.nodes if _is_cut_activation(self.gm, by_name[n])]
        return acts or g.nodes[-1:]

    def widths(self) -> dict[int, int]:
        """Current width of every group, by id."""
        return {g.id: g.width for g in self.groups}


def input_shape_of(model: nn.Module, input_shape: Sequence[int] | None = None) -> tuple[int, ...]:
    """The per-sample shape to trace ``model`` at: ``input_shape`` if given, else the model's own.

    Args:
        model: the model to trace. It states its input with an ``input_shape`` attribute:
            nestflex's VGG/ResNet (``(in_chans, 32, 32)``),
            :class:`~nestflex.training.ImageClassifier` and its network (the shape of the data it
            was built for), :class:`~nestflex.exits.MultiExitNetwork`. Copies keep the
            attribute, so a pruned, nested or extracted copy is traced at the same shape. Models
            without one get :data:`DEFAULT_INPUT_SHAPE`.
        input_shape: per-sample shape (no batch dimension), e.g. ``(C, H, W)``; when given it
            wins over the model's attribute. ``None`` (default) reads the model's.

    Returns:
        the shape as a tuple of positive ints.

    Raises:
        GraphError: a shape that is not a sequence of positive integers.

    Examples:
        >>> from nestflex.models import create_model
        >>> input_shape_of(create_model("vgg11", width=0.125, in_chans=1))
        (1, 32, 32)
        >>> input_shape_of(torch.nn.Linear(4, 2)), input_shape_of(torch.nn.Linear(4, 2), (4,))
        ((3, 32, 32), (4,))
    """
    shape = input_shape if input_shape is not None else getattr(model, "input_shape", None)
    if shape is None:
        return DEFAULT_INPUT_SHAPE
    try:
        out = tuple(int(s) for s in shape)
        valid = len(out) >= 1 and all(s >= 1 and s == v for s, v in zip(out, shape))
    except (TypeError, ValueError):
        valid = False
    if not valid:
        source = "`input_shape`" if input_shape is not None else f"`{type(model).__name__}.input_shape`"
        raise GraphError(f"{source} must be a sequence of positive integers (C, H, W), got {shape!r}")
    return out


def check_input_shape(expected: Sequence[int], x: torch.Tensor | Sequence[Any], owner: str) -> None:
    """Raise unless the samples of batch ``x`` have the per-sample shape a model was traced at.

    Tracing at one shape and running on another gives wrong MACs, cut points and exit
    positions, or fails deep inside a later step; this check fails at once, saying both shapes.

    Args:
        expected: the traced per-sample shape.
        x: a batch ``(N, *shape)``, or a ``(inputs, targets, ...)`` batch from a dataloader.
        owner: who traced (named in the message), e.g. ``"FilterPruning"``.

    Raises:
        GraphError: the shapes differ.

    Examples:
        >>> check_input_shape((1, 32, 32), torch.zeros(2, 1, 32, 32), "demo")
        >>> check_input_shape((3, 32, 32), torch.zeros(2, 1, 28, 28), "demo")
        Traceback (most recent call last):
        ...
        nestflex.errors.GraphError: demo traces the model at per-sample input_shape (3, 32, 32), but the data's samples are (1, 28, 28). HINT: pass `input_shape=(1, 28, 28)` (a DataModule's `input_shape`), or feed data of the traced shape
    """
    if not isinstance(x, torch.Tensor):
        x = x[0]
    actual, expected = tuple(x.shape[1:]), tuple(expected)
    if actual != expected:
        raise GraphError(
            f"{owner} traces the model at per-sample input_shape {expected}, but the data's samples are {actual}. "
            f"HINT: pass `input_shape={actual}` (a DataModule's `input_shape`), or feed data of the traced shape"
        )


def checked_batches(batches: Iterable[Any], input_shape: Sequence[int], owner: str) -> Iterator[Any]:
    """Yield ``batches`` unchanged, after :func:`check_input_shape` on the first one.

    For code that traced a model at ``input_shape`` and then evaluates it on a dataloader: the
    check costs nothing, and a dataloader of another shape fails before any number is computed.

    Args:
        batches: the batches to pass through, e.g. a dataloader: each a tensor ``(N, *shape)``
            or an ``(inputs, targets, ...)`` tuple. Read lazily, once.
        input_shape: the per-sample shape the model was traced at (no batch dimension).
        owner: who traced (named in the error message), e.g. ``"FilterPruning"``.

    Yields:
        each batch of ``batches``, unchanged.

    Raises:
        GraphError: the first batch's samples do not have shape ``input_shape`` (raised when
            that batch is drawn, not at the call).

    Examples:
        >>> batches = [(torch.zeros(2, 1, 32, 32), torch.zeros(2))]
        >>> len(list(checked_batches(batches, (1, 32, 32), "demo")))
        1
    """
    for i, batch in enumerate(batches):
        if i == 0:
            check_input_shape(input_shape, batch, owner)
        yield batch


def trace(model: nn.Module, input_shape: Sequence[int] | None = None, strict: bool = False,
          approximate: bool = False) -> StructureGraph:
    """Trace ``model`` and derive layers, channel groups and cut points.

    Args:
        model: any ``nn.Module`` taking one image tensor.
        input_shape: per-sample input shape (no batch dimension); default: the model's own
            (:func:`input_shape_of`: its ``input_shape`` attribute, else ``(3, 32, 32)``).
        strict: raise on submodules fx cannot trace instead of keeping them opaque.
        approximate: ``True`` also offers the groups that prune only approximately (Torch-Pruning's
            behaviour): the residual stream of a ViT or ConvNeXt through its LayerNorms, ConvNeXt-V2's
            GRN channels, the inputs of NF-ResNet's weight-standardised convs. Pruning them changes
            those statistics, so the pruned model no longer equals the masked one; each such group
            says what changes in :attr:`~nestflex.graph.groups.ChannelGroup.approximation`.
            ``False`` (default) locks them, so pruned = masked on every prunable group.

    Returns:
        the model's :class:`StructureGraph`. The model is not modified and its train/eval flags
        and BatchNorm statistics are left as they were.

    Raises:
        GraphError: the model cannot be traced or run on ``input_shape``.

    Examples:
        >>> from nestflex.models import create_model
        >>> g = trace(create_model("vgg16"))
        >>> round(g.macs() / 1e8, 2)
        3.13
    """
    if not isinstance(approximate, bool):
        raise GraphError(f"`approximate` must be True or False, got {approximate!r}. HINT: True also prunes "
                         "LayerNorm-normalised streams, GRN channels and weight-standardised inputs, approximately")
    input_shape = input_shape_of(model, input_shape)
    gm, opaque = trace_module(model, strict=strict)
    param = next(model.parameters(), None)
    example = torch.zeros(
        1, *input_shape, device=param.device if param is not None else None, dtype=param.dtype if param is not None else None
    )
    try:
        propagate_shapes(gm, example)
    except Exception as e:
        raise GraphError(
            f"`{type(model).__name__}` failed on an input of shape {tuple(example.shape)}{_where(gm, e)}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
            f"HINT: pass the model's per-sample `input_shape`"
        ) from e
    groups, unsupported = find_groups(gm, model, approximate=approximate)
    layers = _layers(gm)
    op_macs = _op_macs(gm, layers)
    return StructureGraph(
        gm=gm,
        input_shape=tuple(input_shape),
        layers=layers,
        groups=groups,
        cut_points=_cut_points(gm, layers, op_macs),
        opaque=opaque,
        unsupported=unsupported,
        op_macs=op_macs,
        op_groups={n.name: n.meta["macs_group"] for n in gm.graph.nodes if n.name in op_macs and "macs_group" in n.meta},
    )


def _where(gm: fx.GraphModule, e: Exception) -> str:
    """`` at `features.3` (Conv2d)``: the op and layer a failed shape propagation stopped at."""
    node = getattr(e, "nestflex_node", None)
    if node is None:
        return ""
    if node.op == "call_module":
        return f" at `{node.target}` ({type(gm.get_submodule(node.target)).__name__})"
    op = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    stack = node.meta.get("nn_module_stack") or {}
    inside = f" in `{next(reversed(stack.values()))[0]}`" if stack else ""
    return f" at op `{op}` (node `{node.name}`{inside})"


def _layers(gm: fx.GraphModule) -> list[Layer]:
    layers = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        mod = gm.get_submodule(node.target)
        if not isinstance(mod, (nn.Conv2d, nn.Linear)):
            continue
        full = node.meta["shape"]
        out = full[1:]
        # conv: each output position costs one weight pass; linear: one per leading position. The
        # trace runs one sample, so dim 0 counts too: a window attention folds its windows into it
        spatial = full[0] * (math.prod(out[1:]) if isinstance(mod, nn.Conv2d) else math.prod(out[:-1]))
        layers.append(
            Layer(
                name=node.target,
                kind="conv" if isinstance(mod, nn.Conv2d) else "linear",
                macs=mod.weight.numel() * spatial,
                params=sum(p.numel() for p in mod.parameters()),
                out_shape=tuple(out),
                spatial=spatial,
            )
        )
    return layers


def _op_macs(gm: fx.GraphModule, layers: list[Layer]) -> dict[str, int]:
    """MACs the trace counted at nodes other than the conv/linear layers (whose MACs follow widths)."""
    names = {layer.name for layer in layers}
    return {n.name: int(n.meta["macs"]) for n in gm.graph.nodes
            if n.meta.get("macs") and not (n.op == "call_module" and n.target in names)}


def _is_cut_activation(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if isinstance(mod, _RELUS):
            return True
        if isinstance(mod, _CUT_ACTS):
            return _fed_channels_first(gm, node)
        # timm's BatchNormAct2d: a BatchNorm whose output goes through its own activation
        return isinstance(mod, _BatchNorm) and isinstance(getattr(mod, "act", None), _CUT_ACTS)
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS or (node.target in _CUT_FUNCTIONS and _fed_channels_first(gm, node))
    return node.op == "call_method" and node.target in ("relu", "relu_")


def _fed_channels_first(gm: fx.GraphModule, node: fx.Node) -> bool:
    """The activation's input comes straight from a conv or a batch norm (so dim 1 is channels)
    and is a spatial map (not a squeeze-excitation's pooled 1x1 vector inside a block)."""
    src, shape = (node.args[0] if node.args else None), node.meta.get("shape")
    if not isinstance(src, fx.Node) or src.op != "call_module" or shape is None or len(shape) != 4:
        return False
    return shape[2] * shape[3] > 1 and isinstance(gm.get_submodule(src.target), (nn.Conv2d, _BatchNorm))


_ADDS = (operator.add, operator.iadd, torch.add)


def _is_block_end(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A residual add of two spatial maps of one shape (channels-first), not followed by a cut
    activation (then that activation is the block's end)."""
    is_add = (node.op == "call_function" and node.target in _ADDS) or (
        node.op == "call_method" and node.target in ("add", "add_"))
    shape = node.meta.get("shape")
    if not is_add or shape is None or len(shape) != 4 or shape[2] * shape[3] <= 1:
        return False
    operands = [a for a in node.args[:2] if isinstance(a, fx.Node) and a.meta.get("shape") == shape]
    if len(operands) != 2 or any(a.meta.get("channel_dim", 1) != 1 for a in operands):
        return False
    return not (len(node.users) == 1 and _is_cut_activation(gm, next(iter(node.users))))


def _stream_name(node: fx.Node) -> str:
    """The block a residual stream end closes (its innermost module), else the node's name."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack)) if stack else node.name


def _defaulted_argument(node: fx.Node) -> bool:
    """A forward argument the trace left at its non-tensor default (``None``, a flag)."""
    return node.op == "placeholder" and bool(node.args) and node.meta.get("shape") is None


def _cut_points(gm: fx.GraphModule, layers: list[Layer], op_macs: dict[str, int]) -> list[CutPoint]:
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    layer_macs = {layer.name: layer.macs for layer in layers}
    total = max(1, sum(layer_macs.values()) + sum(op_macs.values()))
    points, running = [], 0
    streams = stream_ends(gm)  # transformers: the residual token stream after each block
    from_input = input_dependent(gm)
    for i, node in enumerate(nodes):
        if node.op == "call_module":
            running += layer_macs.get(node.target, 0)
        running += op_macs.get(node.name, 0)
        if node not in from_input:
            continue  # computed from parameters alone (Swin V2's position bias MLP): not the data's path
        # a channels-last add is a stream's (or nothing): never a channels-first block end
        block_end = _is_block_end(gm, node) and not channels_last(gm, node)
        if not (_is_cut_activation(gm, node) or block_end or node in streams) or node.meta.get("shape") is None:
            continue
        # an extra forward argument left at its default (timm's `attn_mask=None`) does not cross:
        # the tail takes it with the same default (graph.cut.cut_model)
        crossing = [n for n in nodes[: i + 1] if n.op != "get_attr" and any(pos[u] > i for u in n.users)
                    and not _defaulted_argument(n)]
        if node not in crossing:
            crossing.append(node)  # the split tensor itself, even when the model ends right after
        # sizes read from shapes (`B, C, H, W = x.shape` before the cut) are rebuilt after it
        # from the split tensor's batch (graph._sizes), not sent
        batch_first = node.meta["shape"][0] == 1
        crossing = [n for n in crossing
                    if n is node or n.meta.get("shape") is not None or not (batch_first and recomputable(n))]
        if any(n.meta.get("shape") is None for n in crossing):
            continue  # a non-tensor value would have to cross: not a clean cut
        tensors = tuple((n.name, tuple(n.meta["shape"][1:])) for n in crossing)
        points.append(
            CutPoint(
                # a transformer block's stream is named after the block (`blocks.3`), not its add
                name=_stream_name(node) if node in streams else node.target if node.op == "call_module" else node.name,
                node=node.name,
                index=i,
                tensors=tensors,
                numel=sum(math.prod(s) for _, s in tensors),
                macs_before=running,
                macs_fraction=running / total,
                layout=("tokens" if len(node.meta["shape"]) == 3 else "channels_last") if node in streams
                else "channels_first",
            )
        )
    return points
