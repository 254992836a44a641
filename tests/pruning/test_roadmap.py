import json

import pytest
import torch
from torch import nn

from nestflex.graph import trace
from nestflex.models import create_model
from nestflex.pruning import Footprint, PruningError, Roadmap, apply_footprint
from nestflex.pruning._optim import prune_with_optimizers


def _roadmap():
    return Roadmap(
        model="VGG", criterion="trr", goal=0.5, start_accuracy=0.6,
        groups={"features.conv1": 8, "features.conv2": 16},
        footprints=[
            Footprint(0, 0.6, 100, 1000, {"features.conv1": 8, "features.conv2": 16}, {"features.conv1": [], "features.conv2": []}),
            Footprint(1, 0.55, 50, 500, {"features.conv1": 6, "features.conv2": 12},
                      {"features.conv1": [1, 4], "features.conv2": [0, 3, 8, 15]}, epoch=2, checkpoint="footprints/step_001.ckpt"),
        ],
    )


def test_roundtrip_seed_and_kept(tmp_path):
    r = _roadmap()
    r.save(tmp_path / "roadmap.json")
    d = json.loads((tmp_path / "roadmap.json").read_text())
    assert d["schema_version"] == 2 and d["seed"] == 1
    back = Roadmap.load(tmp_path / "roadmap.json")
    assert back == r and back.seed.step == 1
    assert back.kept(1)["features.conv1"] == [0, 2, 3, 5, 6, 7]


def test_the_budget_targets_round_trip_and_older_files_without_them_load(tmp_path):
    r = _roadmap()
    r.mode, r.target_cost, r.goal = "cost", 0.5, 0.0
    r.save(tmp_path / "roadmap.json")
    back = Roadmap.load(tmp_path / "roadmap.json")
    assert back == r and (back.mode, back.target_cost, back.target_macs) == ("cost", 0.5, None)
    old = _roadmap().to_dict()
    for key in ("mode", "target_macs", "target_cost"):  # a file written before the budget modes
        old.pop(key)
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert (Roadmap.load(tmp_path / "old.json").mode, Roadmap.load(tmp_path / "old.json").target_cost) == ("accuracy", None)


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(PruningError, match="does not exist. HINT: run the pruning stage"):
        Roadmap.load(tmp_path / "nope.json")
    d = _roadmap().to_dict() | {"schema_version": 99}
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(PruningError, match="schema_version 99 is not supported"):
        Roadmap.load(tmp_path / "r.json")


def test_apply_footprint_rebuilds_the_architecture_and_rejects_other_models():
    model = apply_footprint(create_model("vgg11", width=0.125), _roadmap())
    assert model.features.conv1.out_channels == 6 and model.features.conv2.out_channels == 12
    with pytest.raises(PruningError, match="has 16 channels, the roadmap expects 8"):
        apply_footprint(create_model("vgg11", width=0.25), _roadmap())
    with pytest.raises(PruningError, match="which CifarResNet does not have. HINT: the roadmap comes from another model"):
        apply_footprint(create_model("resnet20", width=0.25), _roadmap())


def test_optimizer_keeps_momentum_of_kept_channels_and_the_scheduler_continues():
    torch.manual_seed(0)
    model = create_model("vgg11", width=0.125)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    opt.step()
    sched.step()
    graph = trace(model)
    old_w = model.features.conv2.weight
    old_buf = opt.state[old_w]["momentum_buffer"].clone()
    keep = torch.tensor([1, 3, 4, 9, 10, 15])
    prune_with_optimizers(model, graph, {graph.group("features.conv2").id: keep}, [opt])
    new_w = model.features.conv2.weight
    assert new_w.shape[0] == 6 and any(p is new_w for p in opt.param_groups[0]["params"])
    assert not any(p is old_w for p in opt.param_groups[0]["params"])
    assert torch.equal(opt.state[new_w]["momentum_buffer"], old_buf[keep])
    conv3 = model.features.conv3.weight  # the consumer: sliced on its input dim
    assert opt.state[conv3]["momentum_buffer"].shape == conv3.shape
    model.zero_grad()
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    opt.step()
    sched.step()
    assert sched.optimizer is opt and opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert isinstance(model.features.conv2.weight, nn.Parameter)
