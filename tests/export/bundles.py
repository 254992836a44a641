"""Tiny bundles for the export and deploy tests: a 3-level nested VGG-11 x0.125 with two exits,
and FlexDNN's fine-grained exits (built from a spec, as the recipe rebuilds them)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from nestflex.capacity import extract_level, nest_from_roadmap
from nestflex.exits import MultiExitNetwork
from nestflex.exits.flexdnn import RankedDropout, build_flex_network
from nestflex.exits.placement import resolve_positions
from nestflex.export import export_bundle
from nestflex.graph import trace
from nestflex.models import create_model
from tests.capacity.conftest import make_roadmap

LEVELS = 3


def nested_vgg(tmp: Path, seed: int = 0) -> torch.nn.Module:
    """A multi-capacity VGG-11 x0.125 with per-level BatchNorm statistics that differ (eval mode)."""
    torch.manual_seed(seed)
    net = create_model("vgg11", width=0.125)
    make_roadmap(tmp, net, seed=seed)
    nest_from_roadmap(net, tmp / "roadmap.json", levels=LEVELS)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-trivial statistics, so a wrong BatchNorm in the runtime shows
        for name, b in net.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return net.eval()


def exits_on(net: torch.nn.Module, head: str = "sdn") -> MultiExitNetwork:
    """Exit heads on the largest level of ``net`` (shared backbone), with random head weights."""
    torch.manual_seed(1)
    return MultiExitNetwork(extract_level(net, LEVELS - 1), positions=(0.3, 0.6), head=head).eval()


def write_bundle(tmp: Path, onnx: bool = True, **kwargs) -> tuple[dict, torch.nn.Module, MultiExitNetwork]:
    net = nested_vgg(tmp)
    exits = exits_on(net)
    info = export_bundle(tmp / "model.nfx", net, exits=exits, thresholds=[0.5, 0.6], onnx=onnx,
                         mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), classes=[f"c{i}" for i in range(10)], **kwargs)
    return info, net, exits


def own_backbone_exits(net: torch.nn.Module) -> MultiExitNetwork:
    """Exits whose backbone was fine-tuned jointly: it no longer equals the largest level."""
    exits = exits_on(net)
    joint = copy.deepcopy(exits)
    with torch.no_grad():
        joint.backbone.features.conv1.weight.mul_(1.5)
    return joint


def flex_spec(backbone: torch.nn.Module, positions=(0.3, 0.6), widths=([4], [4, 8]), seed: int = 0,
              stem_pools=(2, 1)) -> dict:
    """A FlexDNN spec (the shape :func:`nestflex.exits.flexdnn.flexdnn` writes) with random top-k filters:
    about half of each tapped layer's channels, out of order, as a ranking gives them; the first
    head average-pools its input first (``stem_pool``)."""
    g = torch.Generator().manual_seed(seed)
    points = resolve_positions(trace(backbone, (3, 32, 32)), list(positions))
    exits = []
    for p, w, sp in zip(points, widths, stem_pools):
        c, h, w_ = next(shape for name, shape in p.tensors if name == p.node)
        filters = torch.randperm(c, generator=g)[: max(2, c // 2)].tolist()
        exits.append({"location": p.name, "filters": filters, "widths": list(w), "in_hw": [h, w_], "stem_pool": sp})
    return {"schema_version": 1, "num_classes": 10, "input_shape": [3, 32, 32], "confidence": "entropy",
            "thresholds": [0.4, 0.5][: len(exits)], "fallback": "final", "exits": exits}


def flex_on(backbone: torch.nn.Module, dropout: bool = True, seed: int = 2) -> tuple[MultiExitNetwork, dict]:
    """FlexDNN exits on ``backbone`` rebuilt from a spec, with random head weights and BatchNorm
    statistics; the first head keeps a RankedDropout (as during the search) to check it exports as
    the identity it is at inference."""
    spec = flex_spec(backbone)
    net = build_flex_network(backbone, spec)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in net.exits.state_dict().items():
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith(("running_mean", "weight", "bias")):
                t.copy_(0.3 * torch.randn(t.shape, generator=g))
    if dropout:
        net.exits[0].dropout = RankedDropout(net.exits[0].filters, p_max=0.5)
    return net.eval(), spec


def write_flex_bundle(tmp: Path, onnx: bool = True, own: bool = False, progressive: bool = True, **kwargs):
    """The nested VGG with SDN exits and FlexDNN exits; ``own``: FlexDNN on a different backbone
    (as in the recipe when the grow stage ran: FlexDNN runs on the baseline)."""
    net = nested_vgg(tmp)
    exits = exits_on(net) if progressive else None
    if own:
        torch.manual_seed(3)
        from tests.conftest import settle_batchnorm

        backbone = settle_batchnorm(create_model("vgg11", width=0.125))
    else:
        backbone = extract_level(net, LEVELS - 1)
    flex, spec = flex_on(backbone)
    report = {"plan": {"kept_locations": [e["location"] for e in spec["exits"]], "thresholds": spec["thresholds"],
                       "accuracy": 0.5, "mean_macs": 1000, "mean_macs_fraction": 0.5, "ranking_orders": [1, 2]},
              "profile": {"operating_points": [{"threshold": 0.3, "accuracy": 0.4, "mean_macs": 900,
                                                "mean_macs_fraction": 0.45}]},
              "calibration": {"split": "calibration", "samples": 40, "folds": 5, "accuracy": 0.45,
                              "mean_macs_fraction": 0.6, "cv": [{"thresholds": [0.1]}]}}
    info = export_bundle(tmp / "flex.nfx", net, exits=exits, thresholds=[0.5, 0.6] if progressive else None, onnx=onnx,
                         flex_exits=flex, flex_spec=spec, flex_report=report, **kwargs)
    return info, net, exits, flex, spec
