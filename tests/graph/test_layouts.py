"""Channels that are not dim 1: tokens (N, T, C), channels-last maps, windows (issue 21, item 2)."""

import pytest
import torch
from torch import nn

from nestflex.graph import permute_channels, trace
from tests.graph.test_concat import prune_like_masking


class _Tokens(nn.Module):
    """ViT in miniature: patches to tokens, a pre-norm MLP block with a residual, a class-token
    style read-out ``x[:, 0]``."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 4, 4)
        self.norm = nn.LayerNorm(8)
        self.fc1, self.act, self.fc2 = nn.Linear(8, 24), nn.GELU(), nn.Linear(24, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)  # (N, 4, 8)
        t = t + self.fc2(self.act(self.fc1(self.norm(t))))
        return self.head(t[:, 0])


class _ChannelsLast(nn.Module):
    """A ConvNeXt block: depthwise conv, channels-last LayerNorm + MLP, back to channels-first,
    a per-channel layer scale; then Swin-style windows folded into the batch through an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.norm = nn.LayerNorm(8)
        self.pw1, self.pw2 = nn.Linear(8, 32), nn.Linear(32, 8)
        self.scale = nn.Parameter(torch.full((8, 1, 1), 0.5))
        self.win1, self.win2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y)))).permute(0, 3, 1, 2)
        x = x + self.scale * y
        n, c, h, w = x.shape
        win = x.permute(0, 2, 3, 1).reshape(n, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, c)
        win = win + self.win2(torch.relu(self.win1(win)))  # (N * windows, 4, C)
        return self.head(win.reshape(n, -1, c).mean(1))


MODELS = {"tokens": (_Tokens, (3, 8, 8)), "channels_last": (_ChannelsLast, (3, 8, 8))}


def test_token_mlp_hidden_channels_form_a_group_and_layer_norm_locks_the_stream():
    graph = trace(_Tokens(), (3, 8, 8))
    assert [g.name for g in graph.prunable_groups] == ["fc1"]
    assert "`norm` (LayerNorm) normalises over the channels" in graph.group("patch").reason
    fc1 = graph.group("fc1")
    assert {(m.module, m.attr, m.dim) for m in fc1.members} == {("fc1", "weight", 0), ("fc1", "bias", 0),
                                                                 ("fc2", "weight", 1)}
    # the group's responses are token tensors: criteria find their channels on the last dim
    by_name = {n.name: n for n in graph.gm.graph.nodes}
    assert [by_name[n].meta["channel_dim"] for n in graph.response_nodes(fc1)] == [2]


def test_channels_last_blocks_and_folded_windows_form_groups():
    graph = trace(_ChannelsLast(), (3, 8, 8))
    assert {g.name for g in graph.prunable_groups} == {"pw1", "win1"}
    assert "normalises over the channels" in graph.group("stem").reason


@pytest.mark.parametrize("name", list(MODELS))
def test_pruning_token_and_channels_last_groups_equals_masking(name):
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    model = cls().eval().double()
    graph = trace(model, shape)
    x = torch.randn(3, *shape, dtype=torch.float64)
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width // 3)] for g in graph.prunable_groups}
    widths = {gid: len(k) for gid, k in keep.items()}
    predicted = graph.macs(widths), graph.params(widths)
    prune_like_masking(model, graph, keep, x)
    again = trace(model, shape)
    assert (again.macs(), again.params()) == predicted


@pytest.mark.parametrize("name", list(MODELS))
def test_permuting_token_and_channels_last_groups_keeps_the_function(name):
    torch.manual_seed(1)
    cls, shape = MODELS[name]
    model = cls().eval().double()
    x = torch.randn(2, *shape, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        graph = trace(model, shape)
        for g in graph.prunable_groups:
            permute_channels(model, g, torch.randperm(g.width))
        torch.testing.assert_close(model(x), before, atol=1e-10, rtol=0)


def test_a_reshape_to_another_tensors_channel_count_ties_the_two_and_a_constant_locks():
    class _Reshapes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 6)
            self.head_a, self.head_b, self.head_c = nn.Linear(6, 3), nn.Linear(6, 3), nn.Linear(6, 3)

        def forward(self, x):  # (N, 4, 4)
            a, b, c = self.a(x), self.b(x), self.c(x)
            n, t, ch = a.shape
            b = b.reshape(n, t, ch)  # b's channels must stay as many as a's
            c = c.reshape(n, t, 6)  # a constant: pruning c would break it
            return (self.head_a(torch.relu(a)) + self.head_b(torch.relu(b)) + self.head_c(torch.relu(c))).mean(1)

    torch.manual_seed(0)
    model = _Reshapes().eval().double()
    graph = trace(model, (4, 4))
    tied = graph.group("a")
    assert tied.prunable and set(tied.producers) == {"a", "b"}
    assert not graph.group("c").prunable and "reshape" in graph.group("c").reason
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    keep = {tied.id: torch.tensor([0, 2, 5])}
    prune_like_masking(model, graph, keep, x)


