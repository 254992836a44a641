"""Programs as ONNX graphs (nestflex.deploy.onnxgraph): onnxruntime against the torch eager interpreter.

Every level, every cut stage at every split point, every exit stage and head of real bundles
(nested VGG-11 and ResNet-20, SDN and FlexDNN exits, shared and own backbones) at batch 1 and 3;
each op alone against torch.nn.functional, pool edge cases included; the protobuf writer against
the onnx package; and the import closure (no torch, no onnx).
"""

from __future__ import annotations

import importlib
import itertools
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file

import nestflex.deploy as nd
from nestflex.deploy.onnxgraph import (
    SUPPORTED_OPS,
    OnnxGraphError,
    infer_shapes,
    program_to_onnx,
    stages_to_onnx,
)
from nestflex.deploy.onnxgraph import _proto as P
from nestflex.errors import NestflexError
from tests.export.bundles import LEVELS, write_flex_bundle

SRC = Path(__file__).resolve().parents[2] / "src"


def _deploy(symbol: str):
    """``symbol`` from the deploy package, wherever the tree defines it now (its modules are moving)."""
    for module in ("nestflex.deploy.runtime", "nestflex.deploy.bundle.schema", "nestflex.deploy.bundle.program",
                   "nestflex.deploy.bundle.schema", "nestflex.deploy.backends.eager"):
        try:
            return getattr(importlib.import_module(module), symbol)
        except (ImportError, AttributeError):
            continue
    pattern = re.compile(rf"^(?:def|class) {symbol}\b|^{symbol}\s*(?::[^=]*)?=", re.MULTILINE)
    for path in sorted(SRC.rglob("*.py")):
        if pattern.search(path.read_text()):
            return getattr(importlib.import_module(".".join(path.relative_to(SRC).with_suffix("").parts)), symbol)
    raise LookupError(f"{symbol} is defined nowhere under {SRC}")


run_program, cut_program = _deploy("run_program"), _deploy("cut_program")
INPUT = {"x": (None, 3, 32, 32)}


# --------------------------------------------------------------------------------------------
# helpers


def _session(model: bytes) -> ort.InferenceSession:
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1  # 2 shared cores
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _run(model: bytes, feed: dict[str, torch.Tensor]) -> list[np.ndarray]:
    return _session(model).run(None, {k: v.numpy() for k, v in feed.items()})


def _close(got: np.ndarray, want: torch.Tensor, where: str) -> None:
    """Within 1e-5, plus 1e-5 of the value: ResNet's activations reach ~11 before its last block,
    where float32 summed in another order (onnxruntime's conv against torch's, even with every
    graph optimisation off) differs by up to ~1.3e-5; logits and op outputs stay within 1e-5."""
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), want, atol=1e-5, rtol=1e-5,
                               msg=lambda m: f"{where}: {m}")


def _level_arrays(bundle, level: int) -> dict[str, np.ndarray]:
    """The capacity program's tensors cut to ``level``'s regions, as a runtime pages them."""
    full = load_file(str(bundle.weights_path))
    cap = bundle.spec.capacity
    out = {}
    for name in cap.program.tensor_names():
        region = cap.region(name, level, full[name].shape)
        if region is not None:
            out[name] = np.ascontiguousarray(full[name][tuple(slice(0, s) for s in region)])
    return out


def _all_arrays(bundle) -> dict[str, np.ndarray]:
    return load_file(str(bundle.weights_path))


