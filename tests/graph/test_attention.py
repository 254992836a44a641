"""Attention heads as a unit (issue 21, item 2): qkv -> heads -> q @ k.T / fused attention ->
merged heads -> proj, pruned head by head."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nestflex.errors import CapacityError
from nestflex.graph import prune_channels, resize_like, trace
from nestflex.pruning.importance import WeightNorm
from tests.graph.test_concat import prune_like_masking


class _Attention(nn.Module):
    """timm's ``Attention`` in miniature: int ``num_heads``/``head_dim``/``attn_dim``, a ``proj``;
    ``fused`` picks ``scaled_dot_product_attention`` (scale read off the tensors) or the explicit
    ``q * scale @ k.T`` path, ``items`` indexing ``qkv[i]`` instead of ``unbind``."""

    def __init__(self, dim=16, num_heads=4, fused=True, items=False, bias=False, attn_dim_const=True):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.fused, self.items, self.attn_dim_const = fused, items, attn_dim_const
        self.qkv = nn.Linear(dim, 3 * self.attn_dim)
        self.proj = nn.Linear(self.attn_dim, dim)
        # a per-head bias (Swin's relative position bias): heads must stay as they are
        self.bias = nn.Parameter(torch.randn(num_heads, 25, 25)) if bias else None

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = (qkv[0], qkv[1], qkv[2]) if self.items else qkv.unbind(0)
        if self.fused:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            if self.bias is not None:
                attn = attn + self.bias
            x = attn.softmax(dim=-1) @ v
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim if self.attn_dim_const else -1)
        return self.proj(x)


class _Block(nn.Module):
    """Patches -> tokens -> a pre-norm attention with a residual -> a class-token read-out."""

    def __init__(self, **kw):
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 4, 4)
        self.norm = nn.LayerNorm(16)
        self.attn = _Attention(**kw)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)  # (N, 5 * 5, 16)
        t = t + self.attn(self.norm(t))
        return self.head(t[:, 0])


SHAPE = (3, 20, 20)


@pytest.mark.parametrize("kw", [{}, {"fused": False}, {"items": True}, {"attn_dim_const": False}],
                         ids=["fused", "explicit", "items", "merge_minus_one"])
def test_heads_form_a_group_and_pruned_equals_masked(kw):
    torch.manual_seed(0)
    model = _Block(**kw).eval()
    graph = trace(model, SHAPE)
    (heads,) = graph.prunable_groups
    assert heads.name == "attn.qkv" and heads.width == 4 and heads.copies == 1
    roles = {(m.module, m.attr): (m.role, m.factor, m.copies) for m in heads.members}
    assert roles[("attn.qkv", "weight")] == ("out", 4, 3)  # a head: 4 rows in each of q, k, v
    assert roles[("attn.proj", "weight")] == ("in", 4, 1)
    assert roles[("attn", "num_heads")] == ("count", 1, 1)
    assert (("attn", "attn_dim") in roles) == kw.get("attn_dim_const", True)
    # q @ k.T and attn @ v: 4 heads x 25 x 25 x 4 each, fused or not (torch counts no CPU fused kernel)
    assert sum(graph.op_macs.values()) == 2 * 4 * 25 * 25 * 4
    keep = {heads.id: torch.tensor([0, 3])}
    predicted = graph.macs({heads.id: 2})
    x = torch.randn(3, *SHAPE, dtype=torch.float64)
    prune_like_masking(model.double(), graph, keep, x)
    assert model.attn.num_heads == 2 and model.attn.qkv.out_features == 24 and model.attn.proj.in_features == 8
    if kw.get("attn_dim_const", True):
        assert model.attn.attn_dim == 8
    # the products over heads (q @ k.T, attn @ v or the fused op) shrink with them
    assert graph.op_groups and trace(model.float(), SHAPE).macs() == predicted < graph.macs()


def test_a_per_head_bias_locks_the_heads():
    graph = trace(_Block(fused=False, bias=True), SHAPE)
    assert not graph.prunable_groups
    assert graph.group("attn.qkv").reason == "used by `add`"  # attn + bias: the bias is indexed by head


def _no_head_dim_forward(self, x):
    B, N, C = x.shape
    q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, 4).permute(2, 0, 3, 1, 4).unbind(0)
    return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, -1))


def test_an_attention_without_timms_attributes_says_what_it_needs():
    model = _Block()
    model.attn.head_dim = None  # the forward reads only num_heads; pruning would leave head_dim stale
    model.attn.forward = _no_head_dim_forward.__get__(model.attn)
    graph = trace(model, SHAPE)
    reason = graph.group("attn.qkv").reason
    assert "`num_heads` and `head_dim` and a `proj` Linear" in reason and "`attn`" in reason


def test_weight_norm_scores_whole_heads():
    model = _Block().eval()
    graph = trace(model, SHAPE)
    heads = graph.group("attn.qkv")
    with torch.no_grad():
        model.attn.qkv.weight[4:8] = 0  # head 1's q rows
        model.attn.qkv.weight[16 + 4:16 + 8] = 0  # its k rows
        model.attn.qkv.weight[32 + 4:32 + 8] = 0  # its v rows
    scores = WeightNorm(1).scores(model, graph)[heads.id]
    assert scores.shape == (4,) and scores[1] == 0 and (scores[[0, 2, 3]] > 0).all()


def test_resize_like_restores_the_head_count_from_a_pruned_checkpoint():
    torch.manual_seed(0)
    pruned = _Block().eval()
    graph = trace(pruned, SHAPE)
    prune_channels(pruned, graph.group("attn.qkv"), [1, 2, 3])
    fresh = _Block().eval()
    resize_like(fresh, pruned.state_dict())
    fresh.load_state_dict(pruned.state_dict())
    assert fresh.attn.num_heads == 3 and fresh.attn.attn_dim == 12
    x = torch.randn(2, *SHAPE)
    torch.testing.assert_close(fresh(x), pruned(x))


def test_nested_levels_refuse_pruned_heads():
    from nestflex.capacity.levels import LevelPlan
    from nestflex.capacity.nested import Source, nest_

    net = _Block()
    plan = LevelPlan((1, 0), {"attn.qkv": list(range(4))}, ({"attn.qkv": 2}, {"attn.qkv": 4}), (1, 2))
    own = Source(net.state_dict())
    with pytest.raises(CapacityError, match="'attn.qkv' is interleaved .*q, k, v of attention heads"):
        nest_(net, plan, [own, own], input_shape=SHAPE)


def test_timm_vit_prunes_heads_and_mlp_exactly():
    import timm  # the train extra (in dev) installs it: missing is a broken install, not a skip
    from tests.graph.test_concat import _masked_output

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=8,
                              depth=2).eval()
    graph = trace(model, (3, 32, 32))
    heads = [g for g in graph.prunable_groups if g.name.endswith("attn.qkv")]
    assert len(heads) == 2 and all(g.width == 3 for g in heads)
    keep = {g.id: torch.randperm(g.width)[: max(1, round(g.width * 0.7))] for g in graph.prunable_groups}
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    model = model.double()
    with torch.no_grad():
        masked = _masked_output(model, graph, keep, x)
        for g in graph.prunable_groups:
            prune_channels(model, g, keep[g.id])
        torch.testing.assert_close(model(x), masked, atol=1e-10, rtol=0)
    assert model.blocks[0].attn.num_heads == 2
    assert trace(model.float(), (3, 32, 32)).macs() == predicted
