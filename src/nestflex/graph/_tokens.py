"""Cut points on a transformer's residual stream: the tokens between two blocks (issue 40).

A ViT, DeiT, Mixer or ResMLP block ends in a residual add of two token tensors ``(N, T, C)``; a
Swin block ends in one on channels-last maps ``(N, H, W, C)`` (or on ``(N, H*W, C)`` tokens that
a reshape turns back into a map). That stream, after a block, is the transformer's natural cut:
everything later reads it and nothing else (the class token travels inside it), so the crossing
tensors are what the cut-point search finds anyway (sizes a block read off a shape before the cut
are rebuilt after it: ``graph._sizes``). Inside a block the stream is not offered: the add after
the attention sits between the block's two halves, one transformer layer is the unit an exit or a
split is placed at.

Which 4-D adds are channels-last is read from the LayerNorms around them (:func:`channels_last`),
not from the channel groups alone: a stream that LayerNorms lock reads there as dim 1.

"After a block" is read from the trace's ``nn_module_stack``: the add (or the reshapes it feeds
and nothing else) is the last node of its innermost module. An add in the model's own forward
(no enclosing module) counts wherever it is, as channels-first residual adds do.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

__all__ = ["channels_last", "input_dependent", "stream_ends"]

_ADDS = (operator.add, operator.iadd, torch.add)
#: ops that only re-lay the same elements: a block's reshape of its stream back to a map
_RESHAPES = frozenset({"reshape", "view", "contiguous", "flatten"})
_RESHAPE_FUNCTIONS = (torch.reshape, torch.flatten)


def _is_add(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _ADDS) or (
        node.op == "call_method" and node.target in ("add", "add_"))


def _is_reshape(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target in _RESHAPES) or (
        node.op == "call_function" and node.target in _RESHAPE_FUNCTIONS)


def _keeps_stream(src: fx.Node, node: fx.Node) -> bool:
    """``node`` re-lays ``src``'s stream and keeps it a stream: Swin's ``(N, H*W, C)`` back to
    ``(N, H, W, C)``, channels last, one sample per row (not windows or halves folded into the batch)."""
    a, b = src.meta.get("shape"), node.meta.get("shape")
    return (_is_reshape(node) and a is not None and b is not None and len(b) in (3, 4) and b[0] == a[0] == 1
            and b[-1] == a[-1])


def _scope(node: fx.Node) -> str | None:
    """The innermost module the node was traced in (``blocks.3``), ``None`` in the root forward."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack)) if stack else None


def channels_last(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A 4-D value is channels-last ``(N, H, W, C)``: a LayerNorm over its last dim reads it or,
    for an add, one of its operands (a pre-norm block's norms read the stream, Swin's; the last
    block of a stage hands its stream to a patch merging), or the channel groups put its channels
    there.

    The groups' ``channel_dim`` alone does not tell: a stream the LayerNorms lock reads as dim 1.
    timm's ``LayerNorm2d`` (a LayerNorm over dim 1 of a channels-first map) does not count.
    """
    shape = node.meta.get("shape")
    if shape is None or len(shape) != 4:
        return False
    if node.meta.get("channel_dim") == 3:
        return True
    operands = node.args[:2] if _is_add(node) else ()
    values = [node, *(a for a in operands if isinstance(a, fx.Node) and a.meta.get("shape") == shape)]
    if any(_last_dim_norm(gm, u, shape) for v in values for u in v.users):
        return True
    # a post-norm block (Swin V2's) adds a LayerNorm's output: look back through the ops that keep
    # the shape (stochastic depth, dropout, layer scale)
    for v in values[1:]:
        for _ in range(4):
            if _last_dim_norm(gm, v, shape):
                return True
            if not v.args or not isinstance(v.args[0], fx.Node) or v.args[0].meta.get("shape") != shape:
                break
            v = v.args[0]
    return False


def _last_dim_norm(gm: fx.GraphModule, node: fx.Node, shape: tuple[int, ...]) -> bool:
    """``node`` is a LayerNorm over the last dim of a ``shape`` value (timm's LayerNorm2d, over dim 1
    of a channels-first map, is not)."""
    if node.op != "call_module":
        return False
    mod = gm.get_submodule(node.target)
    return (isinstance(mod, nn.LayerNorm) and tuple(mod.normalized_shape) == (shape[-1],) and shape[-1] != shape[1]
            and not type(mod).__name__.endswith("2d"))


def _token_add(gm: fx.GraphModule, node: fx.Node, from_input: set[fx.Node]) -> bool:
    """A residual add of two activations of one token or channels-last shape, more than one token.

    Both operands must depend on the input: adding a learned position embedding to the patch
    tokens is not a residual (and at the trace's batch of 1 it has the tokens' shape).
    """
    shape = node.meta.get("shape")
    if not _is_add(node) or shape is None or len(shape) not in (3, 4):
        return False
    if len(shape) == 4 and not channels_last(gm, node):
        return False  # channels-first maps: structure._is_block_end decides those
    tokens = shape[1] if len(shape) == 3 else shape[1] * shape[2]
    operands = [a for a in node.args[:2] if isinstance(a, fx.Node) and a.meta.get("shape") == shape]
    return tokens > 1 and len(operands) == 2 and all(a in from_input for a in operands)


def input_dependent(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes the model's input reaches (not those computed from parameters alone, such as
    Swin V2's position bias table)."""
    out: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder" or any(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def stream_ends(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes after which a token-layout block hands its residual stream to the next.

    Args:
        gm: a traced graph whose nodes carry ``meta["shape"]`` (:func:`~nestflex.graph.trace`).

    Returns:
        the block ends: for each residual token add, the add itself, or the last of the reshapes
        that are its only consumers; kept when that node is the last one of its module.
    """
    nodes = list(gm.graph.nodes)
    from_input = input_dependent(gm)
    last_of_scope: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for scope in n.meta.get("nn_module_stack") or {}:
            last_of_scope[scope] = i
    pos = {n: i for i, n in enumerate(nodes)}
    ends = set()
    for n in nodes:
        if not _token_add(gm, n, from_input):
            continue
        end = n
        while len(end.users) == 1 and _keeps_stream(end, next(iter(end.users))):
            end = next(iter(end.users))
        scope = _scope(end)
        if scope is None or last_of_scope.get(scope) == pos[end]:
            ends.add(end)
    return ends
