import copy

import pytest
import torch
from torch import nn

from nestflex import GraphError
from nestflex.graph import cut_model, permute_channels, prune_channels, select_channels, slice_channels, trace
from nestflex.models import create_model
from tests.conftest import settle_batchnorm

ACCEPTANCE_MODELS = ["vgg16", "resnet56", "timm:resnet18", "timm:mobilenetv2_100"]


@pytest.mark.parametrize("name, reference", [("vgg16", 3.13e8), ("resnet56", 1.25e8)])
def test_macs_match_li_et_al(name, reference):
    macs = trace(create_model(name)).macs()
    assert abs(macs - reference) / reference < 0.02, macs


@pytest.mark.parametrize("name", ACCEPTANCE_MODELS)
def test_param_count_matches_model(name):
    model = create_model(name)
    assert trace(model).params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ACCEPTANCE_MODELS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_random_permutation_of_every_group_keeps_outputs(name, dtype):
    model = settle_batchnorm(create_model(name)).to(dtype)
    x = torch.randn(4, 3, 32, 32, dtype=dtype)
    with torch.no_grad():
        before = model(x)
        graph = trace(model)
        assert graph.prunable_groups, "nothing to permute"
        for group in graph.prunable_groups:
            permute_channels(model, group, torch.randperm(group.width))
        after = model(x)
    # float64: the logic alone, at the acceptance tolerance; float32: summation order changes
    # rounding, so the bound is relative to the logits' scale
    atol = 1e-5 if dtype == torch.float64 else 1e-5 * before.abs().max().item()
    torch.testing.assert_close(after, before, atol=atol, rtol=0)


