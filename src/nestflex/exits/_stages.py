"""Cut a traced backbone into consecutive stages at several split points.

The generalisation of :func:`nestflex.graph.split_model` to ``K`` cuts: stage 0 takes the input,
stage ``k`` takes every tensor that crosses cut ``k - 1`` (in :attr:`SplitPoint.tensors` order,
skip connections included) and returns every tensor that crosses cut ``k``; the last stage
returns the backbone's output. Chaining them reproduces ``backbone(x)`` exactly. The stages are
``fx.GraphModule`` objects that share the backbone's submodules (and so its weights).
"""

from __future__ import annotations

from torch import fx

from nestflex.graph import SplitPoint, StructureGraph
from nestflex.graph._sizes import rebuild, recomputable

__all__ = ["build_stages"]


def build_stages(graph: StructureGraph, points: list[SplitPoint]) -> list[fx.GraphModule]:
    nodes = list(graph.gm.graph.nodes)
    by_name = {n.name: n for n in nodes}
    stages = []
    bounds = [-1] + [p.index for p in points] + [len(nodes) - 1]
    for k in range(len(bounds) - 1):
        g, env = fx.Graph(), {}
        if k > 0:
            for name, _ in points[k - 1].tensors:
                env[by_name[name]] = g.placeholder(name)
            for node in nodes[: bounds[k] + 1]:
                if node.op == "placeholder" and node.args and node not in env:
                    # a forward argument left at its default (timm's `attn_mask=None`) never
                    # crosses: each stage takes it with the same default
                    env[node] = g.placeholder(node.name, default_value=node.args[0])

        cut = env[by_name[points[k - 1].node]] if k > 0 else None

        def lookup(n: fx.Node, g=g, env=env, cut=cut) -> fx.Node:
            if n not in env:
                # parameters/buffers read with get_attr never "cross" a cut: copy them where used;
                # sizes read from shapes before the cut are rebuilt from its batch (graph._sizes)
                if n.op == "get_attr":
                    env[n] = g.node_copy(n)
                else:
                    assert cut is not None and recomputable(n), \
                        f"internal: {n.name} crosses a cut but is not in SplitPoint.tensors"
                    env[n] = rebuild(g, n, cut)
            return env[n]

        for node in nodes[bounds[k] + 1 : bounds[k + 1] + 1]:
            if node.op == "output":
                g.node_copy(node, lookup)
                continue
            env[node] = g.node_copy(node, lookup)
        if k < len(points):
            g.output(tuple(env[by_name[name]] for name, _ in points[k].tensors))
        stages.append(fx.GraphModule(graph.gm, g, f"Stage{k}"))
    return stages
