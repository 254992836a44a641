"""Channel groups through concatenation and channel slices (issue 21, item 1)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nestflex.graph import permute_channels, prune_channels, trace
from tests.conftest import settle_batchnorm


class _Dense(nn.Module):
    """DenseNet in miniature: each layer sees the concatenation of every earlier output."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.layers = nn.ModuleList()
        width = 6
        for _ in range(3):
            self.layers.append(nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, 4, 3, padding=1)))
            width += 4
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Linear(width * 4, 5)

    def forward(self, x):
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        x = F.relu(self.norm(torch.cat(feats, 1)[:, :18]))  # every channel: stays the identity when pruned
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 2), 1))


class _Inception(nn.Module):
    """Branches concatenated, then a depthwise conv, a residual of two concatenations, a slice
    that keeps the first two parts and a concatenation along the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.b, self.c = nn.Conv2d(8, 5, 1), nn.Conv2d(8, 3, 3, padding=1), nn.Conv2d(8, 2, 1)
        self.bn = nn.BatchNorm2d(10)
        self.dw = nn.Conv2d(10, 10, 3, padding=1, groups=10)
        self.a2, self.b2, self.c2 = nn.Conv2d(10, 5, 1), nn.Conv2d(10, 3, 1), nn.Conv2d(10, 2, 1)
        self.out = nn.Conv2d(8, 6, 1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = F.relu(self.bn(torch.cat([self.a(x), self.b(x), self.c(x)], dim=1)))
        y = self.dw(y)
        z = torch.cat([self.a2(y), self.b2(y), self.c2(y)], 1) + y  # part by part
        z = z[:, :8]  # keeps the first two parts whole: constant bounds lock them, not the third
        z = F.relu(self.out(z))
        z = torch.cat([z, z], 0)  # along the batch: the same channels
        return self.fc(z.mean((2, 3)))[: x.shape[0]]


MODELS = {"dense": _Dense, "inception": _Inception}


def _masked_output(model, graph, keep, x):
    """The output with every consumer ignoring the channels not in ``keep`` (their input rows
    zeroed, at their offset in a concatenation): what pruning them must reproduce."""
    for g in graph.prunable_groups:
        drop = torch.ones(g.width, dtype=torch.bool)
        drop[keep[g.id]] = False
        drop = drop.nonzero().flatten()
        for m in g.members:
            if m.role == "in":
                getattr(model.get_submodule(m.module), m.attr).index_fill_(m.dim, m.rows(g, drop, others=False), 0)
    return model(x)


def prune_like_masking(model, graph, keep, x):
    """Prune every group of ``keep`` and check the output equals the masked model's (float64)."""
    with torch.no_grad():
        masked = _masked_output(model, graph, keep, x)
        for g in graph.prunable_groups:
            if g.id in keep:
                prune_channels(model, g, keep[g.id])
        torch.testing.assert_close(model(x), masked, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", list(MODELS))
def test_concatenated_groups_are_prunable_and_pruned_equals_masked(name):
    torch.manual_seed(0)
    model = settle_batchnorm(MODELS[name]()).eval()
    graph = trace(model, (3, 8, 8))
    prunable = {g.name for g in graph.prunable_groups}
    if name == "dense":
        assert prunable == {"stem", "layers.0.2", "layers.1.2", "layers.2.2"}
    else:  # a, b (tied to a2, b2) are what the slice keeps; c (with c2) is dropped by it
        assert prunable == {"stem", "c", "out"}
        assert "slices channels [0:8]" in graph.group("a").reason
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    model = model.double()
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width // 2)] for g in graph.prunable_groups}
    widths = {gid: len(k) for gid, k in keep.items()}
    predicted = graph.macs(widths), graph.params(widths)
    with torch.no_grad():
        masked = _masked_output(model, graph, keep, x)
        for g in graph.prunable_groups:  # one graph, every group: offsets follow the live widths
            prune_channels(model, g, keep[g.id])
        pruned = model(x)
    torch.testing.assert_close(pruned, masked, atol=1e-10, rtol=0)
    again = trace(model, (3, 8, 8))
    assert (again.macs(), again.params()) == predicted
    assert again.widths() == {**graph.widths(), **widths}


@pytest.mark.parametrize("name", list(MODELS))
def test_permuting_concatenated_groups_keeps_the_function(name):
    torch.manual_seed(1)
    model = settle_batchnorm(MODELS[name]()).eval().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        graph = trace(model, (3, 8, 8))
        for g in graph.prunable_groups:
            permute_channels(model, g, torch.randperm(g.width))
        torch.testing.assert_close(model(x), before, atol=1e-10, rtol=0)


def test_a_slice_through_a_space_and_a_concatenation_added_to_a_plain_tensor_lock():
    class _Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.Conv2d(3, 8, 1)
            self.d = nn.Conv2d(3, 6, 1)
            self.head = nn.Conv2d(11, 2, 1)

        def forward(self, x):
            y = torch.cat([self.a(x), self.b(x)], 1) + self.c(x)  # which of c's channels meet a's?
            return self.head(torch.cat([y, self.d(x)[:, :3]], 1))  # d's first three channels only

    graph = trace(_Bad(), (3, 4, 4))
    for name in ("a", "b", "c", "d"):
        assert not graph.group(name).prunable, name
    assert "slices channels [0:3]" in graph.group("d").reason and "`add`" in graph.unsupported


def test_growing_levels_through_a_concatenation_is_refused_with_the_reason():
    from nestflex.capacity.levels import LevelPlan
    from nestflex.capacity.nested import Source, nest_
    from nestflex.errors import CapacityError

    net = _Dense()
    graph = trace(net, (3, 8, 8))
    member = next(m for m in graph.group("stem").members if m.layout is not None)
    assert "stem" in repr(member.layout) and member.role in ("in", "norm")
    plan = LevelPlan((1, 0), {"stem": list(range(6))}, ({"stem": 3}, {"stem": 6}), (1, 2))
    own = Source(net.state_dict())
    with pytest.raises(CapacityError, match="'stem' reaches .* through a concatenation"):
        nest_(net, plan, [own, own], input_shape=(3, 8, 8))


def test_torchvision_densenet_prunes_through_its_concatenations():
    import torchvision  # the dev extra installs it: missing is a broken install, not a skip
    torch.manual_seed(0)
    model = torchvision.models.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=6, bn_size=2,
                                        num_classes=3).eval().double()
    graph = trace(model, (3, 16, 16))
    # every group but the classifier's (the model output): each dense layer's growth, the stem,
    # the transition; before concatenation was mapped, only the bottleneck convs were free
    assert [g.name for g in graph.groups if not g.prunable] == ["classifier"]
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width // 2)] for g in graph.prunable_groups}
    with torch.no_grad():
        masked = _masked_output(model, graph, keep, x)
        for g in graph.prunable_groups:
            prune_channels(model, g, keep[g.id])
        torch.testing.assert_close(model(x), masked, atol=1e-10, rtol=0)
