"""One pruning step: how many channels each group loses, and which."""

from __future__ import annotations

from typing import Mapping

import torch

from nestflex.graph import StructureGraph
from nestflex.pruning.sensitivity import keep_top

__all__ = ["plan_step"]


def plan_step(
    graph: StructureGraph,
    scores: Mapping[int, torch.Tensor],
    weights: Mapping[int, float],
    step: float,
    min_channels: int = 1,
) -> dict[int, torch.Tensor]:
    """Channels to keep per group (current indexing) after one step.

    Group ``g`` of current width ``w`` loses ``round(step * weights[g] * w)`` channels, its
    lowest-scoring ones, never going below ``min_channels``. Groups whose count comes out 0 are
    left out of the result; an empty result means nothing more can be pruned at this step size.

    Example:
        >>> from nestflex.models import create_model
        >>> from nestflex.graph import trace
        >>> g = trace(create_model("vgg11", width=0.125))
        >>> scores = {x.id: torch.arange(x.width, dtype=torch.float64) for x in g.prunable_groups}
        >>> plan = plan_step(g, scores, {x.id: 1.0 for x in g.prunable_groups}, 0.25)
        >>> plan[0].tolist()  # 8 channels, 2 removed: the two lowest scores
        [2, 3, 4, 5, 6, 7]
    """
    plan = {}
    for gid, s in scores.items():
        width = graph.group(gid).width
        n = min(round(step * weights.get(gid, 0.0) * width), width - min_channels)
        if n > 0:
            plan[gid] = keep_top(s, width - n)
    return plan
