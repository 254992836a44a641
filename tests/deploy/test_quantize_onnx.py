"""quantize_onnx, the int8 quantiser of the onnxruntime int8 backends, on a graph that is no bundle
level (benchmarks/synthesis/time_vs_macs.py quantises torchvision models with it)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from nestflex.deploy.backends.base import BackendError
from nestflex.deploy.backends.quantize import quantize_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    torch.manual_seed(0)
    net = _Net().eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.randn(1, 3, 16, 16), buf, dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    path = tmp_path_factory.mktemp("src") / "model.onnx"
    path.write_bytes(buf.getvalue())
    return path


def _inputs(seed: int, n: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 16, 16), dtype=np.float32)


def _work(tmp_path, name):
    (tmp_path / name).mkdir()
    return tmp_path / name


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_quantize_onnx_writes_a_qdq_graph_with_per_channel_weights_close_to_float(src, tmp_path):
    dst = tmp_path / "int8.onnx"
    quantize_onnx(src, dst, _inputs(0), _work(tmp_path, "work"))
    assert (tmp_path / "work" / "pre.onnx").is_file()  # the documented intermediate
    g = onnx.load(str(dst)).graph
    ops = [n.op_type for n in g.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and ops.count("Conv") == 2
    inits = {i.name: i for i in g.initializer}
    # the conv weights: int8, one scale per output channel (per-channel), dequantised along axis 0
    weight_dq = [n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                 and inits[n.input[0]].data_type == onnx.TensorProto.INT8 and len(inits[n.input[0]].dims) == 4]
    assert sorted(inits[n.input[0]].dims[0] for n in weight_dq) == [8, 16]
    for n in weight_dq:
        assert inits[n.input[1]].dims[0] == inits[n.input[0]].dims[0]
    # activations: uint8 (U8S8)
    act_q = [n for n in g.node if n.op_type == "QuantizeLinear"]
    assert act_q and all(inits[n.input[2]].data_type == onnx.TensorProto.UINT8 for n in act_q if len(n.input) > 2)
    x = _inputs(1, 4)
    ref, out = _run(src, x), _run(dst, x)
    assert out.shape == ref.shape == (4, 10)
    assert np.abs(out - ref).max() <= 0.1 * np.abs(ref).max() + 1e-3


def test_calibration_inputs_set_ranges_only_and_keep_float_keeps_a_layer_float(src, tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    quantize_onnx(src, a, _inputs(0), _work(tmp_path, "wa"))
    quantize_onnx(src, b, 3 * _inputs(7, 2), _work(tmp_path, "wb"))  # other inputs, other ranges: same operators
    assert [n.op_type for n in onnx.load(str(a)).graph.node] == [n.op_type for n in onnx.load(str(b)).graph.node]
    mixed = tmp_path / "mixed.onnx"
    quantize_onnx(src, mixed, _inputs(0), _work(tmp_path, "wm"), keep_float=("conv1",))
    g = onnx.load(str(mixed)).graph
    conv1 = next(n for n in g.node if n.name.startswith("/conv1/") and n.op_type == "Conv")
    producers = {o: n.op_type for n in g.node for o in n.output}
    # a float conv reads float weights (an initializer), not a DequantizeLinear's output
    assert producers.get(conv1.input[1]) != "DequantizeLinear"
    with pytest.raises(BackendError, match="name an operator"):
        quantize_onnx(src, tmp_path / "none.onnx", _inputs(0), _work(tmp_path, "wn"), keep_float=("nothing.here",))
