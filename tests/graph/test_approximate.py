"""Pruning that stays exact where it can (issue 40 item 3): weight-standardised convs prune their
outputs exactly, ConvNeXt-V2's GRN and LayerNorm2d and the LayerNorm-normalised residual streams of
ViTs and ConvNeXts prune only with ``approximate=True``, which says what changes."""

import pytest
import torch
from timm.layers import ScaledStdConv2d
from timm.models.convnext import ConvNeXt
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from nestflex import GraphError
from nestflex.graph import prune_channels, trace


def _prune_vs_masked(model: nn.Module, graph, keep_share: float = 0.7, seed: int = 0):
    """Prune every prunable group of ``graph`` to ``keep_share`` (random channels) in float64; the
    masked model's output (every consumer of a dropped channel ignores it), the pruned one's, and
    the MACs ``graph`` predicted."""
    gen = torch.Generator().manual_seed(seed)
    keep = {g.id: torch.randperm(g.width, generator=gen)[: max(1, round(g.width * keep_share))]
            for g in graph.prunable_groups}
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    model = model.double().eval()
    x = torch.randn(2, *graph.input_shape, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        for g in graph.prunable_groups:
            drop = torch.ones(g.width, dtype=torch.bool)
            drop[keep[g.id]] = False
            rows = drop.nonzero().flatten()
            for m in g.members:
                if m.role == "in":
                    getattr(model.get_submodule(m.module), m.attr).index_fill_(m.dim, m.rows(g, rows, others=False), 0)
        masked = model(x)
        for g in graph.prunable_groups:
            prune_channels(model, g, keep[g.id])
        pruned = model(x)
    return masked, pruned, predicted


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=5).eval()


def _convnext(grn: bool) -> nn.Module:
    torch.manual_seed(0)
    model = ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 16, 16), use_grn=grn, ls_init_value=None if grn else 0.5,
                     num_classes=3, drop_path_rate=0.0).eval()
    if grn:  # timm starts GRN's weight at zero, where it is the identity: make it count
        for m in model.modules():
            if type(m).__name__ == "GlobalResponseNorm":
                nn.init.normal_(m.weight)
    return model


def test_vit_stream_is_locked_by_default_and_says_how_to_prune_it():
    graph = trace(_vit(), (3, 32, 32))
    stream = graph.group("patch_embed.proj")
    assert not stream.prunable and "`blocks.0.norm1` (LayerNorm) normalises over the channels" in stream.reason
    assert "approximate=True" in stream.reason
    # what does prune exactly (MLP hidden channels, heads) is exact
    assert graph.prunable_groups and all(g.exact for g in graph.prunable_groups)
    masked, pruned, predicted = _prune_vs_masked(_vit(), graph)
    assert torch.allclose(pruned, masked, rtol=0, atol=1e-10)


def test_vit_stream_prunes_with_approximate_and_reports_the_change():
    model = _vit()
    exact = trace(model, (3, 32, 32))
    graph = trace(model, (3, 32, 32), approximate=True)
    stream = graph.group("patch_embed.proj")
    assert stream.prunable and not stream.exact
    assert stream.approximation.startswith("`blocks.0.norm1` (LayerNorm) normalises over the channels")
    assert "(and 4 more such layers)" in stream.approximation  # norm2 of block 0, both of block 1, the final norm
    owned = {(m.module, m.attr, m.role) for m in stream.members}
    assert {("", "cls_token", "param"), ("", "pos_embed", "param"), ("norm", "weight", "norm"),
            ("blocks.1.attn.qkv", "weight", "in"), ("head", "weight", "in")} <= owned
    # the groups that were exact stay exact, with the same widths
    assert {g.name for g in exact.prunable_groups} == {g.name for g in graph.prunable_groups if g.exact}
    masked, pruned, predicted = _prune_vs_masked(model, graph)
    change = ((pruned - masked).norm() / masked.norm()).item()
    assert 1e-6 < change < 1, change  # the LayerNorms' statistics changed; the model is no longer the masked one
    assert model.norm.normalized_shape == (17,) and model.cls_token.shape == (1, 1, 17)
    assert trace(model.float(), (3, 32, 32), approximate=True).macs() == predicted < 0.6 * graph.macs()


