"""A hand-made roadmap: nested random removals, each footprint with its own (perturbed) weights."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.graph.surgery import prune_channels
from nestflex.pruning import Footprint, Roadmap


def make_roadmap(dirpath: Path, net: torch.nn.Module, steps: int = 4, share: float = 0.2, prefix: str = "",
                 model_name: str = "Net", seed: int = 0) -> Roadmap:
    """Write ``roadmap.json`` + ``footprints/step_NNN.ckpt`` for ``net`` (left unpruned)."""
    g = torch.Generator().manual_seed(seed)
    graph = trace(net)
    groups = {x.name: x.width for x in graph.prunable_groups}
    removed = {n: [] for n in groups}
    road = Roadmap(model=model_name, criterion="random", goal=0.1, start_accuracy=0.5, groups=groups)
    for step in range(steps + 1):
        if step:
            for n, w in groups.items():
                alive = [c for c in range(w) if c not in removed[n]]
                k = min(len(alive) - 1, max(1, round(share * w)))
                pick = torch.randperm(len(alive), generator=g)[:k].tolist()
                removed[n] = sorted(removed[n] + [alive[i] for i in pick])
        pruned = copy.deepcopy(net)
        for x in graph.prunable_groups:  # copies: surgery updates a group's width
            if removed[x.name]:
                prune_channels(pruned, copy.deepcopy(x), [c for c in range(x.width) if c not in removed[x.name]])
        with torch.no_grad():  # every footprint has its own retrained values
            for p in pruned.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        widths = {x.id: x.width - len(removed[x.name]) for x in graph.prunable_groups}
        rel = f"footprints/step_{step:03d}.ckpt"
        (dirpath / "footprints").mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": {prefix + k: v for k, v in pruned.state_dict().items()}}, dirpath / rel)
        road.footprints.append(Footprint(step=step, accuracy=0.5, params=graph.params(widths), macs=graph.macs(widths),
                                        widths={n: groups[n] - len(r) for n, r in removed.items()},
                                        removed=copy.deepcopy(removed), checkpoint=rel))
    road.status = "max_steps"
    road.save(dirpath / "roadmap.json")
    return road


@pytest.fixture
def vgg_roadmap(tmp_path):
    net = create_model("vgg11", width=0.125)
    make_roadmap(tmp_path, net)
    return net, tmp_path / "roadmap.json"