def test_a_mean_over_the_channels_of_a_token_tensor_locks_them():
    class _MeanOverChannels(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x):  # (N, 4, 4): tokens and channels of one size
            return self.fc2(torch.relu(self.fc1(x)).mean(-1))  # the mean removes the channels

    graph = trace(_MeanOverChannels(), (4, 4))
    assert not graph.group("fc1").prunable


def test_trr_ranks_the_hidden_channels_of_a_token_mlp():
    from torch.utils.data import TensorDataset

    from nestflex.pruning.importance import get_importance

    torch.manual_seed(0)
    model = _Tokens().eval()
    graph = trace(model, (3, 8, 8))
    data = TensorDataset(torch.randn(60, 3, 8, 8), torch.arange(60) % 3)
    scores = get_importance("trr", triplets=20).scores(model, graph, data=data)
    fc1 = graph.group("fc1")
    assert scores[fc1.id].shape == (24,) and scores[fc1.id].abs().sum() > 0


def test_torchvision_vit_prunes_its_mlp_hidden_channels():
    import torchvision  # the dev extra installs it: missing is a broken install, not a skip
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2,
                                                 hidden_dim=8, mlp_dim=16, num_classes=3).eval().double()
    graph = trace(model, (3, 16, 16))
    assert len(graph.prunable_groups) == 2  # each encoder layer's MLP hidden channels
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    keep = {g.id: torch.randperm(g.width)[:5] for g in graph.prunable_groups}
    prune_like_masking(model, graph, keep, x)


class _SelectiveKernel(nn.Module):
    """timm's SelectiveKernel in miniature: two paths stacked on a new dim 1, an attention whose
    last conv writes one block of channels per path (``view(B, 2, C // 2, 1, 1)``), softmax over
    the paths, a weighted sum with ``torch.sum``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.paths = nn.ModuleList([nn.Conv2d(8, 6, 3, padding=1), nn.Conv2d(8, 6, 3, padding=2, dilation=2)])
        self.fc_reduce, self.fc_select = nn.Conv2d(6, 4, 1), nn.Conv2d(4, 12, 1)
        self.out = nn.Conv2d(6, 5, 1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.stack([torch.relu(p(x)) for p in self.paths], dim=1)  # (N, 2, 6, H, W)
        a = self.fc_select(torch.relu(self.fc_reduce(x.sum(1).mean((2, 3), keepdim=True))))
        B, C, H, W = a.shape
        a = torch.softmax(a.view(B, 2, C // 2, H, W), dim=1)
        return self.out(torch.sum(x * a, dim=1)).mean((2, 3))


def test_stacked_paths_and_per_path_blocks_form_one_group():
    torch.manual_seed(0)
    model = _SelectiveKernel().eval()
    graph = trace(model, (3, 8, 8))
    paths = graph.group("paths.0")
    assert paths.prunable and paths.width == 6 and set(paths.producers) >= {"paths.0", "paths.1", "fc_select"}
    select = next(m for m in paths.members if m.module == "fc_select" and m.attr == "weight")
    assert select.copies == 2  # channel j is row j of both paths' blocks
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width // 2)] for g in graph.prunable_groups}
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    prune_like_masking(model.double(), graph, keep, x)
    assert model.fc_select.out_channels == 2 * 3 and trace(model.float(), (3, 8, 8)).macs() == predicted


def test_a_block_width_stated_as_a_constant_locks_the_layer():
    class _Fixed(_SelectiveKernel):
        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = torch.stack([torch.relu(p(x)) for p in self.paths], dim=1)
            a = self.fc_select(torch.relu(self.fc_reduce(x.sum(1).mean((2, 3), keepdim=True))))
            a = torch.softmax(a.view(a.shape[0], 2, 6, 1, 1), dim=1)  # 6 would not follow pruning
            return self.out(torch.sum(x * a, dim=1)).mean((2, 3))

    graph = trace(_Fixed(), (3, 8, 8))
    assert not graph.group("paths.0").prunable and not graph.group("fc_select").prunable
