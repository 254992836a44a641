import pytest
import torch
from torch import nn

from nestflex import NestflexError
from nestflex.exits import ExitError, MultiExitNetwork, create_head, get_head, list_heads, register_head
from nestflex.exits.heads import MSDNetHead, SDNHead
from nestflex.models import create_model


@pytest.mark.parametrize("name", list_heads())
@pytest.mark.parametrize("in_shape", [(16, 32, 32), (8, 7, 5), (32, 2, 2), (4, 1, 1)])
def test_every_registered_head_maps_features_to_logits(name, in_shape):
    # the token head reads a transformer's channels-last maps (issue 40), the others channels-first ones
    layout = "channels_last" if name == "token" else "channels_first"
    head = create_head(name, in_shape, num_classes=7, layout=layout)
    out = head(torch.randn(3, *in_shape))
    assert out.shape == (3, 7)
    out.sum().backward()  # trainable end to end
    assert all(p.grad is not None for p in head.parameters())


def test_builtin_heads_are_the_documented_ones():
    assert {"sdn", "msdnet"} <= set(list_heads())
    assert isinstance(create_head("sdn", (16, 32, 32), 10), SDNHead)
    msd = create_head("msdnet", (16, 32, 32), 10, channels=24)
    assert isinstance(msd, MSDNetHead) and msd.linear.in_features == 24


def test_sdn_head_mixes_max_and_avg_pooling():
    head = create_head("sdn", (2, 8, 8), 3)
    x = torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        head.alpha.fill_(1.0)
        only_max = (
            head.linear.weight @ torch.nn.functional.adaptive_max_pool2d(x, 4).flatten() + head.linear.bias
        )
        torch.testing.assert_close(head(x)[0], only_max)
        head.alpha.fill_(0.0)
        only_avg = (
            head.linear.weight @ torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten() + head.linear.bias
        )
        torch.testing.assert_close(head(x)[0], only_avg)


def test_unknown_head_names_the_known_ones():
    with pytest.raises(
        ExitError, match=r"unknown exit head `sdm`; choose from: .*msdnet.*sdn.*did you mean `sdn`"
    ):
        get_head("sdm")
    with pytest.raises(NestflexError, match="unknown exit head `nope`"):
        MultiExitNetwork(create_model("vgg11", width=0.25), head="nope")


def test_user_heads_by_registry_and_by_callable():
    class Tiny(nn.Module):
        def __init__(self, in_shape, num_classes):
            super().__init__()
            self.fc = nn.Linear(in_shape[0], num_classes)

        def forward(self, x):
            return self.fc(x.mean((2, 3)))

    register_head("test_tiny_gap")(Tiny)
    with pytest.raises(ExitError, match="exit head `test_tiny_gap` is already registered"):
        register_head("test_tiny_gap")(Tiny)
    for head in ("test_tiny_gap", Tiny):
        net = MultiExitNetwork(create_model("vgg11", width=0.25), positions=(0.5,), head=head)
        assert isinstance(net.exits[0], Tiny)
        # MACs of a user head are counted too: one linear of C x classes
        assert net.head_macs == [net.exits[0].fc.weight.numel()]
    with pytest.raises(ExitError, match="returned int, not an nn.Module"):
        create_head(lambda in_shape, num_classes: 3, (4, 2, 2), 10)


def test_heads_need_a_feature_map():
    with pytest.raises(ExitError, match=r"exit heads attach to \(C, H, W\) feature maps, got .* \(512,\)"):
        create_head("sdn", (512,), 10)
    with pytest.raises(ExitError, match="`pool_size` must be a positive int, got 0"):
        create_head("sdn", (4, 8, 8), 10, pool_size=0)
    with pytest.raises(ExitError, match="`channels` must be a positive int or None, got -1"):
        create_head("msdnet", (4, 8, 8), 10, channels=-1)
