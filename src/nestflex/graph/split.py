"""Cut a traced model in two at a split point: ``tail(*head(x)) == model(x)``.

The head returns every tensor that crosses the cut (the split activation and any skip tensor
still needed later), in :attr:`SplitPoint.tensors` order; the tail takes them as positional
arguments. Both are ``fx.GraphModule`` objects sharing the model's weights.
"""

from __future__ import annotations

from torch import fx

from nestflex.graph.structure import SplitPoint, StructureGraph

__all__ = ["split_model"]


def split_model(graph: StructureGraph, point: SplitPoint | str) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Return ``(head, tail)`` GraphModules for a split point (object or name).

    Example:
        >>> import torch
        >>> from nestflex.models import create_model
        >>> from nestflex.graph import trace
        >>> model = create_model("resnet20").eval()
        >>> g = trace(model)
        >>> head, tail = split_model(g, "layer2.0.relu1")
        >>> [name for name, _ in g.split_point("layer2.0.relu1").tensors]
        ['layer1_2_relu2', 'layer2_0_relu1']
        >>> x = torch.randn(2, 3, 32, 32)
        >>> torch.equal(tail(*head(x)), model(x))
        True
    """
    if isinstance(point, str):
        point = graph.split_point(point)
    nodes = list(graph.gm.graph.nodes)

    head_graph, env = fx.Graph(), {}
    for node in nodes[: point.index + 1]:
        env[node] = head_graph.node_copy(node, lambda n: env[n])
    by_name = {n.name: n for n in nodes}
    head_graph.output(tuple(env[by_name[name]] for name in (t for t, _ in point.tensors)))

    tail_graph, tenv = fx.Graph(), {}
    for name, _ in point.tensors:
        tenv[by_name[name]] = tail_graph.placeholder(name)
    for node in nodes[point.index + 1:]:
        # a KeyError here would mean a crossing tensor was missed: SplitPoint.tensors is exact
        tenv[node] = tail_graph.node_copy(node, lambda n: tenv[n])
    root = graph.gm
    return fx.GraphModule(root, head_graph, "Head"), fx.GraphModule(root, tail_graph, "Tail")
