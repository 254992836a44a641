"""Grouped (non-depthwise) convolutions: interleaved channel groups (issue 21, item 1)."""

import pytest
import torch
from torch import nn

from nestflex.graph import permute_channels, trace
from tests.conftest import settle_batchnorm
from tests.graph.test_concat import prune_like_masking


class _NeXt(nn.Module):
    """A ResNeXt block in miniature (4 groups of 4), a widening grouped conv (2 -> 3 per group),
    a residual add and a depthwise conv on the interleaved channels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(16)
        self.reduce = nn.Conv2d(16, 16, 1)
        self.bn1 = nn.BatchNorm2d(16)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.bn2 = nn.BatchNorm2d(16)
        self.expand = nn.Conv2d(16, 16, 1)
        self.bn3 = nn.BatchNorm2d(16)
        self.wide = nn.Conv2d(16, 12, 3, padding=1, groups=2, bias=False)  # 8 -> 6 per group
        self.dw = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.reduce(x)))
        y = torch.relu(self.bn2(self.grouped(y)))
        x = torch.relu(x + self.bn3(self.expand(y)))
        x = torch.relu(self.dw(self.wide(x)))
        return self.head(x.mean((2, 3)))


def test_grouped_convs_interleave_their_input_and_output_groups():
    graph = trace(_NeXt(), (3, 8, 8))
    reduce, grouped = graph.group("reduce"), graph.group("grouped")
    assert (reduce.copies, reduce.width, grouped.copies, grouped.width) == (4, 4, 4, 4)
    assert reduce.prunable and grouped.prunable
    # the grouped conv's own weight is indexed by the position inside a block on dim 1
    assert {(m.module, m.dim, m.copies) for m in reduce.members if m.role == "in"} == {("grouped", 1, 1)}
    # the residual stream (stem + expand) reaches a 2-group conv: 2 blocks of 8, then 6 per block
    stem, wide = graph.group("stem"), graph.group("wide")
    assert (stem.copies, stem.width, wide.copies, wide.width) == (2, 8, 2, 6)
    assert wide.prunable and any(m.role == "depthwise" and m.copies == 2 for m in wide.members)


def test_pruning_interleaved_groups_equals_masking_and_keeps_the_conv_groups():
    torch.manual_seed(0)
    model = settle_batchnorm(_NeXt()).eval().double()
    graph = trace(model, (3, 8, 8))
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width // 2)] for g in graph.prunable_groups}
    widths = {gid: len(k) for gid, k in keep.items()}
    predicted = graph.macs(widths), graph.params(widths)
    prune_like_masking(model, graph, keep, x)
    assert (model.grouped.groups, model.grouped.in_channels, model.grouped.out_channels) == (4, 8, 8)
    assert tuple(model.grouped.weight.shape[:2]) == (8, 2) and model.wide.groups == 2
    again = trace(model, (3, 8, 8))
    assert (again.macs(), again.params()) == predicted
    assert again.widths() == {**graph.widths(), **widths}


def test_permuting_interleaved_groups_keeps_the_function():
    torch.manual_seed(1)
    model = settle_batchnorm(_NeXt()).eval().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        graph = trace(model, (3, 8, 8))
        for g in graph.prunable_groups:
            permute_channels(model, g, torch.randperm(g.width))
        torch.testing.assert_close(model(x), before, atol=1e-10, rtol=0)


def test_importance_scores_one_value_per_channel_of_an_interleaved_group():
    from nestflex.pruning.importance import get_importance

    model = _NeXt().eval()
    graph = trace(model, (3, 8, 8))
    grouped = graph.group("grouped")
    scores = get_importance("l1").scores(model, graph)
    assert scores[grouped.id].shape == (grouped.width,)
    # channel j's score is the L1 norm of its weight rows in every block
    w = model.grouped.weight.detach().double().abs().sum((1, 2, 3)).view(4, 4).sum(0)
    torch.testing.assert_close(scores[grouped.id], w)


def test_two_block_counts_on_one_space_or_a_concatenation_lock():
    class _Clash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 1)
            self.g2, self.g4 = nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.Conv2d(8, 8, 3, padding=1, groups=4)
            self.b = nn.Conv2d(3, 8, 1)
            self.g = nn.Conv2d(8, 8, 1, groups=2)
            self.head = nn.Conv2d(32, 2, 1)

        def forward(self, x):
            a = self.a(x)
            b = self.b(x)
            return self.head(torch.cat([self.g2(a), self.g4(a), self.g(b), b], 1))

    graph = trace(_Clash(), (3, 4, 4))
    assert not graph.group("a").prunable and "share these channels" in graph.group("a").reason
    assert not graph.group("b").prunable and "reach a concatenation" in graph.group("b").reason


def test_growing_levels_of_an_interleaved_group_is_refused_with_the_reason():
    from nestflex.capacity.levels import LevelPlan
    from nestflex.capacity.nested import Source, nest_
    from nestflex.errors import CapacityError

    net = _NeXt()
    plan = LevelPlan((1, 0), {"reduce": list(range(4))}, ({"reduce": 2}, {"reduce": 4}), (1, 2))
    own = Source(net.state_dict())
    with pytest.raises(CapacityError, match="'reduce' is interleaved"):
        nest_(net, plan, [own, own], input_shape=(3, 8, 8))


def test_torchvision_resnext_prunes_its_grouped_convs():
    from torchvision.models.resnet import Bottleneck, ResNet  # dev installs it: missing fails, not skips

    torch.manual_seed(0)
    model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=3, groups=4, width_per_group=4).eval().double()
    graph = trace(model, (3, 32, 32))
    interleaved = [g for g in graph.prunable_groups if g.copies == 4]
    assert len(interleaved) == 8  # conv1 and conv2 of each bottleneck
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width * 2 // 3)] for g in graph.prunable_groups}
    prune_like_masking(model, graph, keep, x)
