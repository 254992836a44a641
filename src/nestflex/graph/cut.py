"""Cut a traced model in two at a cut point: ``tail(*head(x)) == model(x)``.

The head returns every tensor that crosses the cut (the cut activation and any skip tensor
still needed later), in :attr:`CutPoint.tensors` order; the tail takes them as positional
arguments. Both are ``fx.GraphModule`` objects sharing the model's weights. Split inference runs
the two halves on two machines (:mod:`nestflex.deploy.split`, from the exported bundle); this is
the training side's cut, on the torch model.

This module was ``nestflex.graph.split`` and :func:`cut_model` was ``split_model`` before issue 39
(``split`` also names split inference and its scheduler); ``nestflex.graph.split_model`` remains.
"""

from __future__ import annotations

from torch import fx

from nestflex.graph._sizes import rebuild, recomputable
from nestflex.graph.structure import CutPoint, StructureGraph

__all__ = ["cut_model", "split_model"]


def cut_model(graph: StructureGraph, point: CutPoint | str) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Return ``(head, tail)`` GraphModules for a cut point (object or name).

    Args:
        graph: the traced model (from :func:`~nestflex.graph.trace`); both halves share the
            weights of its ``gm``.
        point: where to cut: a :class:`~nestflex.graph.structure.CutPoint` of ``graph`` or its
            module or node name (looked up with :meth:`StructureGraph.cut_point`).

    Returns:
        ``(head, tail)``: ``head(x)`` returns the tensors that cross the cut, in
        ``point.tensors`` order, and ``tail(*head(x)) == model(x)``.

    Raises:
        GraphError: ``point`` is a name that is not one of ``graph``'s cut points.

    Examples:
        >>> import torch
        >>> from nestflex.models import create_model
        >>> from nestflex.graph import trace
        >>> model = create_model("resnet20").eval()
        >>> g = trace(model)
        >>> head, tail = cut_model(g, "layer2.0.relu1")
        >>> [name for name, _ in g.cut_point("layer2.0.relu1").tensors]
        ['layer1_2_relu2', 'layer2_0_relu1']
        >>> x = torch.randn(2, 3, 32, 32)
        >>> torch.equal(tail(*head(x)), model(x))
        True
    """
    if isinstance(point, str):
        point = graph.cut_point(point)
    nodes = list(graph.gm.graph.nodes)

    head_graph, env = fx.Graph(), {}
    for node in nodes[: point.index + 1]:
        env[node] = head_graph.node_copy(node, lambda n: env[n])
    by_name = {n.name: n for n in nodes}
    head_graph.output(tuple(env[by_name[name]] for name in (t for t, _ in point.tensors)))

    tail_graph, tenv = fx.Graph(), {}
    for name, _ in point.tensors:
        tenv[by_name[name]] = tail_graph.placeholder(name)
    cut = tenv[by_name[point.node]]
    for node in nodes[: point.index + 1]:
        if node.op == "placeholder" and node.args and node not in tenv:
            # a forward argument with a default (timm's `attn_mask=None`): the tail takes it too,
            # after the crossing tensors, with the same default, so `tail(*head(x))` still holds
            tenv[node] = tail_graph.placeholder(node.name, default_value=node.args[0])
    for node in nodes[point.index + 1:]:
        # a KeyError here would mean a crossing tensor was missed: CutPoint.tensors is exact
        tenv[node] = tail_graph.node_copy(node, lambda n: _before_cut(tail_graph, tenv, n, cut))
    root = graph.gm
    return fx.GraphModule(root, head_graph, "Head"), fx.GraphModule(root, tail_graph, "Tail")


def _before_cut(graph: fx.Graph, env: dict, node: fx.Node, cut: fx.Node) -> object:
    """A value from before the cut, in the graph after it: what crosses, a parameter read again,
    or a size rebuilt from the split tensor's batch (``graph._sizes``)."""
    if node not in env:
        if node.op == "get_attr":
            env[node] = graph.node_copy(node)
        elif node.meta.get("shape") is None and recomputable(node):
            env[node] = rebuild(graph, node, cut)
    return env[node]


#: :func:`cut_model` by its name before issue 39
split_model = cut_model
