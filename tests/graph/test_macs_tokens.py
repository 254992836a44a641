"""MACs of token-layout models equal the flop counter at the shape the model runs (issue 40 item 4):
MobileViT (convs, then attention over unfolded patches) and ViT, at several input sizes, before and
after pruning (heads, MLP hidden channels and, with ``approximate=True``, the residual stream)."""

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from nestflex.graph import flop_counter, prune_channels, trace


def _counted(model: torch.nn.Module, shape: tuple[int, ...]) -> int:
    """MACs of one forward as ``torch.utils.flop_counter`` counts them (FLOPs / 2), as the zoo
    benchmark compares; nn.MultiheadAttention's fused fast path is off so the counter sees it."""
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with flop_counter(model) as counter, torch.no_grad():
            model(torch.randn(1, *shape))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.get_total_flops() // 2


@pytest.mark.filterwarnings("ignore:torch.fx cannot trace")  # MobileViT's blocks are opaque: the counter sees them
@pytest.mark.parametrize("size", [64, 96])
def test_mobilevit_macs_equal_the_flop_counter(size):
    torch.manual_seed(0)
    model = timm.create_model("mobilevit_xxs", pretrained=False, num_classes=10).eval()
    assert trace(model, (3, size, size)).macs() == _counted(model, (3, size, size))


@pytest.mark.parametrize("size", [32, 48])
@pytest.mark.parametrize("approximate", [False, True])
def test_vit_macs_equal_the_flop_counter_before_and_after_pruning(size, approximate):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=size, patch_size=8, embed_dim=48, depth=2, num_heads=4, num_classes=5).eval()
    shape = (3, size, size)
    graph = trace(model, shape, approximate=approximate)
    assert graph.macs() == _counted(model, shape)
    keep = {g.id: torch.arange(0, g.width, 2) for g in graph.prunable_groups}  # every other channel, head
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    for g in graph.prunable_groups:
        prune_channels(model, g, keep[g.id])
    assert predicted == _counted(model, shape) == trace(model, shape, approximate=approximate).macs()
    assert model.blocks[0].attn.num_heads == 2 and (model.cls_token.shape[-1] == 24) == approximate
