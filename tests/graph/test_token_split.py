"""Cut points on a transformer's residual stream (issue 40, item 1): after every block of a ViT,
DeiT, Swin or Mixer, on tokens (N, T, C) or channels-last maps (N, H, W, C); head + tail = model."""

import pytest
import torch

from nestflex.graph import cut_model, trace
from nestflex.graph._tokens import stream_ends
from tests.exits.tiny_vit import SHAPE, TinyViT

timm = pytest.importorskip("timm")


def _cuts_are_exact(model, shape):
    """Every cut point of ``model``: ``tail(*head(x))`` is bit-for-bit ``model(x)``; the points."""
    graph = trace(model.eval(), shape)
    x = torch.randn(2, *shape)
    with torch.no_grad():
        ref = model(x)
        for p in graph.cut_points:
            head, tail = cut_model(graph, p)
            crossing = head(x)
            assert [tuple(t.shape[1:]) for t in crossing] == [s for _, s in p.tensors], p.name
            assert torch.equal(tail(*crossing), ref), p.name
    return graph.cut_points


def test_the_tiny_vit_is_cut_after_every_block_on_its_token_stream():
    torch.manual_seed(0)
    points = _cuts_are_exact(TinyViT(), SHAPE)
    # one per block, named after it; the add after each attention (inside a block) is not offered
    assert [p.name for p in points] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert all(p.layout == "tokens" and p.tensors == ((p.node, (16, 16)),) for p in points)
    fractions = [p.macs_fraction for p in points]
    assert fractions == sorted(fractions) and 0 < fractions[0] < fractions[-1] < 1


def test_timm_vit_with_a_class_token_and_a_defaulted_mask_argument_cuts_exactly():
    """timm's ViT forward takes ``attn_mask=None``: that argument never crosses, the tail takes
    it with its default; the class token travels inside the stream."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=8,
                              depth=3, embed_dim=24, num_heads=2)
    points = _cuts_are_exact(model, (3, 32, 32))
    assert [p.name for p in points] == ["blocks.0", "blocks.1", "blocks.2"]
    assert all(len(p.tensors) == 1 and p.tensors[0][1] == (17, 24) for p in points)  # 16 patches + class token


def test_swin_is_cut_on_its_channels_last_maps_after_every_block():
    torch.manual_seed(0)
    from timm.models.swin_transformer import SwinTransformer

    model = SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=8, depths=(2, 1), num_heads=(1, 2),
                            num_classes=5)
    points = _cuts_are_exact(model, (3, 32, 32))
    assert len(points) == 3 and all(p.layout == "channels_last" for p in points)
    assert [p.tensors[0][1] for p in points] == [(16, 16, 8), (16, 16, 8), (8, 8, 16)]


def test_mixer_and_resmlp_are_cut_after_every_block():
    torch.manual_seed(0)
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    mixer = MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=16)
    resmlp = MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=16, block_layer=ResBlock,
                      mlp_ratio=4, norm_layer=Affine)
    for model in (mixer, resmlp):
        points = _cuts_are_exact(model, (3, 32, 32))
        assert [p.name for p in points] == ["blocks.0", "blocks.1"] and {p.layout for p in points} == {"tokens"}


def test_torchvision_vit_is_cut_after_every_encoder_block():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                 hidden_dim=16, mlp_dim=32, num_classes=5)
    points = _cuts_are_exact(model, (3, 32, 32))
    assert [p.name for p in points] == ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]


@pytest.mark.parametrize("v2", [False, True])
def test_torchvision_swin_is_cut_after_every_block_though_its_groups_read_the_stream_as_dim_1(v2):
    """torchvision's Swin adds channels-last maps whose locked channel groups say dim 1: the
    LayerNorms that read the stream (V1, pre-norm) or feed it (V2, post-norm) tell it is
    channels-last, so no add is taken for a channels-first block end (the attention's add inside a
    block included); V2's position bias MLP (a ReLU on a table of parameters) is no cut point."""
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models import swin_transformer as swin

    torch.manual_seed(0)
    kind = dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2) if v2 else {}
    model = torchvision.models.SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[2, 1], num_heads=[1, 2],
                                               window_size=[4, 4], num_classes=5, **kind)
    points = _cuts_are_exact(model, (3, 32, 32))
    assert [p.name for p in points] == ["features.1.0", "features.1.1", "features.3.0"]
    assert {p.layout for p in points} == {"channels_last"}


class _Stage(torch.nn.Module):
    """PiT's and CoaT's pattern: a stage reads ``B, C, H, W`` off its input, runs token blocks,
    and reshapes back with those sizes; ``B * 2`` rebuilds a batch multiple."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(_MlpBlock() for _ in range(2)))

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.blocks(x.flatten(2).transpose(1, 2))
        pair = t.reshape(b * 2, h * w // 2, c)  # two half-sequences per sample
        return pair.reshape(b, h * w, c).transpose(1, 2).reshape(b, c, h, w)


class _MlpBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(6), torch.nn.Linear(6, 6)

    def forward(self, t):
        return t + self.fc(self.norm(t))


def test_sizes_read_from_shapes_before_a_cut_are_rebuilt_after_it_not_sent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), _Stage(), torch.nn.Flatten(),
                                torch.nn.Linear(6 * 8 * 8, 5))
    points = _cuts_are_exact(model, (3, 8, 8))  # batch 2, the trace's 1: B is read off the split tensor
    assert [p.name for p in points] == ["1.blocks.0", "1.blocks.1"]
    assert all(len(p.tensors) == 1 for p in points)  # the ints do not cross
    from nestflex.exits import MultiExitNetwork

    net = MultiExitNetwork(model, positions=("1.blocks.0",), input_shape=(3, 8, 8)).eval()
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(net(x)[-1], model(x))


def test_a_position_embedding_add_is_not_a_residual_and_channels_first_adds_are_left_alone():
    graph = trace(TinyViT().eval())
    ends = {n.name for n in stream_ends(graph.gm)}
    first_add = next(n for n in graph.gm.graph.nodes if n.op == "call_function" and "add" in n.name)
    assert first_add.name not in ends  # patches + learned position embedding
    from nestflex.models import create_model

    assert stream_ends(trace(create_model("resnet20", width=0.25)).gm) == set()
    assert {p.layout for p in trace(create_model("resnet20", width=0.25)).cut_points} == {"channels_first"}