@pytest.mark.parametrize("name", ACCEPTANCE_MODELS)
def test_pruning_half_of_every_group_gives_the_predicted_macs(name):
    model = create_model(name).eval()
    graph = trace(model)
    widths = {g.id: max(1, g.width // 2) for g in graph.prunable_groups}
    predicted_macs, predicted_params = graph.macs(widths), graph.params(widths)
    for group in graph.prunable_groups:
        prune_channels(model, group, torch.randperm(group.width)[: widths[group.id]])
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    smaller = trace(model)
    assert smaller.macs() == predicted_macs < graph.macs() * 0.5
    assert smaller.params() == predicted_params == sum(p.numel() for p in model.parameters())
    assert [g.id for g in smaller.groups] == [g.id for g in graph.groups]  # ids survive surgery
    assert smaller.widths() == {**graph.widths(), **widths}


@pytest.mark.parametrize("name", ["vgg11", "resnet20"])
def test_physically_pruned_equals_masked(name):
    # DESIGN invariant 2: zeroing a channel's BN affine makes it contribute exactly nothing,
    # which is what removing it does
    model = settle_batchnorm(create_model(name, width=0.5))
    graph = trace(model)
    x = torch.randn(4, 3, 32, 32)
    keep = {g.id: torch.randperm(g.width)[: max(1, g.width * 2 // 3)] for g in graph.prunable_groups}
    with torch.no_grad():
        for group in graph.prunable_groups:
            drop = torch.ones(group.width, dtype=torch.bool)
            drop[keep[group.id]] = False
            for m in group.members:
                if m.role == "norm" and m.attr in ("weight", "bias"):
                    getattr(model.get_submodule(m.module), m.attr)[drop] = 0
        masked = model(x)
        for group in graph.prunable_groups:
            prune_channels(model, group, keep[group.id])
        pruned = model(x)
    torch.testing.assert_close(pruned, masked, atol=1e-5, rtol=0)


def test_resnet_groups_tie_residual_adds():
    graph = trace(create_model("resnet56"))
    stem = graph.group("conv1")
    expected = {"conv1"} | {f"layer1.{i}.conv2" for i in range(9)}
    assert set(stem.producers) == expected
    stage2 = graph.group("layer2.0.conv2")
    assert "layer2.0.shortcut.0" in stage2.producers and "layer2.8.conv2" in stage2.producers
    # each block's inner channels are their own group
    assert graph.group("layer2.3.conv1").producers == ["layer2.3.conv1"]
    assert not graph.group("fc").prunable and "model output" in graph.group("fc").reason


def test_depthwise_conv_joins_its_input_group():
    graph = trace(create_model("timm:mobilenetv2_100"))
    group = graph.group("blocks.1.0.conv_pw")
    roles = {(m.module, m.role) for m in group.members}
    assert ("blocks.1.0.conv_dw", "depthwise") in roles and ("blocks.1.0.conv_pwl", "in") in roles


class _ScaledByParams(nn.Module):
    """A learned 0-d scale and a per-channel (C, 1, 1) gain on the same activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 4)
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.gain = nn.Parameter(torch.ones(8, 1, 1))

    def forward(self, x):
        y = torch.relu(self.conv(x)) * self.scale
        return self.fc((y * self.gain).mean((2, 3)))


def test_zero_dim_scale_passes_and_per_channel_gain_prunes_with_the_group():
    model = _ScaledByParams().double().eval()
    g = trace(model, input_shape=(3, 16, 16))
    group = g.group("conv")
    # the 0-d scale carries no channels; the (8, 1, 1) gain does: its dim 0 follows the channels
    assert "mul" in group.nodes and group.prunable and group.exact
    assert [(m.module, m.attr, m.dim, m.role) for m in group.members if m.role == "param"] == [("", "gain", 0, "param")]
    x, keep = torch.randn(2, 3, 16, 16, dtype=torch.float64), torch.tensor([0, 3, 4, 7])
    with torch.no_grad():
        model.fc.weight[:, [1, 2, 5, 6]] = 0  # masked: the classifier ignores the channels about to go
        want = model(x)
        prune_channels(model, group, keep)
        assert model.gain.shape == (4, 1, 1) and torch.allclose(model(x), want, rtol=0, atol=1e-12)


def test_flatten_of_spatial_map_maps_channels_to_feature_blocks():
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(), nn.Linear(6 * 64, 5))
    model.eval()
    graph = trace(model)
    group = graph.group("0")
    assert any(m.module == "4" and m.factor == 64 for m in group.members)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model[0].weight[[1, 4]] = 0
        model[0].bias[[1, 4]] = 0
        masked = model(x)
        prune_channels(model, group, [0, 2, 3, 5])
        torch.testing.assert_close(model(x), masked, atol=1e-6, rtol=0)
    assert model[4].in_features == 4 * 64


def test_resnet_cut_lists_the_skip_tensor_and_cuts_exactly():
    model = settle_batchnorm(create_model("resnet20"))
    graph = trace(model)
    point = graph.cut_point("layer2.1.relu1")
    names = [name for name, _ in point.tensors]
    assert names == ["layer2_0_relu2", "layer2_1_relu1"]  # the skip tensor crosses too
    assert point.numel == 2 * 32 * 16 * 16
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        full = model(x)
        for p in graph.cut_points:
            head, tail = cut_model(graph, p)
            assert torch.equal(tail(*head(x)), full), p.name
    fractions = [p.macs_fraction for p in graph.cut_points]
    assert fractions == sorted(fractions) and 0.99 < fractions[-1] < 1.0  # only fc remains


def test_the_names_before_issue_39_still_work():
    """graph/split.py became graph/cut.py, SplitPoint CutPoint, split_model cut_model (issue 39):
    the old names are the same objects, for code written against them."""
    import nestflex.graph as g
    from nestflex.graph.structure import SplitPoint

    assert g.split_model is g.cut_model and g.SplitPoint is g.CutPoint is SplitPoint
    graph = trace(create_model("vgg11", width=0.125))
    assert graph.split_points is graph.cut_points
    assert graph.split_point("features.relu2") is graph.cut_point("features.relu2")
    with pytest.raises(GraphError, match=r"no split point 'nope'; split points: features\.relu1"):
        graph.cut_point("nope")


def test_vgg_split_points_are_the_relus():
    graph = trace(create_model("vgg16"))
    first = graph.layers[0]
    assert (first.name, first.kind, first.out_shape, first.activations) == ("features.conv1", "conv", (64, 32, 32), 65536)
    assert first.macs == 64 * 3 * 9 * 32 * 32 and first.params == 64 * 3 * 9
    assert [p.name for p in graph.split_points][:2] == ["features.relu1", "features.relu2"]
    assert all(len(p.tensors) == 1 for p in graph.split_points)


def test_trace_leaves_model_state_alone():
    model = create_model("resnet20").train()
    stats = model.bn1.running_mean.clone()
    trace(model)
    assert model.training and torch.equal(model.bn1.running_mean, stats)


def test_surgery_errors_name_the_argument_and_values():
    model = create_model("vgg11", width=0.25)
    graph = trace(model)
    group = graph.group("features.conv1")
    with pytest.raises(GraphError, match=r"`keep` for group `features.conv1` must lie in \[0, 16\), got min 0, max 16"):
        prune_channels(model, group, [0, 16])
    with pytest.raises(GraphError, match="repeats channels"):
        prune_channels(model, group, [1, 1])
    with pytest.raises(GraphError, match="is empty"):
        prune_channels(model, group, [])
    with pytest.raises(GraphError, match="must have 16 entries, got 3"):
        permute_channels(model, group, [0, 1, 2])
    with pytest.raises(GraphError, match=r"`width` for group `features.conv1` must be an int in \[1, 16\], got 0"):
        slice_channels(model, group, 0)
    with pytest.raises(GraphError, match="`classifier.fc2` is locked \\(model output\\)"):
        select_channels(model, graph.group("classifier.fc2"), [0])
    with pytest.raises(GraphError, match="no channel group 'nope'; groups: features.conv1"):
        graph.group("nope")
    slice_channels(model, group, 8)
    with pytest.raises(GraphError, match="HINT: re-trace"):
        slice_channels(model, graph.group("features.conv1").__class__(**{**group.__dict__, "width": 16}), 4)


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace this
            return self.conv(x)
        return x


class _WithOpaqueBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.block = _DataDependent()
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.block(self.bn(self.stem(x))))


def test_untraceable_submodule_becomes_an_opaque_leaf():
    model = _WithOpaqueBlock()
    with pytest.warns(UserWarning, match=r"cannot trace `block` \(_DataDependent\)"):
        graph = trace(model)
    assert "block" in graph.opaque
    assert not graph.group("stem").prunable and "block" in graph.group("stem").reason
    assert graph.group("head.2").prunable  # the rest of the model is still analysed
    with pytest.raises(GraphError, match=r"cannot trace module `block` \(_DataDependent\).*strict=False"):
        trace(model, strict=True)


def test_untraceable_top_level_forward_names_the_model():
    with pytest.raises(GraphError, match="cannot trace the forward of `_DataDependent` itself"):
        trace(_DataDependent(), input_shape=(8, 4, 4))


def test_wrong_input_shape_is_explained():
    # the op and the layer it stopped at, then the cause and the fix
    with pytest.raises(GraphError, match=r"failed on an input of shape \(1, 1, 32, 32\) at `conv1` \(Conv2d\): "
                                         r"RuntimeError: .*input_shape"):
        trace(create_model("resnet20"), input_shape=(1, 32, 32))


def test_input_shape_of_explicit_then_the_models_own_then_the_default():
    from nestflex.graph import DEFAULT_INPUT_SHAPE, input_shape_of

    grey = create_model("resnet20", width=0.25, in_chans=1)
    assert input_shape_of(grey) == (1, 32, 32) and input_shape_of(grey, (1, 28, 28)) == (1, 28, 28)
    assert input_shape_of(nn.Linear(4, 2)) == DEFAULT_INPUT_SHAPE == (3, 32, 32)
    assert trace(grey).input_shape == (1, 32, 32) and trace(grey, (1, 28, 28)).input_shape == (1, 28, 28)
    with pytest.raises(GraphError, match=r"`input_shape` must be a sequence of positive integers \(C, H, W\), "
                                         r"got \(1, 0, 32\)"):
        input_shape_of(grey, (1, 0, 32))
    grey.input_shape = "32"
    with pytest.raises(GraphError, match=r"`CifarResNet.input_shape` must be a sequence of positive integers"):
        trace(grey)


def test_check_input_shape_and_checked_batches():
    from nestflex.graph import check_input_shape, checked_batches

    check_input_shape((1, 32, 32), (torch.zeros(2, 1, 32, 32), torch.zeros(2)), "x")  # a (x, y) batch
    batches = [(torch.zeros(2, 3, 32, 32), torch.zeros(2))] * 3
    match = (r"profile_levels traces the model at per-sample input_shape \(1, 32, 32\), but the data's samples are "
             r"\(3, 32, 32\)\. HINT: pass `input_shape=\(3, 32, 32\)` \(a DataModule's `input_shape`\)")
    with pytest.raises(GraphError, match=match):
        next(checked_batches(batches, (1, 32, 32), "profile_levels"))
    assert len(list(checked_batches(batches, (3, 32, 32), "ok"))) == 3


class _CachesInEval(nn.Module):
    """Caches a derived tensor in eval mode, as timm's LeViT and EfficientFormer do with
    `attention_bias_cache`: a symbolic trace stores a proxy there unless the tracer cleans up."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.ones(8))
        self.cache = {}

    def forward(self, x):
        if self.training:
            s = self.scale.view(1, -1, 1, 1)
        else:
            if "s" not in self.cache:
                self.cache["s"] = self.scale.view(1, -1, 1, 1)
            s = self.cache["s"]
        self.seen = True  # an attribute the forward adds
        return self.conv(x) * s


def test_tracing_twice_works_and_leaves_no_proxy_in_the_model():
    model = _CachesInEval().eval()
    cache = model.cache
    macs = [trace(model, (3, 8, 8)).macs() for _ in range(3)]  # the callbacks trace again and again
    assert macs == [3 * 8 * 9 * 64] * 3
    assert model.cache is cache  # the same dict, holding only what a real forward put there
    assert all(type(v) is torch.Tensor or isinstance(v, nn.Parameter) for v in model.cache.values())
    assert not any(isinstance(v, torch.fx.Proxy) for v in vars(model).values())
    torch.testing.assert_close(model(torch.ones(1, 3, 8, 8)), model.conv(torch.ones(1, 3, 8, 8)))


def test_weight_standardised_conv_prunes_its_outputs_with_its_gain_and_locks_its_inputs():
    from timm.layers import ScaledStdConv2d

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), ScaledStdConv2d(8, 16, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(16, 4, 1)).eval()
    with torch.no_grad():
        net[2].gain.uniform_(0.5, 1.5)
        net[2].bias.uniform_(-0.1, 0.1)
    graph = trace(net, (3, 8, 8))
    before = {g.name: g for g in graph.groups}
    assert "standardises its weight over its inputs" in before["0"].reason  # its inputs: locked
    (group,) = graph.prunable_groups
    assert {f"{m.module}.{m.attr}" for m in group.members} >= {"2.weight", "2.bias", "2.gain", "4.weight"}
    x = torch.randn(2, 3, 8, 8)
    keep = torch.tensor([0, 3, 5, 6, 9, 12, 13, 15])
    masked = torch.ones(16, dtype=torch.bool)
    masked[keep] = False
    reference = copy.deepcopy(net)
    with torch.no_grad():  # a removed channel of a standardised conv is zero when its gain and bias are
        reference[2].gain[masked] = 0
        reference[2].bias[masked] = 0
    prune_channels(net, group, keep)
    assert net[2].gain.shape[0] == 8
    torch.testing.assert_close(net(x), reference(x))


@pytest.mark.parametrize("training", [False, True])
def test_torchvision_stochastic_depth_keeps_the_channels_of_its_residual_branch(training):
    from torchvision import ops  # the dev extra installs it: missing is a broken install, not a skip

    class _Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.branch, self.head = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 2)

        def forward(self, x):
            x = self.stem(x)
            x = x + ops.stochastic_depth(self.branch(x), 0.2, "row", self.training)
            return self.head(x.mean((2, 3)))

    model = _Block().train(training)
    graph = trace(model, (3, 8, 8))
    # the residual group (stem + branch) is prunable in both modes; before, the fx-wrapped call locked it
    assert set(graph.group("stem").producers) == {"stem", "branch"} and graph.group("stem").prunable
    prune_channels(model, graph.group("stem"), [0, 2, 5])
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 2)


def test_split_points_after_any_block_activation_on_channels_first_maps():
    class _Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.b1, self.a1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU()
            self.c2, self.a2 = nn.Conv2d(8, 8, 3, padding=1), nn.Hardswish()
            self.se, self.gate = nn.Conv2d(8, 8, 1), nn.Sigmoid()
            self.mix = nn.Linear(8, 8)  # on channels-last
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            x = self.a1(self.b1(self.c1(x)))
            x = self.a2(self.c2(x))
            s = torch.nn.functional.silu(self.se(x.mean((2, 3), keepdim=True)))  # a pooled 1x1 squeeze
            x = x * self.gate(s)
            y = torch.nn.functional.gelu(self.mix(x.permute(0, 2, 3, 1)))  # (N, H, W, C)
            return self.head(y.mean((1, 2)))

    names = [s.name for s in trace(_Net(), (3, 8, 8)).split_points]
    assert names == ["a1", "a2"]  # not the squeeze's silu, the gate, or the channels-last gelu


def _flop_counter_macs(model, shape):
    from torch.utils.flop_counter import FlopCounterMode

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.eval()(torch.zeros(1, *shape))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.get_total_flops() // 2


class _Attention(nn.Module):
    """Conv stem, tokens, nn.MultiheadAttention, windows folded into dim 0, a functional linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.qkv = nn.Linear(16, 48)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        t = self.stem(x).flatten(2).transpose(1, 2)  # (N, 64, 16)
        t, _ = self.attn(t, t, t)
        w = t.reshape(-1, 16, 16)  # 4 windows of 16 tokens each, folded into the batch dim
        q, k, v = self.qkv(w).chunk(3, dim=-1)
        w = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return torch.nn.functional.linear(w.reshape(x.shape[0], -1, 16).mean(1), self.fc.weight, self.fc.bias)


def test_macs_count_attention_functional_linear_and_folded_windows_exactly():
    model = _Attention()
    graph = trace(model, input_shape=(3, 8, 8))
    assert graph.macs() == _flop_counter_macs(model, (3, 8, 8))
    # the linear on folded windows counts every window; attention and functional ops are op_macs
    assert next(layer for layer in graph.layers if layer.name == "qkv").macs == 64 * 16 * 48
    assert graph.op_macs["attn"] > 0 and graph.op_macs["linear"] == 16 * 10
    assert sum(1 for n in graph.op_macs if n.startswith("matmul")) == 2
    # split points count them too: the last point's MACs before are the whole model's but the head's
    assert graph.split_points == [] or graph.split_points[-1].macs_before <= graph.macs()


def test_opaque_modules_count_their_macs():
    model = _WithOpaqueBlock().eval()
    with torch.no_grad():
        model.bn.bias.fill_(1.0)  # a positive map: the block's data-dependent branch runs its conv
    with pytest.warns(UserWarning, match="cannot trace"):
        graph = trace(model)
    assert graph.op_macs == {"block": 8 * 8 * 9 * 32 * 32}
    assert graph.macs() == _flop_counter_macs(model, (3, 32, 32))
    # pruning predictions still follow the layers' widths; the opaque block's MACs stay fixed
    head = graph.group("head.2")
    assert graph.macs({head.id: 8}) == graph.macs() - 8 * 8 - 8 * 4


def test_a_residual_add_that_no_activation_follows_ends_a_block_and_cuts_exactly():
    class _Next(nn.Module):  # ConvNeXt-style blocks: no activation after the residual add
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.dw1, self.pw1 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1)
            self.dw2, self.pw2 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 1)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.pw1(torch.nn.functional.gelu(self.dw1(x)))
            x = torch.relu(x + self.pw2(self.dw2(x)))  # followed by a ReLU: that is the block's end
            return self.head(x.mean((2, 3)))

    model = _Next().eval()
    graph = trace(model, (3, 8, 8))
    assert [s.name for s in graph.split_points] == ["gelu", "add", "relu"]
    head, tail = cut_model(graph, "add")
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(tail(*head(x)), model(x))


class _Constants(nn.Module):
    """A forward that makes a tensor constant (Swin's and MaxViT's masks), slices by a size it
    computes (PiT's ``x[:, :tokens]``) and hands a parameter to a submodule (PiT's class token)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.token = nn.Parameter(torch.randn(1, 8, 1, 1))
        self.mix = _AddToken()

    def forward(self, x):
        y = self.conv(x) * torch.tensor([2.0])
        y = y[:, : self.token.shape[1] // 2]  # bounds from a size: not followed, so locked
        return self.mix(y, self.token[:, :4]).mean((2, 3))


class _AddToken(nn.Module):
    def forward(self, y, token):
        return y + token


def test_tensor_constants_computed_slices_and_parameter_inputs_trace_and_count():
    from nestflex.graph import flop_counter

    model = _Constants().eval()
    for _ in range(2):  # and again: nothing left behind in the model
        graph = trace(model, (3, 8, 8))
        assert not graph.prunable_groups and "slice through the channels" in graph.group("conv").reason
    assert not hasattr(model, "_tensor_constant0")
    with torch.no_grad(), flop_counter(model) as counter:
        model(torch.zeros(1, 3, 8, 8))
    assert counter.get_total_flops() == 2 * graph.macs() and model.token.requires_grad
