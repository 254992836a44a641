"""Zero-padding a level's widths (issue 23): the padded graph gives the same logits with widths at a
multiple, the padded backends run it, and graphs the pass cannot pad are refused by name."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

import nestflex.deploy as nd
from nestflex.deploy.backends.plan import ExecutionPlan, ExitsPlan, LevelPlan
from nestflex.deploy.backends.base import get_backend
from nestflex.deploy.backends.quantize import pad_level
from nestflex.deploy.tune import synthesize
from nestflex.deploy.backends.padding import PaddingError, pad_channels
from tests.export.bundles import write_bundle

# onnxruntime is a base dependency and onnx comes with the tune extra (in dev): plain imports, so a
# broken install fails here instead of turning the module into skips
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("padding")
    samples = (torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.randint(0, 10, (16,)))
    write_bundle(tmp, samples=samples)
    return nd.load(tmp / "model.nfx")


def _export(module: nn.Module, path, shape=(1, 3, 8, 8)):
    buf = io.BytesIO()
    torch.onnx.export(module.eval(), torch.randn(*shape), buf, input_names=["input"], output_names=["out"],
                      opset_version=17, dynamo=False, dynamic_axes={"input": {0: "batch"}, "out": {0: "batch"}})
    path.write_bytes(buf.getvalue())
    return path


def _run(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: np.asarray(x)})[0]


def _x(n, seed):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32), dtype=np.float32)


def test_every_level_pads_to_a_multiple_with_the_same_logits(bundle):
    x = _x(3, seed=1)
    for level in range(bundle.num_levels):
        padded = pad_level(bundle, level, 8)
        model = onnx.load(str(padded))
        convs = [n for n in model.graph.node if n.op_type == "Conv"]
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        assert all(inits[c.input[1]].shape[0] % 8 == 0 for c in convs)
        ref = nd.CapacityRuntime(bundle, level, plan="eager")(x)
        np.testing.assert_allclose(_run(padded, x), ref, atol=1e-5, rtol=0)
        rt = nd.CapacityRuntime(bundle, level, plan=ExecutionPlan(tuple(LevelPlan("onnxruntime_pad8") for _ in bundle.levels)))
        np.testing.assert_allclose(rt(x), ref, atol=1e-5, rtol=0)


def test_the_padded_int8_backends_run_and_the_synthesis_measures_them(bundle):
    x = _x(2, seed=2)
    for name in ("onnxruntime_int8_pad8", "onnxruntime_mixed_pad8"):
        if name == "onnxruntime_mixed_pad8" and bundle.spec.precision is None:
            continue
        rt = nd.CapacityRuntime(bundle, 0, plan=ExecutionPlan(tuple(LevelPlan(name) for _ in bundle.levels)))
        assert rt(x).shape == (2, 10)
    plan = synthesize(bundle, backends=["eager", "onnxruntime_pad8", "onnxruntime_int8_pad8"], threads=[1],
                      repeats=2, budget_points=100)
    rows = [c for c in plan.candidates if c.get("level") is not None and c["backend"] == "onnxruntime_pad8"]
    assert len(rows) == bundle.num_levels and all(r["agrees"] for r in rows)  # exact: the float32 check holds
    with pytest.raises(nd.NestflexError, match="'onnxruntime_pad8' runs levels, not exit sets"):
        nd.ProgressiveRuntime(bundle, plan=ExecutionPlan((), exits={"exits": ExitsPlan("onnxruntime_pad8", 1)}))
    assert get_backend("onnxruntime_pad8").precision == "float32"  # padding changes no logit


def test_per_channel_ops_residual_adds_and_flatten_pad_through(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 5, 3, padding=1), nn.Conv2d(5, 5, 3, padding=1)
            self.bn, self.fc, self.out = nn.BatchNorm2d(5), nn.Linear(5 * 4 * 4, 7), nn.Linear(7, 3)
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

        def forward(self, x):
            y = torch.relu(self.a(x))
            y = nn.functional.max_pool2d(self.bn(self.b(y)) + y, 2)
            return self.out(torch.sigmoid(self.fc(torch.flatten(y, 1))))

    src = _export(Net(), tmp_path / "net.onnx")
    info = pad_channels(src, tmp_path / "padded.onnx", 8)
    assert sorted(info["widths"].values()) == [[5, 8], [5, 8], [7, 8]]  # the graph output (3) is left alone
    x = torch.randn(4, 3, 8, 8)
    np.testing.assert_allclose(_run(tmp_path / "padded.onnx", x), _run(src, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("body, op", [
    (lambda m, x: torch.cat([m.a(x), m.b(x)], 1), "Concat"),
    (lambda m, x: m.g(m.a(x)), "grouped Conv"),
    (lambda m, x: m.a(x).permute(0, 2, 3, 1), "Transpose"),
    (lambda m, x: m.a(x) / m.b(x), "Div"),  # 0 / 0 in the padded channels
])
def test_a_graph_it_cannot_pad_is_refused_by_name(tmp_path, body, op):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 5, 1), nn.Conv2d(3, 5, 1)
            self.g = nn.Conv2d(5, 5, 3, groups=5)

        def forward(self, x):
            return body(self, x).sum(dim=(1,) if op != "Transpose" else (3,))

    src = _export(Net(), tmp_path / "net.onnx")
    with pytest.raises(PaddingError, match=op):
        pad_channels(src, tmp_path / "padded.onnx", 8)
    assert not (tmp_path / "padded.onnx").exists()
    with pytest.raises(PaddingError, match="`multiple` must be an int >= 2"):
        pad_channels(src, tmp_path / "padded.onnx", 1)


def test_a_level_that_cannot_be_prepared_leaves_the_old_level_running(bundle, monkeypatch):
    import nestflex.deploy.backends.onnxruntime as backends

    plan = ExecutionPlan((LevelPlan("eager"), LevelPlan("onnxruntime_pad8"), LevelPlan("onnxruntime_pad8")))
    rt = nd.CapacityRuntime(bundle, 0, plan=plan, keep="active")  # level 2 is prepared when switched to
    x = _x(2, seed=3)

    def refuse(*args, **kwargs):
        raise PaddingError("Concat 'cat' reads a padded tensor")

    monkeypatch.setattr(backends, "pad_level", refuse)
    with pytest.raises(PaddingError, match="Concat"):
        rt.set_level(2)
    assert rt.level == 0 and rt.backend == "eager"
    np.testing.assert_allclose(rt(x), nd.CapacityRuntime(bundle, 0, plan="eager")(x), atol=0, rtol=0)


def test_without_onnx_padding_names_the_package_and_the_extra(tmp_path, monkeypatch):
    import sys

    from nestflex.deploy.backends._onnx import MissingOnnxError

    src = _export(nn.Conv2d(3, 5, 1), tmp_path / "net.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)  # the base install: no onnx
    with pytest.raises(MissingOnnxError, match=r"building the padded graph of net.onnx needs the `onnx` package.*"
                                               r"pip install \"nestflex\[tune\]\""):
        pad_channels(src, tmp_path / "padded.onnx", 8)
    assert not (tmp_path / "padded.onnx").exists()
