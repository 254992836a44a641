"""Graphs derived from a level's ONNX for this device: int8 (QDQ) and mixed-precision levels, the
layers kept in float32, and zero-padded widths.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nestflex.deploy.backends._onnx import import_onnx
from nestflex.deploy.backends.base import BackendError, _built, calibration_split
from nestflex.deploy.backends.graphs import level_graph
from nestflex.deploy.backends.padding import pad_channels

__all__ = ["float_layers", "mixed_float_layers", "slow_int8_layers", "quantize_level", "quantize_onnx", "pad_level"]

#: an int8 layer counts as slow when its kernel takes this many times its float32 one (the margin
#: pays for the Quantize / Dequantize a float layer between int8 ones adds, and for noise)
SLOW_INT8_MARGIN = 1.3


def float_layers(bundle: Any) -> tuple[str, ...]:
    """The layers the bundle's precision plan does not assign to int8 (float32, bfloat16: onnxruntime
    runs both as float32 here).

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).

    Returns:
        The layer names (``features.conv1``), sorted.

    Raises:
        BackendError: the bundle has no per-layer precision plan.
    """
    plan = bundle.spec.precision
    if plan is None or not plan.assignment:
        raise BackendError(f"bundle {str(bundle.path)!r} has no per-layer precision plan for onnxruntime_mixed. "
                           f"HINT: export it with a precision profile (precision_profile=, the recipe's profile "
                           f"stage), or plan onnxruntime_int8")
    return tuple(sorted(name for name, p in plan.assignment.items() if p != "int8"))


def mixed_float_layers(bundle: Any) -> tuple[str, ...]:
    """The layers a mixed plan keeps in float: the precision plan's (:func:`float_layers`) and this
    device's slow int8 ones (:func:`slow_int8_layers`)."""
    return tuple(sorted(set(float_layers(bundle)) | set(slow_int8_layers(bundle))))


def slow_int8_layers(bundle: Any, runs: int = 200) -> tuple[str, ...]:
    """The layers whose int8 kernel is slower than their float32 one on this device.

    Measured once per device on the largest level at one thread, with onnxruntime's profiler
    (:mod:`nestflex.deploy.backends.op_profile`): the k-th Conv/Gemm to run in the float32 graph against
    the k-th in the int8 one (one topology, both in onnxruntime's execution order); a layer is
    slow when its int8 kernel takes more than :data:`SLOW_INT8_MARGIN` times its float32 kernel.
    Layers are named by their ONNX node scope (``/features/conv1/``, :func:`~nestflex.deploy.
    op_profile.layer_names`), which the quantiser's exclusion matches exactly. On the default
    recipe's bundle that is the first convolution, which reads the 3-channel image: int8 kernels
    gain nothing on 3 input channels and pay for their layout (docs/synthesis.md). Kept in
    ``BUNDLE.tuned/<digest>/`` as ``int8_slow_layers.json``, so a level switch reads the file
    instead of measuring; graphs whose layers cannot be paired give none, with a warning, and
    are measured again next time. The padded backends use the same list: the largest level's
    widths are usually multiples of 8 already, so padding leaves its kernels as they are.
    """
    from nestflex._io import write_json
    from nestflex.deploy.backends.op_profile import CONV_OPS, layer_names, operator_times

    def build(target: Path) -> None:
        top = bundle.num_levels - 1
        fp32 = level_graph(bundle, top)
        x = np.random.default_rng(0).standard_normal((1, *bundle.spec.input.shape)).astype(np.float32)
        names = layer_names(fp32)
        t32 = [o["us"] for o in operator_times(fp32, x, runs) if o["op"] in CONV_OPS]
        t8 = [o["us"] for o in operator_times(quantize_level(bundle, top), x, runs) if o["op"] in CONV_OPS]
        if not len(names) == len(t32) == len(t8):  # cannot pair the layers: none slow, measure again next time
            warnings.warn(f"{str(bundle.path)!r}: the float32 and int8 graphs of level {top} run {len(t32)} and "
                          f"{len(t8)} Conv/Gemm operators for {len(names)} layers, so their kernels cannot be "
                          f"paired; the mixed plan keeps only the precision plan's layers in float", stacklevel=4)
            return
        slow = [n for n, a, b in zip(names, t32, t8) if b > SLOW_INT8_MARGIN * a]
        write_json(target, {"layers": slow, "margin": SLOW_INT8_MARGIN, "level": top, "threads": 1,
                            "float32_us": t32, "int8_us": t8, "names": names})

    path = _built(bundle, "int8_slow_layers.json", build)
    if not path.is_file():
        return ()
    try:
        layers = json.loads(path.read_text(encoding="utf-8")).get("layers")
    except (OSError, ValueError):
        layers = None
    if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
        path.unlink(missing_ok=True)  # damaged: measure again next time, run all-int8-but-the-plan now
        return ()
    return tuple(layers)


