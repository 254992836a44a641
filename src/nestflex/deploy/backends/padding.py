"""Zero-pad a level's channel counts to a multiple (hardware-friendly widths at deploy time).

Pruning leaves widths such as 7, 17 or 39; onnxruntime's blocked (NCHWc) convolutions and its
int8 kernels work in blocks of 8 or 16 channels, and odd widths fall back to slower paths
(docs/synthesis.md measures it). Rounding widths while pruning (``round_to``) fixes that at
training time; this pass does it to any exported level without retraining: every convolution
and fully-connected layer gets zero output channels up to the next multiple, and the layers that
read them get zero input weights for them. The padded channels never reach a real output (every
layer that mixes channels has zero weights for them), so the logits are the same; the padded
level does more MACs but runs the faster kernels.

Supported between the padded layers: per-channel ops (activations, pooling, BatchNormalization,
Dropout, Identity), Add/Sub/Mul/Div of two equally padded tensors or a scalar, and Flatten of an
NCHW tensor into a Gemm. Anything else that reads a padded tensor (Concat, Reshape, Transpose,
grouped convolutions, ...) raises :class:`PaddingError`: the level is then simply not padded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nestflex._io import atomic_write_bytes
from nestflex.deploy.backends._onnx import import_onnx
from nestflex.errors import NestflexError

__all__ = ["PaddingError", "pad_channels"]

# ops that act on each channel alone: a padded input gives an equally padded output
_PER_CHANNEL = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Gelu",
                "Erf", "Softplus", "Identity", "Dropout", "MaxPool", "AveragePool", "GlobalAveragePool",
                "GlobalMaxPool", "LpPool"}
_BINARY = {"Add", "Sub", "Mul", "Div"}


class PaddingError(NestflexError, ValueError):
    """The graph has an operator the channel padding does not support."""


def _round_up(c: int, multiple: int) -> int:
    return -(-c // multiple) * multiple


def pad_channels(src: Path, dst: Path, multiple: int = 8) -> dict[str, Any]:
    """Write ``src`` (an ONNX file) with every Conv/Gemm output width rounded up to ``multiple`` to
    ``dst`` (atomically); returns ``{"padded": layers padded, "widths": {layer: [before, after]}}``.

    Raises:
        PaddingError: an operator reads a padded tensor in a way the pass does not support, or
            ``multiple`` is not an int >= 2.
        MissingOnnxError: the ``onnx`` package (``nestflex[tune]``) is not installed.
    """
    import numpy as np

    onnx = import_onnx(f"the padded graph of {Path(src).name}")
    from onnx import numpy_helper

    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 2:
        raise PaddingError(f"`multiple` must be an int >= 2, got {multiple!r}")
    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses: dict[str, int] = {}
    for node in g.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(g.value_info) + list(g.input) + list(g.output)}
    pad: dict[str, tuple[int, int]] = {}  # tensor -> (real, padded) size of its axis 1
    widths: dict[str, list[int]] = {}

    def array(name: str) -> Any:
        return numpy_helper.to_array(inits[name])

    def put(name: str, value: Any) -> None:
        if uses.get(name, 0) > 1:
            raise PaddingError(f"initializer {name!r} is shared by several operators")
        inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value), name))

    def grow(a: Any, axis: int, size: int, fill: float = 0.0) -> Any:
        if a.shape[axis] == size:
            return a
        widths_ = [(0, 0)] * a.ndim
        widths_[axis] = (0, size - a.shape[axis])
        return np.pad(a, widths_, constant_values=fill)

    def attr(node: Any, key: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == key:
                return onnx.helper.get_attribute_value(a)
        return default

    def widen(node: Any, out: str, size: int, real: int) -> None:
        if out not in outputs and size % multiple:
            wide = _round_up(size, multiple)
            pad[out] = (real, wide)
            widths[node.name or out] = [size, wide]

    for node in g.node:
        padded_in = [i for i in node.input if i in pad]
        op = node.op_type
        if op == "Conv":
            if attr(node, "group", 1) != 1:  # depthwise / grouped: left as is, and must not read padding
                if padded_in:
                    raise PaddingError(f"grouped Conv {node.name!r} reads a padded tensor")
                continue
            if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
                raise PaddingError(f"Conv {node.name!r} has weights computed in the graph")
            w = array(node.input[1])
            if node.input[0] in pad:
                w = grow(w, 1, pad[node.input[0]][1])
            out_c = w.shape[0]
            widen(node, node.output[0], out_c, out_c)
            if node.output[0] in pad:
                w = grow(w, 0, pad[node.output[0]][1])
                if len(node.input) > 2 and node.input[2]:
                    put(node.input[2], grow(array(node.input[2]), 0, pad[node.output[0]][1]))
            put(node.input[1], w)
        elif op == "Gemm":
            if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
                raise PaddingError(f"Gemm {node.name!r} has weights computed in the graph")
            if attr(node, "transA", 0):
                raise PaddingError(f"Gemm {node.name!r} transposes its input")
            trans_b = attr(node, "transB", 0)
            w = array(node.input[1])
            in_axis, out_axis = (1, 0) if trans_b else (0, 1)
            if node.input[0] in pad:  # the padded features sit after the real ones (channel-major)
                w = grow(w, in_axis, pad[node.input[0]][1])
            out_f = w.shape[out_axis]
            widen(node, node.output[0], out_f, out_f)
            if node.output[0] in pad:
                w = grow(w, out_axis, pad[node.output[0]][1])
                if len(node.input) > 2 and node.input[2]:
                    b = array(node.input[2])
                    if b.ndim != 1 or b.shape[0] != out_f:
                        raise PaddingError(f"Gemm {node.name!r} has a broadcast bias of shape {b.shape}")
                    put(node.input[2], grow(b, 0, pad[node.output[0]][1]))
            put(node.input[1], w)
        elif not padded_in:
            continue
        elif op in _PER_CHANNEL:
            pad[node.output[0]] = pad[node.input[0]]
        elif op == "BatchNormalization":
            real, wide = pad[node.input[0]]
            for name, fill in zip(node.input[1:5], (1.0, 0.0, 0.0, 1.0)):  # scale, bias, mean, var
                if name not in inits:
                    raise PaddingError(f"BatchNormalization {node.name!r} has statistics computed in the graph")
                put(name, grow(array(name), 0, wide, fill))
            pad[node.output[0]] = (real, wide)
        elif op in _BINARY:
            others = [i for i in node.input if i not in pad]
            if len(set(pad[i] for i in padded_in)) != 1 or any(
                    i not in inits or array(i).size != 1 for i in others):
                raise PaddingError(f"{op} {node.name!r} mixes a padded tensor with one that is not (or padded "
                                   f"differently)")
            if op == "Div" and (node.input[1] in pad or float(array(node.input[1]).reshape(())) == 0):
                raise PaddingError(f"Div {node.name!r} divides by a padded tensor (0 / 0 in the padding)")
            pad[node.output[0]] = pad[padded_in[0]]
        elif op == "Flatten" and attr(node, "axis", 1) == 1:
            shape = shapes.get(node.input[0], [])
            if len(shape) == 2:
                pad[node.output[0]] = pad[node.input[0]]
            elif len(shape) >= 3 and all(s > 0 for s in shape[2:]):
                real, wide = pad[node.input[0]]
                spatial = int(np.prod(shape[2:]))
                pad[node.output[0]] = (real * spatial, wide * spatial)
            else:
                raise PaddingError(f"Flatten {node.name!r}: its input's spatial size is not known")
        else:
            raise PaddingError(f"{op} {node.name!r} reads a padded tensor; the padding supports per-channel ops, "
                               f"Conv, Gemm, BatchNormalization, Add/Sub/Mul/Div and Flatten")
    leaked = [o for o in outputs if o in pad]
    if leaked:
        raise PaddingError(f"graph output {leaked[0]!r} would be padded")
    for v in list(g.value_info):  # the inferred shapes are stale now; onnxruntime infers its own
        g.value_info.remove(v)
    atomic_write_bytes(dst, model.SerializeToString())
    return {"padded": len(widths), "widths": widths}

