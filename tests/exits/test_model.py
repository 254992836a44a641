import copy
import pickle

import pytest
import torch

from nestflex.exits import MultiExitNetwork, apply_policy, get_confidence
from nestflex.graph import trace
from nestflex.models import create_model
from tests.conftest import settle_batchnorm


@pytest.mark.parametrize("name, width", [("vgg16", 0.25), ("resnet56", 0.25)])
def test_final_exit_is_the_backbone_and_every_exit_gives_logits(name, width):
    backbone = settle_batchnorm(create_model(name, width=width), steps=1)
    net = MultiExitNetwork(backbone).eval()
    assert net.num_exits == 7 and len(net.exits) == 6
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        outs = net(x)
        assert torch.equal(outs[-1], backbone(x))
    assert [tuple(z.shape) for z in outs] == [(3, 10)] * 7


def test_exits_attach_to_timm_resnet18_and_train():
    backbone = settle_batchnorm(create_model("timm:resnet18"), steps=1)
    net = MultiExitNetwork(backbone, positions=(0.3, 0.6, 0.9), head="msdnet").eval()
    assert net.exit_names == ["layer2.0.act1", "layer3.0.act2", "layer4.1.act1", "final"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(net(x)[-1], backbone(x))
    net.train()
    outs = net(torch.randn(4, 3, 32, 32))
    sum(torch.nn.functional.cross_entropy(z, torch.arange(4)) for z in outs).backward()
    assert net.backbone.conv1.weight.grad is not None
    assert all(p.grad is not None for p in net.exits.parameters())


def test_macs_accounting_includes_the_heads():
    backbone = create_model("vgg16", width=0.25)
    graph = trace(backbone)
    net = MultiExitNetwork(backbone, positions=(0.3, 0.6))
    assert net.backbone_macs == graph.macs()
    # SDN head at a (C, H, W) tap: one linear of C*4*4 x classes
    for head, point in zip(net.exits, net.points):
        c = dict(point.tensors)[point.node][0]
        assert head.linear.weight.numel() == c * 16 * 10
    assert net.head_macs == [h.linear.weight.numel() for h in net.exits]
    assert net.exit_macs == [
        net.points[0].macs_before + net.head_macs[0],
        net.points[1].macs_before + net.head_macs[0] + net.head_macs[1],
        graph.macs() + sum(net.head_macs),
    ]


def test_detach_keeps_exit_gradients_out_of_the_backbone():
    net = MultiExitNetwork(create_model("resnet20", width=0.25), positions=(0.3, 0.6))
    outs = net(torch.randn(4, 3, 32, 32), detach=True)
    outs[0].sum().backward()
    assert net.backbone.conv1.weight.grad is None and net.exits[0].linear.weight.grad is not None
    net.zero_grad(set_to_none=True)
    net(torch.randn(4, 3, 32, 32), detach=True)[-1].sum().backward()
    assert net.backbone.conv1.weight.grad is not None


def test_copies_and_pickles_share_their_own_weights(small_net):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = small_net(x)
        for clone in (copy.deepcopy(small_net), pickle.loads(pickle.dumps(small_net))):
            assert all(torch.equal(a, b) for a, b in zip(clone(x), before))
            clone.backbone.conv1.weight.zero_()
            assert not torch.equal(clone(x)[-1], before[-1])  # the clone's stages use the clone's weights
        assert all(torch.equal(a, b) for a, b in zip(small_net(x), before))  # the original is untouched
    assert set(small_net.state_dict()) == {f"backbone.{k}" for k in small_net.backbone.state_dict()} | {
        f"exits.{k}" for k in small_net.exits.state_dict()
    }


@pytest.mark.parametrize("confidence", ["max_prob", "entropy"])
def test_model_early_exit_equals_per_sample_and_full_forward(small_net, confidence):
    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = torch.stack(small_net(x))
    conf = torch.stack([get_confidence(confidence)(z) for z in logits])
    thresholds = [float(q) for q in conf[:-1].quantile(0.7, dim=1)]
    batched = small_net.early_exit(x, thresholds, confidence)
    assert len(set(batched.exit_index.tolist())) >= 3
    singles = [small_net.early_exit(x[i : i + 1], thresholds, confidence) for i in range(len(x))]
    assert batched.exit_index.tolist() == [s.exit_index.item() for s in singles]
    assert batched.answer_index.tolist() == [s.answer_index.item() for s in singles]
    # batch size changes float summation order in convolutions: equal up to rounding
    torch.testing.assert_close(batched.logits, torch.cat([s.logits for s in singles]), atol=1e-4, rtol=1e-4)
    full = apply_policy(logits, thresholds, confidence)
    assert torch.equal(batched.exit_index, full.exit_index)
    assert torch.equal(batched.logits.argmax(1), full.logits.argmax(1))