def test_weight_standardised_conv_prunes_its_outputs_exactly_and_locks_its_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(ScaledStdConv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 6, 3), nn.ReLU(),
                          ScaledStdConv2d(6, 5, 3), nn.ReLU(), nn.Conv2d(5, 4, 3)).eval()
    graph = trace(model, (3, 16, 16))
    # conv 0's outputs feed a plain conv: per-output standardisation, the `gain` follows
    first = graph.group("0")
    assert first.prunable and first.exact and ("0", "gain", 0) in {(m.module, m.attr, m.dim) for m in first.members}
    # conv 2's outputs feed the standardised conv 4: locked, and the reason says which conv and why
    second = graph.group("2")
    assert not second.prunable
    assert second.reason.startswith("`4` (ScaledStdConv2d) standardises its weight over its inputs")
    masked, pruned, _ = _prune_vs_masked(model, graph)
    assert model[0].gain.shape == (6, 1, 1, 1) and torch.allclose(pruned, masked, rtol=0, atol=1e-10)

    relaxed = trace(model.float(), (3, 16, 16), approximate=True).group("2")
    assert relaxed.prunable and relaxed.approximation == second.reason.split(" (pruned would")[0]


def test_convnext_v2_grn_channels_prune_only_with_approximate():
    graph = trace(_convnext(grn=True), (3, 64, 64))
    hidden = graph.group("stages.0.blocks.0.mlp.fc1")
    assert not hidden.prunable and "(GlobalResponseNorm) normalises over the channels" in hidden.reason
    assert not graph.prunable_groups  # stem/downsample LayerNorm2d lock the streams, GRN the hidden channels

    model = _convnext(grn=True)
    graph = trace(model, (3, 64, 64), approximate=True)
    hidden = graph.group("stages.0.blocks.0.mlp.fc1")
    assert hidden.prunable and {("stages.0.blocks.0.mlp.grn", a) for a in ("weight", "bias")} <= {
        (m.module, m.attr) for m in hidden.members}
    assert "`stem.1` (LayerNorm2d)" in graph.group("stem.0").approximation
    masked, pruned, predicted = _prune_vs_masked(model, graph)
    assert model.stages[0].blocks[0].mlp.grn.weight.shape == (22,)  # 32 hidden channels, 70% kept
    assert model.stem[1].normalized_shape == (6,) and 1e-6 < ((pruned - masked).norm() / masked.norm()).item()
    assert trace(model.float(), (3, 64, 64), approximate=True).macs() == predicted


def test_convnext_layer_scale_follows_the_stream():
    model = _convnext(grn=False)
    exact = trace(model, (3, 64, 64))
    assert [g.name for g in exact.prunable_groups] == [f"stages.{i}.blocks.0.mlp.fc1" for i in range(4)]
    masked, pruned, _ = _prune_vs_masked(_convnext(grn=False), exact)
    assert torch.allclose(pruned, masked, rtol=0, atol=1e-10)

    graph = trace(model, (3, 64, 64), approximate=True)
    stream = graph.group("stem.0")
    assert ("stages.0.blocks.0", "gamma", 0, "param") in {(m.module, m.attr, m.dim, m.role) for m in stream.members}
    _prune_vs_masked(model, graph)
    assert model.stages[0].blocks[0].gamma.shape == (6,)


def test_approximate_must_be_a_bool():
    with pytest.raises(GraphError, match=r"`approximate` must be True or False, got 'yes'"):
        trace(_vit(), (3, 32, 32), approximate="yes")


class _Tokens(nn.Module):
    """Tokens through a LayerNorm; with ``reads_width`` the forward splits the next layer's channels
    by the normalised channels' width (``C // 2``, as CoaT sizes its heads by its stream's), which
    would go stale once approximate pruning shrinks them."""

    def __init__(self, reads_width: bool) -> None:
        super().__init__()
        self.reads_width = reads_width
        self.proj, self.norm, self.fc, self.head = nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        x = self.proj(x)
        b, n, c = x.shape
        y = self.fc(self.norm(x))
        if self.reads_width:
            y = y.reshape(b, n, 2, c // 2).flatten(2)
        return self.head(y.mean(1))


@pytest.mark.parametrize("reads_width", [False, True])
def test_a_stream_whose_width_sizes_other_channels_stays_locked(reads_width):
    stream = trace(_Tokens(reads_width).eval(), (4, 8), approximate=True).group("proj")
    assert stream.prunable != reads_width
    if reads_width:
        assert "their width, read at `getitem_2`, sizes other channels at `floordiv`" in stream.reason
