"""Nested layers: one weight copy, level k = the footprint's architecture, switchable BatchNorm."""

import pytest
import torch

from nestflex.capacity import (
    CapacityError,
    MultiCapacityModel,
    choose_levels,
    extract_level,
    nest_from_roadmap,
    plan_levels,
    read_state,
    set_level,
)
from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import Footprint, Roadmap, apply_footprint
from tests.capacity.conftest import make_roadmap


@pytest.mark.parametrize("name,width", [("vgg11", 0.125), ("resnet20", 0.25)])
def test_level_zero_is_the_seed_and_every_level_has_its_footprint_architecture(tmp_path, name, width):
    net = create_model(name, width=width)
    road = make_roadmap(tmp_path, net, steps=3)
    mc = MultiCapacityModel.from_roadmap(net, tmp_path / "roadmap.json", levels=3).eval()
    assert mc.plan.steps == (3, 1, 0)
    x = torch.randn(3, 3, 32, 32)
    for k, step in enumerate(mc.plan.steps):
        mc.set_level(k)
        plain = mc.extract(k).eval()
        g = trace(plain)
        assert (g.macs(), g.params()) == (road.footprint(step).macs, road.footprint(step).params)
        assert torch.equal(plain(x), mc(x))  # the plain extract computes exactly what the level does
    seed = apply_footprint(create_model(name, width=width), road, 3)
    seed.load_state_dict(read_state(tmp_path / road.footprint(3).checkpoint, seed))
    mc.set_level(0)
    assert torch.equal(mc(x), seed.eval()(x))  # level 0 is the seed model, bit for bit


def test_weights_are_stored_once_in_nested_order(vgg_roadmap):
    net, path = vgg_roadmap
    full = sum(p.numel() for p in create_model("vgg11", width=0.125).parameters())
    plan = nest_from_roadmap(net, path, levels=3)
    conv = net.features.conv1
    assert conv.weight.shape[0] == 8 and list(conv.nest_out) == [plan.widths[k]["features.conv1"] for k in range(3)]
    shared = sum(p.numel() for n, p in net.named_parameters() if ".levels." not in n)
    norms = sum(p.numel() for n, p in net.named_parameters() if ".levels." in n)
    assert shared + sum(p.numel() for n, p in net.named_parameters() if n.endswith("levels.2.weight") or n.endswith("levels.2.bias")) == full
    assert norms < 0.05 * full  # switchable BN is the only per-level storage
    road = Roadmap.load(path)
    for g, order in plan.order.items():  # seed channels first, then each level's additions
        assert order[: plan.widths[0][g]] == road.kept(plan.steps[0])[g]
        assert sorted(order) == list(range(road.groups[g]))


def test_choose_levels_is_even_in_macs_and_errors_are_clear(vgg_roadmap):
    _, path = vgg_roadmap
    road = Roadmap.load(path)
    assert choose_levels(road, 5) == [4, 3, 2, 1, 0]
    assert choose_levels(road, 2) == [4, 0]
    with pytest.raises(CapacityError, match=r"`levels`=6 but the roadmap has only 5 footprints"):
        choose_levels(road, 6)
    with pytest.raises(CapacityError, match=r"`levels` must be an int >= 2"):
        choose_levels(road, 1)
    with pytest.raises(CapacityError, match=r"decreasing steps ending in 0"):
        plan_levels(road, [1, 3, 0])
    with pytest.raises(CapacityError, match=r"not a footprint of the roadmap"):
        plan_levels(road, [9, 0])


def test_choose_levels_spacing():
    fps = [Footprint(s, 0.9, 10, m, {}, {}) for s, m in enumerate([100, 95, 90, 52, 50, 20, 10])]
    road = Roadmap("M", "l1", 0.9, 0.9, {}, fps)
    assert choose_levels(road, 3) == [6, 3, 0]  # 55 is the target: 52 is nearest


def test_roadmap_from_another_model_is_rejected(vgg_roadmap):
    _, path = vgg_roadmap
    with pytest.raises(CapacityError, match=r"which CifarResNet does not have. HINT: the roadmap comes from another model"):
        nest_from_roadmap(create_model("resnet20", width=0.25), path)
    with pytest.raises(CapacityError, match=r"has 16 channels, the roadmap's unpruned model has 8"):
        nest_from_roadmap(create_model("vgg11", width=0.25), path)


def test_not_nested_footprints_are_rejected(vgg_roadmap):
    _, path = vgg_roadmap
    road = Roadmap.load(path)
    g = next(iter(road.groups))
    fps = list(road.footprints)
    # step 1 claims to keep a channel that the larger step 0 ... removes: impossible for a roadmap
    fps[0] = Footprint(**{**fps[0].__dict__, "removed": {g: list(road.kept(4)[g][:1])}})
    bad = Roadmap(**{**road.__dict__, "footprints": fps})
    with pytest.raises(CapacityError, match=r"footprints are not nested: group"):
        plan_levels(bad, [4, 0])


def test_set_level_range_and_extract_leaves_the_level(vgg_roadmap):
    net, path = vgg_roadmap
    mc = MultiCapacityModel.from_roadmap(net, path, levels=3)
    with pytest.raises(CapacityError, match=r"`level` must be an int in \[0, 2\], got 3"):
        mc.set_level(3)
    with pytest.raises(CapacityError, match=r"is not a multi-capacity model"):
        set_level(create_model("vgg11", width=0.125), 0)
    mc.set_level(1)
    extract_level(mc.net, 2)
    assert mc.level == 1
    with pytest.raises(CapacityError, match=r"is already nested"):
        nest_from_roadmap(mc.net, path)


def test_timm_model_nests(tmp_path):
    """mobilenetv2: depthwise convs and timm's BatchNormAct2d."""
    net = create_model("timm:mobilenetv2_100", num_classes=10)
    road = make_roadmap(tmp_path, net, steps=1)
    mc = MultiCapacityModel.from_roadmap(net, tmp_path / "roadmap.json", levels=2).eval()
    x = torch.randn(2, 3, 32, 32)
    for k, step in enumerate(mc.plan.steps):
        mc.set_level(k)
        assert trace(mc.extract(k)).macs() == road.footprint(step).macs
        assert torch.equal(mc.extract(k).eval()(x), mc(x))
