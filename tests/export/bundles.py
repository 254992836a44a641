"""Tiny bundles for the export and deploy tests: a 3-level nested VGG-11 x0.125 with two exits."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from nestflex.capacity import extract_level, nest_from_roadmap
from nestflex.exits import MultiExitNetwork
from nestflex.export import export_bundle
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
