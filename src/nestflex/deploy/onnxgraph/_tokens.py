"""The ops of a transformer in an op program, as ONNX (issue 40): shapes and emitters.

A ViT's blocks read and write token tensors ``(N, T, C)``: ``layer_norm`` over the last dim,
``gelu``, the attention's ``reshape`` to heads, ``transpose``, ``matmul`` and ``softmax``, and a
``mean`` over the tokens to pool them. Each maps to one ONNX op of opset 17, but ``gelu`` (ONNX's
``Gelu`` is opset 20): it is written as torch computes its exact form, ``x * (1 + erf(x / sqrt 2)) / 2``.

``reshape`` carries its target shape as numbers; the one ``-1`` in it is the batch (an ONNX
``Reshape`` infers it at run time, as torch does), so a reshape that mixes the batch with other
dimensions is refused when the program is read, not at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nestflex.deploy.onnxgraph import _proto as P
from nestflex.deploy.onnxgraph._errors import OnnxGraphError

__all__ = ["TOKEN_EMIT", "TOKEN_SHAPES", "matmul_shape"]

_FLOAT = np.dtype(np.float32)


def _fail(node: Any, message: str) -> OnnxGraphError:
    return OnnxGraphError(f"node {node.name!r} ({node.op}): {message}")


def _dim(node: Any, d: int, rank: int) -> int:
    if not -rank <= d < rank:
        raise _fail(node, f"dim {d} is outside the input's {rank} dimensions")
    return d % rank


def _transpose_shape(node: Any, x: Any, w: Mapping[str, Any]) -> tuple:
    a, b = (_dim(node, int(node.attrs[k]), len(x.shape)) for k in ("dim0", "dim1"))
    if 0 in (a, b) and a != b:
        raise _fail(node, "moves the batch dimension; the program keeps it first")
    shape = list(x.shape)
    shape[a], shape[b] = shape[b], shape[a]
    return tuple(shape)


def _reshape_shape(node: Any, x: Any, w: Mapping[str, Any]) -> tuple:
    target = [int(d) for d in node.attrs["shape"]]
    per_sample = math.prod(d for d in x.shape if d is not None)
    rest = math.prod(d for d in target[1:])
    if x.shape[:1] != (None,) or target[0] != -1 or any(d < 1 for d in target[1:]) or rest != per_sample:
        raise _fail(node, f"reshapes {tuple(x.shape)} to {tuple(target)}; the program reshapes each sample "
                          f"(-1 first, the batch, then {per_sample} elements in positive sizes)")
    return (None, *target[1:])


def _mean_shape(node: Any, x: Any, w: Mapping[str, Any]) -> tuple:
    d = _dim(node, int(node.attrs["dim"]), len(x.shape))
    if d == 0:
        raise _fail(node, "averages over the batch")
    keep = bool(node.attrs.get("keepdim", False))
    return (*x.shape[:d], *((1,) if keep else ()), *x.shape[d + 1:])


def _layer_norm_shape(node: Any, x: Any, w: Mapping[str, Any]) -> tuple:
    c = int(node.attrs["channels"])
    if not x.shape or x.shape[-1] != c or ("weight" in w and tuple(w["weight"].shape) != (c,)):
        raise _fail(node, f"its input {tuple(x.shape)} does not end in the {c} channels it normalises")
    return x.shape


def matmul_shape(node: Any, a: tuple, b: tuple) -> tuple:
    """The shape of ``a @ b`` for two batched operands of one rank (attention's products)."""
    if len(a) != len(b) or len(a) < 3 or a[-1] != b[-2] or a[:-2] != b[:-2]:
        raise _fail(node, f"multiplies {a} by {b}; the program multiplies batched matrices of one rank "
                          f"(..., n, k) @ (..., k, m)")
    return (*a[:-1], b[-1])


#: op -> fn(node, input value, weights) -> output shape (one tensor input)
TOKEN_SHAPES: dict[str, Callable[[Any, Any, Mapping[str, Any]], tuple]] = {
    "transpose": _transpose_shape,
    "reshape": _reshape_shape,
    "softmax": lambda node, x, w: (_dim(node, int(node.attrs["dim"]), len(x.shape)), x.shape)[1],
    "gelu": lambda node, x, w: x.shape,
    "mean": _mean_shape,
    "layer_norm": _layer_norm_shape,
}


def _emit_transpose(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    rank = len(xv.shape)
    perm = list(range(rank))
    a, b = (_dim(node, int(node.attrs[k]), rank) for k in ("dim0", "dim1"))
    perm[a], perm[b] = perm[b], perm[a]
    g.add("Transpose", [x], node.name, node.name, P.attr_ints("perm", perm))


def _emit_reshape(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    target = [int(d) for d in node.attrs["shape"]]
    g.add("Reshape", [x, g.const(target, np.int64, f"{node.name}/shape")], node.name, node.name)


def _emit_softmax(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    g.add("Softmax", [x], node.name, node.name, P.attr_int("axis", _dim(node, int(node.attrs["dim"]), len(xv.shape))))


def _emit_gelu(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    scaled = g.add("Div", [x, g.const(math.sqrt(2.0), _FLOAT, "sqrt2")], g.fresh(f"{node.name}/scaled"),
                   f"{node.name}/scaled")
    erf = g.add("Erf", [scaled], g.fresh(f"{node.name}/erf"), f"{node.name}/erf")
    plus = g.add("Add", [erf, g.const(1.0, _FLOAT, "one")], g.fresh(f"{node.name}/plus"), f"{node.name}/plus")
    half = g.add("Mul", [x, g.const(0.5, _FLOAT, "half")], g.fresh(f"{node.name}/half"), f"{node.name}/half")
    g.add("Mul", [half, plus], node.name, node.name)


def _emit_mean(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    d = _dim(node, int(node.attrs["dim"]), len(xv.shape))
    g.add("ReduceMean", [x], node.name, node.name, P.attr_ints("axes", [d]),
          P.attr_int("keepdims", int(bool(node.attrs.get("keepdim", False)))))


def _emit_layer_norm(g: Any, node: Any, x: str, xv: Any, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    c = xv.shape[-1]
    scale = w["weight"] if "weight" in w else g.const(np.ones(c), _FLOAT, f"{node.name}.weight")
    inputs = [x, scale, *([w["bias"]] if "bias" in w else [])]
    g.add("LayerNormalization", inputs, node.name, node.name, P.attr_int("axis", -1),
          P.attr_float("epsilon", float(node.attrs["eps"])))


#: op -> fn(graph, node, input value name, input value, role -> initializer name, role -> array)
TOKEN_EMIT: dict[str, Callable[..., None]] = {
    "transpose": _emit_transpose,
    "reshape": _emit_reshape,
    "softmax": _emit_softmax,
    "gelu": _emit_gelu,
    "mean": _emit_mean,
    "layer_norm": _emit_layer_norm,
}
assert set(TOKEN_EMIT) == set(TOKEN_SHAPES)