def quantize_level(bundle: Any, level: int, keep_float: Sequence[str] = (), pad_to: int = 1) -> Path:
    """The int8 (QDQ) graph of ``level``: from the cache beside the bundle, or built now and cached.

    Building takes well under a second for the recipe's levels; a bundle folder that cannot be
    written beside gets a cache in the temp folder instead. Calibration uses the first half of
    the bundle's samples (:func:`calibration_split`).

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`) that ships samples.
        level: the level to quantise, ``0`` to ``bundle.num_levels - 1``.
        keep_float: layers whose operators stay float32 (a mixed plan): layer names
            (``features.conv1``) or ONNX node-name scopes (``/features/conv1/``).
        pad_to: quantise the level with its widths zero-padded to this multiple
            (:func:`pad_level`; 1: no padding).

    Returns:
        The path of the cached int8 ONNX graph.

    Raises:
        MissingOnnxError: the graph is not cached and the ``onnx`` package (``nestflex[tune]``, which
            onnxruntime's quantiser reads and writes graphs with) is not installed.
        BackendError: the bundle ships no samples to calibrate on.
    """
    import hashlib
    import shutil
    import tempfile

    tag = "int8" if not keep_float else "mixed-" + hashlib.sha256("\n".join(keep_float).encode()).hexdigest()[:8]

    def build(target: Path) -> None:
        import_onnx(f"the {tag.split('-')[0]} graph of level {level}")  # before any work: the quantiser needs it
        src = level_graph(bundle, level) if pad_to == 1 else pad_level(bundle, level, pad_to)
        work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".int8-"))
        try:
            quantize_onnx(src, work / "model.onnx", calibration_split(bundle)[0][0], work, keep_float)
            os.replace(work / "model.onnx", target)  # atomic: a reader sees the whole file or none
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return _built(bundle, f"level_{level}{'' if pad_to == 1 else f'.pad{pad_to}'}.{tag}.onnx", build)


def pad_level(bundle: Any, level: int, multiple: int) -> Path:
    """The level's ONNX graph with its widths zero-padded to ``multiple`` (:mod:`nestflex.deploy.backends.padding`),
    cached beside the bundle.

    Raises:
        PaddingError: the graph has an operator the padding does not support.
    """
    src = level_graph(bundle, level)
    return _built(bundle, f"level_{level}.pad{multiple}.onnx", lambda target: pad_channels(src, target, multiple))


def quantize_onnx(src: Path, dst: Path, inputs: np.ndarray, work: Path, keep_float: Sequence[str] = ()) -> None:
    """Quantise an ONNX graph to int8 as the onnxruntime int8 backends do: onnxruntime's static QDQ
    quantisation, uint8 activations and int8 per-channel weights (U8S8, its recommended CPU format),
    MinMax calibration. :func:`quantize_level` builds a bundle level's int8 graph with it; other
    graphs (benchmarks/synthesis/time_vs_macs.py times torchvision models) get the same treatment.

    The calibration inputs only set the activations' quantisation ranges (the min and max each
    activation takes over them); the weights' ranges come from the weights themselves. Random
    inputs therefore give a graph with the same operators and the same speed, just not the
    accuracy a real calibration set gives.

    Args:
        src: the float32 ONNX graph, with one input.
        dst: where to write the int8 (QDQ) graph; overwritten if it exists.
        inputs: calibration inputs, ``(n, *input shape)`` float32; fed one sample at a time.
        work: an existing folder for the intermediate files: it gets ``pre.onnx`` (the graph after
            onnxruntime's pre-processing: shape inference and graph optimisation), which the caller
            may delete afterwards; ``dst`` may lie inside it.
        keep_float: layers whose operators stay float32 (a mixed plan): layer names
            (``features.conv1``) or ONNX node-name scopes (``/features/conv1/``).

    Raises:
        BackendError: ``keep_float`` names no operator of the graph.
    """
    import logging

    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = work / "pre.onnx"
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantiser logs per-tensor notes at WARNING on the root logger
    try:
        quant_pre_process(str(src), str(pre))
        name = ort.InferenceSession(str(pre), providers=["CPUExecutionProvider"]).get_inputs()[0].name
        exclude = _nodes_of(import_onnx("a mixed-precision graph").load(str(pre)), keep_float, src) if keep_float else []
        batches = [{name: inputs[i:i + 1]} for i in range(inputs.shape[0])]

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        # U8S8 QDQ, per-channel weights: onnxruntime's recommended CPU format (VNNI-friendly)
        quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=exclude)
    finally:
        logging.getLogger().setLevel(quiet)


def _nodes_of(model: Any, layers: Sequence[str], src: Path) -> list[str]:
    """The ONNX nodes of nestflex layer names: torch's exporter names a module's operators
    ``/features/conv1/Conv`` for the layer ``features.conv1``. A name that starts with ``/`` is a
    node-name scope already (:func:`slow_int8_layers` gives those)."""
    nodes = [n.name for n in model.graph.node]
    out, missing = [], []
    for layer in layers:
        prefix = layer if layer.startswith("/") else "/" + layer.replace(".", "/") + "/"
        hits = [n for n in nodes if n.startswith(prefix)]
        out += hits
        if not hits:
            missing.append(layer)
    if missing and len(missing) == len(layers):
        raise BackendError(f"none of the float layers of the precision plan ({', '.join(missing[:4])}) name an "
                           f"operator of {src.name} (its nodes look like {nodes[0] if nodes else 'nothing'!r}). "
                           f"HINT: plan onnxruntime_int8 for this bundle")
    return out
