"""Per-operator time of an ONNX graph in onnxruntime, from onnxruntime's own profiler.

What a level's time is made of (``benchmarks/synthesis/level_profile.py``) and which layers run slower in
int8 than in float32 on this device (:func:`nestflex.deploy.backends.quantize.slow_int8_layers`) both come
from here. The profiler adds its own cost to every operator, so the times are for comparing
operators and graphs profiled alike, not for adding up to a call's wall time.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CONV_OPS", "layer_names", "operator_times"]

#: Operators that carry a layer's MACs, as onnxruntime's optimised graphs name them (float32,
#: NCHWc, int8 QDQ fused to QLinear*, fused activations).
CONV_OPS: frozenset[str] = frozenset({"Conv", "FusedConv", "QLinearConv", "NhwcFusedConv", "Gemm", "FusedGemm",
                                      "QGemm", "MatMul", "QLinearMatMul", "MatMulInteger"})


def operator_times(path: str | Path, x: Any, runs: int = 200, threads: int = 1) -> list[dict[str, Any]]:
    """Each operator of ``path``'s optimised graph, in the order they run, with its median kernel
    time over ``runs`` profiled calls on input ``x`` (a numpy array): ``name``, ``op``, ``shape``
    (its first output's) and ``us``."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as work:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(work) / "profile")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        for _ in range(runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes: dict[str, dict[str, Any]] = {}  # insertion order: the order they first ran
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            row = nodes.setdefault(name, {"name": name, "op": e["args"].get("op_name"),
                                          "shape": _first_shape(e["args"]), "times": []})
            row["times"].append(e["dur"])
    return [{"name": r["name"], "op": r["op"], "shape": r["shape"], "us": float(statistics.median(r["times"]))}
            for r in nodes.values()]


def layer_names(path: str | Path) -> list[str]:
    """Each Conv/Gemm/MatMul of an exported (unoptimised) graph, in graph order, as the scope of
    its node name: ``/features/conv1/`` for torch's ``/features/conv1/Conv`` (the operators of
    the module ``features.conv1``; nested modules keep the exporter's own scope, e.g.
    ``/layer1/layer1.0/conv1/``); a node without a scope gives its own name.

    Raises:
        MissingOnnxError: the ``onnx`` package (``nestflex[tune]``) is not installed.
    """
    from nestflex.deploy.backends._onnx import import_onnx

    onnx = import_onnx(f"the layer names of {Path(path).name}")
    out = []
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul"):
            scope = node.name.rpartition("/")[0]
            out.append(scope + "/" if scope else node.name)
    return out


def _first_shape(args: dict[str, Any]) -> list[int] | None:
    for item in args.get("output_type_shape") or []:
        for dims in item.values():
            return list(dims)
    return None