def _torch(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def _x(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _eager(nodes, arrays, level, n: int) -> dict[str, torch.Tensor]:
    """Every value of the whole program run eagerly on a batch of ``n``: each stage's reference
    (a cut changes no number, so a stage's eager outputs are these values)."""
    env = {"x": _x(n, seed=level)}
    env["output"] = run_program(nodes, env, _torch(arrays), level)
    return env


def _check_stages(nodes, cuts, arrays, level, where, envs=None) -> int:
    """ONNX stages of ``nodes`` cut at ``cuts``, each fed the eager values of its inputs and
    checked against the eager values of its outputs, batch 1 and 3; the number of stages."""
    stages = cut_program(nodes, cuts)
    sessions = [_session(m) for m in stages_to_onnx(stages, arrays, INPUT, level=level)]
    for n in (1, 3):
        env = envs[n] if envs else _eager(nodes, arrays, level, n)
        for k, ((ins, _, outs), session) in enumerate(zip(stages, sessions)):
            got = session.run(None, {i: env[i].numpy() for i in ins})
            assert len(got) == len(outs or ["output"]), f"{where} stage {k}"
            for o, g in zip(outs or ["output"], got):
                _close(g, env[o], f"{where}, stage {k}, output {o!r}, batch {n}")
    return len(sessions)


# --------------------------------------------------------------------------------------------
# bundles


@pytest.fixture(scope="module")
def vgg(tmp_path_factory):
    """Nested VGG-11 x0.125 (3 levels, per-level BatchNorm), SDN and FlexDNN exits on its largest level."""
    info, *_ = write_flex_bundle(tmp_path_factory.mktemp("og_vgg"), onnx=False)
    return nd.load(info["bundle"])


@pytest.fixture(scope="module")
def vgg_own(tmp_path_factory):
    """FlexDNN exits on their own backbone (a second program with its own weights)."""
    info, *_ = write_flex_bundle(tmp_path_factory.mktemp("og_vgg_own"), onnx=False, own=True, progressive=False)
    return nd.load(info["bundle"])


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """Nested ResNet-20 x0.25 (3 levels; skip connections, strided 1x1 shortcuts, a global pool)
    with SDN exits, one tapped inside a residual block (its skip crosses the cut too)."""
    from nestflex.capacity import extract_level, nest_from_roadmap
    from nestflex.exits import MultiExitNetwork
    from nestflex.export import export_bundle
    from nestflex.models import create_model
    from tests.capacity.conftest import make_roadmap
    from tests.conftest import settle_batchnorm

    tmp = tmp_path_factory.mktemp("og_resnet")
    torch.manual_seed(0)
    net = settle_batchnorm(create_model("resnet20", width=0.25))
    make_roadmap(tmp, net)
    nest_from_roadmap(net, tmp / "roadmap.json", levels=LEVELS)
    torch.manual_seed(1)
    exits = MultiExitNetwork(extract_level(net.eval(), LEVELS - 1), positions=(0.3, 0.6), head="sdn").eval()
    info = export_bundle(tmp / "resnet.nfx", net, exits=exits, thresholds=[0.5, 0.6], onnx=False)
    return nd.load(info["bundle"])


BUNDLES = ["vgg", "resnet"]


@pytest.mark.parametrize("which", BUNDLES)
def test_every_level_matches_the_eager_interpreter(which, request):
    bundle = request.getfixturevalue(which)
    nodes = bundle.spec.capacity.program.nodes
    assert bundle.num_levels == LEVELS
    for level in range(LEVELS):
        arrays = _level_arrays(bundle, level)
        session = _session(program_to_onnx(nodes, arrays, INPUT, level=level))
        for n in (1, 3):
            x = _x(n, seed=level)
            want = run_program(nodes, {"x": x}, _torch(arrays), level)
            (got,) = session.run(None, {"x": x.numpy()})
            assert got.shape == (n, 10)
            _close(got, want, f"{which} level {level} batch {n}")


@pytest.mark.parametrize("which", BUNDLES)
def test_split_head_and_tail_at_every_split_point_and_level(which, request):
    bundle = request.getfixturevalue(which)
    nodes = bundle.spec.capacity.program.nodes
    splits = [s.node for s in bundle.spec.splits]
    assert len(splits) >= 9
    if which == "resnet":  # inside a block: the skip crosses the cut as a second tensor
        assert any(len(cut_program(nodes, [s])[0][2]) == 2 for s in splits)
    for level in range(LEVELS):
        arrays = _level_arrays(bundle, level)
        envs = {n: _eager(nodes, arrays, level, n) for n in (1, 3)}
        for s in splits:
            assert _check_stages(nodes, [s], arrays, level, f"{which} split {s!r} level {level}", envs) == 2


def test_a_cut_after_every_node_of_a_residual_network(resnet):
    """Every node a cut point (skip connections cross and pass through stages untouched)."""
    nodes = resnet.spec.capacity.program.nodes
    cuts = [n.name for n in nodes if n.op not in ("input", "output")][::3]
    arrays = _level_arrays(resnet, 1)
    assert _check_stages(nodes, cuts, arrays, 1, "resnet, many cuts") == len(cuts) + 1


def _check_exit_set(bundle, kind: str) -> int:
    """Each exit stage and each head in ONNX against the eager ones; the exits checked."""
    spec = bundle.spec
    ex = next(s for s in spec.exit_sets if s.kind == kind)
    arrays = _all_arrays(bundle)
    if ex.backbone == "shared":
        level = spec.capacity.num_levels - 1
        backbone, tensors = spec.capacity.program.nodes, _level_arrays(bundle, level)
    else:
        level, backbone, tensors = 0, ex.program.nodes, arrays
    stages = cut_program(backbone, ex.taps)
    _check_stages(backbone, list(ex.taps), tensors, level, f"{kind} stages")
    shapes = infer_shapes(backbone, tensors, INPUT, level)
    for k, head in enumerate(ex.heads):
        head_nodes = head.program.nodes
        tapped = stages[k][2][0]
        model = program_to_onnx(head_nodes, arrays, {head_nodes[0].name: shapes[tapped]})
        session = _session(model)
        for n in (1, 3):
            feed = torch.randn((n, *shapes[tapped][1:]), generator=torch.Generator().manual_seed(k)).relu()
            want = run_program(head_nodes, {head_nodes[0].name: feed}, _torch(arrays), 0)
            (got,) = session.run(None, {head_nodes[0].name: feed.numpy()})
            _close(got, want, f"{kind} head {k} batch {n}")
    return len(ex.heads)


def test_every_exit_stage_and_head(vgg, vgg_own, resnet):
    assert _check_exit_set(vgg, "progressive") == 2  # SDN heads: adaptive pools (4, 4), param alpha, 1 - alpha
    assert _check_exit_set(vgg, "flexdnn") == 2  # index_select, ceil-mode avg pool stem, global pool
    assert _check_exit_set(vgg_own, "flexdnn") == 2  # its own backbone program
    assert _check_exit_set(resnet, "progressive") == 2


def test_every_bundle_op_has_a_conversion():
    assert set(SUPPORTED_OPS) == set(_deploy("PROGRAM_OPS"))


def test_conversion_time_of_the_largest_test_bundle(resnet, capsys):
    nodes = resnet.spec.capacity.program.nodes
    arrays = _level_arrays(resnet, LEVELS - 1)
    start = time.perf_counter()
    model = program_to_onnx(nodes, arrays, INPUT, level=LEVELS - 1)
    seconds = time.perf_counter() - start
    weight_bytes = sum(a.nbytes for a in arrays.values())
    assert weight_bytes < len(model) < weight_bytes + 64 * 1024  # weights once, plus a small graph
    with capsys.disabled():
        print(f"\n[onnxgraph] resnet20 x0.25 level {LEVELS - 1}: {len(nodes)} nodes, {len(model):,} bytes, "
              f"{seconds * 1e3:.2f} ms")


# --------------------------------------------------------------------------------------------
# each op alone, against torch.nn.functional


def _node(name, op, args=("x",), params=None, **attrs):
    return SimpleNamespace(name=name, op=op, args=tuple(args), attrs=attrs, params=params)


def _one(node, x: torch.Tensor, weights=None, outputs=None) -> np.ndarray:
    """Run a program of ``node`` (the last of a list of nodes) on ``x`` in onnxruntime."""
    nodes = node if isinstance(node, list) else [node]
    weights = {k: np.asarray(v) for k, v in (weights or {}).items()}
    model = program_to_onnx(nodes, weights, {"x": (None, *x.shape[1:])}, outputs or [nodes[-1].name])
    return _run(model, {"x": x})[0]


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("groups,depthwise,stride,padding,dilation,bias", [
    (1, False, 1, 1, 1, True), (1, False, 2, 0, 1, False), (2, False, (2, 1), (1, 2), (1, 2), True),
    (1, True, 1, 1, 1, False), (1, True, 2, 2, 2, True), (4, False, 3, 1, 1, False)])
def test_conv2d(groups, depthwise, stride, padding, dilation, bias):
    x = _rand(2, 8, 11, 9)
    cout, cin = (8, 1) if depthwise else (12, 8 // groups)
    w = {"weight": _rand(cout, cin, 3, 3, seed=1), **({"bias": _rand(cout, seed=2)} if bias else {})}
    node = _node("c", "conv2d", params={k: k for k in w}, stride=stride, padding=padding, dilation=dilation,
                 groups=groups, depthwise=depthwise)
    want = F.conv2d(x, w["weight"], w.get("bias"), stride, padding, dilation, cout if depthwise else groups)
    _close(_one(node, x, w), want, "conv2d")


@pytest.mark.parametrize("shape", [(3, 5), (3, 4, 5), (2, 3, 4, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gemm_for_2d_matmul_otherwise(shape, bias):
    x = _rand(*shape)
    w = {"weight": _rand(7, 5, seed=1), **({"bias": _rand(7, seed=2)} if bias else {})}
    node = _node("fc", "linear", params={k: k for k in w})
    model = program_to_onnx([node], {k: v.numpy() for k, v in w.items()}, {"x": (None, *shape[1:])}, ["fc"])
    ops = [n.op_type for n in onnx.load_from_string(model).graph.node]
    assert ops == (["Gemm"] if len(shape) == 2 else ["MatMul", "Add"] if bias else ["MatMul"])
    _close(_run(model, {"x": x})[0], F.linear(x, w["weight"], w.get("bias")), "linear")


@pytest.mark.parametrize("shape", [(3, 6), (2, 6, 5, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_in_inference_mode(shape, affine):
    x = _rand(*shape)
    w = {"running_mean": _rand(6, seed=1), "running_var": _rand(6, seed=2).abs() + 0.5}
    if affine:
        w.update(weight=_rand(6, seed=3), bias=_rand(6, seed=4))
    node = _node("bn", "batch_norm", params={k: k for k in w}, eps=1e-3)
    want = F.batch_norm(x, w["running_mean"], w["running_var"], w.get("weight"), w.get("bias"), False, 0.0, 1e-3)
    _close(_one(node, x, w), want, "batch_norm")


def test_relu_relu6_identity():
    x = _rand(3, 4, 5, 5) * 8
    _close(_one(_node("r", "relu"), x), F.relu(x), "relu")
    _close(_one(_node("r", "relu6"), x), F.hardtanh(x, 0.0, 6.0), "relu6")
    _close(_one(_node("r", "identity"), x), x, "identity")


_POOL_SIZES = [(7, 7), (8, 5), (6, 9)]


def _two(v):
    return v if isinstance(v, tuple) else (v, v)


#: kernel, stride, padding: every combination torch accepts (padding at most half the kernel)
_POOLS = [(k, s, p) for k, s, p in itertools.product((1, 2, 3, (2, 3)), (1, 2, 3, (2, 1)), (0, 1, (1, 0)))
          if all(2 * pp <= kk for pp, kk in zip(_two(p), _two(k)))]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dilation", [1, 2])
def test_max_pool2d_matches_torch_in_every_ceil_and_padding_case(ceil_mode, dilation):
    checked, padded = 0, 0
    for (h, w), (k, s, p) in itertools.product(_POOL_SIZES, _POOLS):
        x = _rand(2, 3, h, w, seed=h * w)
        node = _node("pool", "max_pool2d", kernel_size=k, stride=s, padding=p, dilation=dilation, ceil_mode=ceil_mode)
        try:
            want = F.max_pool2d(x, k, s, p, dilation, ceil_mode)
        except RuntimeError:  # the window does not fit: torch refuses, and so must the conversion
            with pytest.raises(OnnxGraphError, match="does not fit"):
                program_to_onnx([node], {}, {"x": (None, 3, h, w)}, ["pool"])
            continue
        model = program_to_onnx([node], {}, {"x": (None, 3, h, w)}, ["pool"])
        _close(_run(model, {"x": x})[0], want, f"max_pool2d {h}x{w} k={k} s={s} p={p} d={dilation} ceil={ceil_mode}")
        checked += 1
        padded += [n.op_type for n in onnx.load_from_string(model).graph.node] == ["Pad", "MaxPool"]
    assert checked > 100
    # a dilated window that overhangs by a kernel or more: onnxruntime refuses such pads, -inf Pad first
    assert (padded > 0) == (ceil_mode and dilation == 2)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("divisor_override", [None, 5])
def test_avg_pool2d_matches_torch_in_every_ceil_padding_and_divisor_case(ceil_mode, count_include_pad,
                                                                         divisor_override):
    checked = 0
    for (h, w), (k, s, p) in itertools.product(_POOL_SIZES, _POOLS):
        x = _rand(2, 3, h, w, seed=h + w)
        try:
            want = F.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override)
        except RuntimeError:
            continue
        node = _node("pool", "avg_pool2d", kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode,
                     count_include_pad=count_include_pad, divisor_override=divisor_override)
        _close(_one(node, x), want, f"avg_pool2d {h}x{w} k={k} s={s} p={p} ceil={ceil_mode} "
                                    f"include_pad={count_include_pad} divisor={divisor_override}")
        checked += 1
    assert checked > 100


def test_avg_pool2d_is_one_plain_pool_when_onnx_divides_as_torch_does():
    def ops(h, **attrs):
        node = _node("pool", "avg_pool2d", **{"stride": 2, "padding": 0, "ceil_mode": False,
                                             "count_include_pad": True, "divisor_override": None, **attrs})
        model = program_to_onnx([node], {}, {"x": (None, 3, h, h)}, ["pool"])
        return [n.op_type for n in onnx.load_from_string(model).graph.node]

    assert ops(8, kernel_size=2) == ["AveragePool"]
    assert ops(8, kernel_size=3, padding=1, count_include_pad=False) == ["AveragePool"]
    assert ops(7, kernel_size=2, ceil_mode=True) == ["Pad", "AveragePool", "Mul"]  # the last window overhangs
    assert ops(8, kernel_size=2, divisor_override=3) == ["AveragePool", "Mul"]


@pytest.mark.parametrize("op,torch_fn,global_op", [
    ("adaptive_avg_pool2d", F.adaptive_avg_pool2d, "GlobalAveragePool"),
    ("adaptive_max_pool2d", F.adaptive_max_pool2d, "GlobalMaxPool")])
def test_adaptive_pools_global_or_evenly_dividing(op, torch_fn, global_op):
    x = _rand(3, 4, 12, 8)
    for size, kind in [(1, global_op), ([1, 1], global_op), ([4, 4], None), ([3, 2], None), (4, None),
                       ([None, 2], None), ([6, None], None), ([12, 8], None)]:
        node = _node("pool", op, output_size=size)
        model = program_to_onnx([node], {}, {"x": (None, 4, 12, 8)}, ["pool"])
        assert [n.op_type for n in onnx.load_from_string(model).graph.node] == [kind or global_op[6:]]
        want = torch_fn(x, tuple(size) if isinstance(size, list) else size)
        _close(_run(model, {"x": x})[0], want, f"{op} {size}")


@pytest.mark.parametrize("op,torch_fn", [("adaptive_avg_pool2d", F.adaptive_avg_pool2d),
                                         ("adaptive_max_pool2d", F.adaptive_max_pool2d)])
def test_adaptive_pools_with_torch_s_uneven_windows(op, torch_fn):
    """Outputs that do not divide the input (SDN heads: 14x14 -> 4x4), smaller or larger than it:
    torch's overlapping windows, one axis at a time."""
    for (h, w), size in [((14, 14), 4), ((8, 8), [3, 3]), ((7, 5), [3, 2]), ((2, 2), 4), ((12, 8), [5, None]),
                         ((9, 6), [4, 6])]:
        x = _rand(2, 3, h, w)
        node = _node("exit_pool", op, output_size=size)
        model = program_to_onnx([node], {}, {"x": (None, 3, h, w)}, ["exit_pool"])
        assert "Slice" in [n.op_type for n in onnx.load_from_string(model).graph.node]
        _close(_run(model, {"x": x})[0], torch_fn(x, tuple(size) if isinstance(size, list) else size), f"{op} {size}")


@pytest.mark.parametrize("start,end,onnx_op", [(1, -1, "Flatten"), (1, 3, "Flatten"), (2, 3, "Reshape"),
                                                (0, -1, "Reshape"), (0, 1, "Reshape"), (1, 2, "Reshape"),
                                                (-2, -1, "Reshape"), (2, 2, "Identity")])
def test_flatten_as_flatten_or_reshape(start, end, onnx_op):
    x = _rand(3, 4, 5, 6)
    node = _node("f", "flatten", start_dim=start, end_dim=end)
    model = program_to_onnx([node], {}, {"x": (None, 4, 5, 6)}, ["f"])
    assert [n.op_type for n in onnx.load_from_string(model).graph.node] == [onnx_op]
    want = torch.flatten(x, start, end)
    assert infer_shapes([node], {}, {"x": (None, 4, 5, 6)})["f"] == (None, *want.shape[1:])  # the batch stays symbolic
    _close(_run(model, {"x": x})[0], want, f"flatten({start}, {end})")


def test_binary_ops_params_and_numbers():
    x = _rand(3, 4, 2, 2)
    alpha, gamma = _rand(1, seed=1), _rand(4, 1, 1, seed=2)
    nodes = [_node("x", "input", ()), _node("alpha", "param", (), params={"value": "a"}),
             _node("gamma", "param", (), params={"value": "g"}),
             _node("mul", "mul", ("alpha", "x")), _node("sub", "sub", (1, "alpha")), _node("subr", "sub", ("x", 0.5)),
             _node("add", "add", ("mul", "sub")), _node("scaled", "mul", ("add", "gamma")),
             _node("both", "add", (2, 3)), _node("out", "mul", ("scaled", "both")),
             _node("output", "output", ("out", "subr", "alpha"))]
    weights = {"a": alpha, "g": gamma}
    model = program_to_onnx(nodes, {k: v.numpy() for k, v in weights.items()}, {"x": (None, 4, 2, 2)})
    got = _run(model, {"x": x})
    want = run_program(nodes, {"x": x}, weights)
    assert [o.name for o in onnx.load_from_string(model).graph.output] == ["out", "subr", "alpha/out"]
    for g, w in zip(got, want):
        _close(g, w, "binary")


@pytest.mark.parametrize("dim", [1, 2, -1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_index_select_is_a_gather(dim, dtype):
    x = _rand(2, 6, 5, 4)
    index = np.array([3, 0, 2], dtype=dtype)
    nodes = [_node("index", "param", (), params={"value": "i"}), _node("sel", "index_select", ("x", "index"), dim=dim)]
    want = torch.index_select(x, dim, torch.from_numpy(index.astype(np.int64)))
    _close(_one(nodes, x, {"i": index}), want, f"index_select dim {dim}")


def test_float_weights_are_written_as_float32_and_shared_tensors_once():
    x = _rand(2, 3)
    w = np.eye(3, dtype=np.float64)
    nodes = [_node("a", "linear", params={"weight": "w"}), _node("b", "linear", ("a",), params={"weight": "w"})]
    model = program_to_onnx(nodes, {"w": w}, {"x": (None, 3)}, ["b"])
    inits = onnx.load_from_string(model).graph.initializer
    assert [(t.name, t.data_type) for t in inits] == [("w", onnx.TensorProto.FLOAT)]
    _close(_run(model, {"x": x})[0], x, "shared weight")


def test_a_pass_through_input_and_a_stage_without_an_input_node():
    """A stage reads values by name and may return an input untouched (a skip crossing it)."""
    a, skip = _rand(2, 4, 3, 3), _rand(2, 4, 3, 3, seed=1)
    nodes = [_node("r", "relu", ("a",))]
    model = program_to_onnx(nodes, {}, {"a": (None, 4, 3, 3), "skip": (None, 4, 3, 3)}, ["r", "skip"])
    got = _run(model, {"a": a, "skip": skip})
    _close(got[0], a.relu(), "relu")
    _close(got[1], skip, "skip")


# --------------------------------------------------------------------------------------------
# errors


def test_misuse_is_explained():
    relu = _node("r", "relu")
    with pytest.raises(OnnxGraphError, match=r"node 'g' \(hardswish\): op 'hardswish' has no ONNX conversion; "
                                             r"supported ops: input, output, param, conv2d"):
        program_to_onnx([_node("g", "hardswish")], {}, {"x": (None, 4)}, ["g"])
    with pytest.raises(OnnxGraphError, match=r"node 'fc' \(linear\): its 'weight' is tensor 'w', which `tensors` "
                                             r"does not hold. HINT: pass every tensor the level reads \(level 2\)"):
        program_to_onnx([_node("fc", "linear", params={"weight": "w"})], {}, {"x": (None, 4)}, ["fc"], level=2)
    with pytest.raises(OnnxGraphError, match=r"node 'r' \(relu\): reads 'x', which is neither an input nor an "
                                             r"earlier node"):
        program_to_onnx([relu], {}, {"y": (None, 4)}, ["r"])
    with pytest.raises(OnnxGraphError, match=r"node 'x' \(input\): the program's input 'x' has no shape in `inputs` "
                                             r"\(given: 'y'\)"):
        program_to_onnx([_node("x", "input", ()), relu], {}, {"y": (None, 4)}, ["r"])
    with pytest.raises(OnnxGraphError, match=r"`inputs\['x'\]` must be a shape of sizes >= 0 with None only first "
                                             r"\(the batch\), got \(3, None\). HINT: give full shapes"):
        program_to_onnx([relu], {}, {"x": (3, None)}, ["r"])
    with pytest.raises(OnnxGraphError, match=r"`outputs` names 'nope', which is neither an input nor a node"):
        program_to_onnx([relu], {}, {"x": (None, 4)}, ["nope"])
    with pytest.raises(OnnxGraphError, match=r"the program has no `output` node and `outputs` is empty"):
        program_to_onnx([relu], {}, {"x": (None, 4)})
    conv = _node("c", "conv2d", params={"weight": "w"}, stride=1, padding=0, dilation=1, groups=1)
    with pytest.raises(OnnxGraphError, match=r"node 'c' \(conv2d\): its input has 4 channels, its weight "
                                             r"\(8, 6, 3, 3\) expects 6 .*HINT: the weights must be cut to the same "
                                             r"level's region"):
        program_to_onnx([conv], {"w": np.zeros((8, 6, 3, 3), np.float32)}, {"x": (None, 4, 8, 8)}, ["c"])
    with pytest.raises(OnnxGraphError, match=r"node 'p' \(max_pool2d\): its window does not fit the input "
                                             r"\(N, 4, 2, 2\)"):
        program_to_onnx([_node("p", "max_pool2d", kernel_size=3, stride=1, padding=0, dilation=1, ceil_mode=False)],
                        {}, {"x": (None, 4, 2, 2)}, ["p"])
    with pytest.raises(OnnxGraphError, match=r"a weight has dtype bool"):
        program_to_onnx([_node("p", "param", (), params={"value": "b"})], {"b": np.zeros(2, bool)}, {"x": (None, 2)},
                        ["p"])
    with pytest.raises(OnnxGraphError, match=r"stage 1 reads \['gone'\], which no earlier stage computes"):
        stages_to_onnx([(["x"], [relu], ["r"]), (["gone"], [], [])], {}, {"x": (None, 4)})
    node_type = _deploy("ProgramNode")  # the schema's record: params per level (a switchable BatchNorm)
    bn = node_type("bn", "batch_norm", ("x",), {"eps": 1e-5}, None,
                   tuple({"running_mean": f"m{k}", "running_var": f"v{k}"} for k in range(3)))
    stats = {f"{s}{k}": np.ones(4, np.float32) for s in "mv" for k in range(3)}
    program_to_onnx([bn], stats, {"x": (None, 4)}, ["bn"], level=2)
    with pytest.raises(OnnxGraphError, match=r"node 'bn' \(batch_norm\): has no params for `level` 3"):
        program_to_onnx([bn], stats, {"x": (None, 4)}, ["bn"], level=3)
    assert issubclass(OnnxGraphError, NestflexError) and issubclass(OnnxGraphError, ValueError)


# --------------------------------------------------------------------------------------------
# the protobuf writer, read back by the onnx package


def test_the_protobuf_writer_reads_back_field_for_field():
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    index = np.array([-1, 2**40], dtype=np.int64)
    attrs = [P.attr_int("neg", -5), P.attr_int("big", 2**62), P.attr_float("eps", 1e-5), P.attr_string("s", "héllo"),
             P.attr_ints("ints", [-1, 0, 300]), P.attr_floats("floats", [0.5, -2.0]),
             P.attr_tensor("t", P.tensor("tv", index))]
    graph = P.graph("g", [P.node("Identity", ["x"], ["y"], "id", attrs, domain="ai.example")],
                    [P.value_info("x", P.FLOAT, ["batch", 3])], [P.value_info("y", P.FLOAT, ["batch", 3])],
                    [P.tensor("w", weight), P.tensor("scalar", np.float32(2.5))])
    m = onnx.load_from_string(P.model(graph, producer="test"))
    assert (m.ir_version, m.producer_name, [(o.domain, o.version) for o in m.opset_import]) == (8, "test", [("", 17)])
    g = m.graph
    assert g.name == "g" and [i.name for i in g.input] == ["x"] and [o.name for o in g.output] == ["y"]
    dims = g.input[0].type.tensor_type.shape.dim
    assert g.input[0].type.tensor_type.elem_type == 1 and [(d.dim_param, d.dim_value) for d in dims] == [("batch", 0),
                                                                                                         ("", 3)]
    n = g.node[0]
    assert (n.op_type, list(n.input), list(n.output), n.name, n.domain) == ("Identity", ["x"], ["y"], "id",
                                                                            "ai.example")
    a = {x.name: x for x in n.attribute}
    assert (a["neg"].i, a["big"].i, a["neg"].type) == (-5, 2**62, onnx.AttributeProto.INT)
    assert a["eps"].f == np.float32(1e-5) and a["s"].s.decode() == "héllo"
    assert list(a["ints"].ints) == [-1, 0, 300] and list(a["floats"].floats) == [0.5, -2.0]
    assert (onnx.numpy_helper.to_array(a["t"].t) == index).all()
    assert [t.name for t in g.initializer] == ["w", "scalar"]
    assert (onnx.numpy_helper.to_array(g.initializer[0]) == weight).all()
    assert onnx.numpy_helper.to_array(g.initializer[1]) == np.float32(2.5) and list(g.initializer[1].dims) == []


def test_a_subgraph_attribute_runs_as_an_if_node():
    """``attr_graph``: the branches of an If (the fused early exit will need them) run in onnxruntime."""
    def branch(name, op):
        return P.graph(name, [P.node(op, ["x"], [f"{name}_y"], name)], [], [P.value_info(f"{name}_y", P.FLOAT, None)])

    graph = P.graph("g", [P.node("If", ["c"], ["y"], "if", [P.attr_graph("then_branch", branch("then", "Relu")),
                                                           P.attr_graph("else_branch", branch("else", "Neg"))])],
                    [P.value_info("c", 9, []), P.value_info("x", P.FLOAT, ["batch", 2])],
                    [P.value_info("y", P.FLOAT, ["batch", 2])])
    model = P.model(graph)
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.array([[-1.0, 2.0]], np.float32)
    assert session.run(None, {"c": np.array(True), "x": x})[0].tolist() == [[0.0, 2.0]]
    assert session.run(None, {"c": np.array(False), "x": x})[0].tolist() == [[1.0, -2.0]]


# --------------------------------------------------------------------------------------------
# the import closure


def test_the_converter_imports_neither_torch_nor_onnx():
    """Convert and run a program in a process where torch and onnx cannot be imported.

    The parent package's ``__init__`` (the torch runtime, today) is bypassed on purpose: this pins
    what ``onnxgraph`` itself needs, numpy (and onnxruntime to run the result).
    """
    code = textwrap.dedent("""
        import sys, types
        from pathlib import Path

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "onnx"):
                    raise ImportError(f"{name} is blocked")
                return None

        sys.meta_path.insert(0, Block())
        import nestflex
        deploy = types.ModuleType("nestflex.deploy")
        deploy.__path__ = [str(Path(nestflex.__file__).parent / "deploy")]
        sys.modules["nestflex.deploy"] = deploy
        import numpy as np
        import onnxruntime as ort
        from nestflex.deploy.onnxgraph import program_to_onnx
        from types import SimpleNamespace as N
        nodes = [N(name="x", op="input", args=(), attrs={}, params=None),
                 N(name="p", op="max_pool2d", args=("x",), params=None,
                   attrs={"kernel_size": 2, "stride": 2, "padding": 0, "dilation": 1, "ceil_mode": True}),
                 N(name="out", op="output", args=("p",), attrs={}, params=None)]
        model = program_to_onnx(nodes, {}, {"x": (None, 1, 3, 3)})
        s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        print(s.run(None, {"x": np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)})[0].ravel().tolist())
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[4.0, 5.0, 7.0, 8.0]", "[]"]
