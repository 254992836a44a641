"""An op program (a bundle's backbone, a cut stage, an exit head) as an ONNX model, without ``onnx``.

A bundle describes each component as an op program (``conv2d``, ``batch_norm``, pools,
``linear``, ``flatten``, ``add``/``sub``/``mul``, ``index_select``, ``param``, ...; see the
bundle schema's ``PROGRAM_OPS``) over safetensors weights. The torch runtime interprets it;
this module writes it as an ONNX graph that onnxruntime runs with only numpy installed, so a
device needs neither torch nor the ``onnx`` package (the protobuf is written by
:mod:`._proto`).

What the caller gives: the program's nodes (any objects with ``name``, ``op``, ``args``,
``attrs`` and ``level_params(level)``, as the bundle schema's ``ProgramNode`` has; ``params``
is read when ``level_params`` is absent), the weights as numpy arrays **already cut to the
level's region** (the caller pages them; a weight the program does not read is ignored), and the
shapes of the graph's inputs. Shapes are full shapes with ``None`` for the batch dimension,
``(None, 3, 32, 32)``; the graph's batch dimension is symbolic (``"batch"``), any batch runs.

How each op maps, and why:

* ``conv2d`` -> ``Conv`` (``depthwise``: one group per output channel); ``linear`` -> ``Gemm``
  (``transB=1``) on a 2-D input, ``MatMul`` with the transposed weight (+ ``Add``) otherwise;
  ``batch_norm`` -> ``BatchNormalization`` in inference mode, a missing affine weight or bias
  written as ones or zeros.
* ``relu``, ``identity`` -> ``Relu``, ``Identity``; ``relu6`` -> ``Clip(0, 6)``.
* ``max_pool2d`` -> ``MaxPool`` with torch's ``ceil_mode`` turned into explicit end padding
  (exact, and independent of how a runtime rounds): a window that starts inside the input but
  runs past its end sees padding, which max ignores; where onnxruntime refuses a pad as large
  as the kernel (dilated pools), a ``Pad`` with -inf comes first.
* ``avg_pool2d`` -> ``AveragePool`` when every window divides by what ONNX divides by (no
  ``divisor_override``, no window past the padded input); otherwise torch's divisor is rebuilt
  exactly: zero ``Pad`` + unpadded ``AveragePool`` + ``Mul`` by a per-position constant
  (``kernel area / torch's divisor``).
* ``adaptive_avg_pool2d`` / ``adaptive_max_pool2d``: output 1 -> ``GlobalAveragePool`` /
  ``GlobalMaxPool``; an output that evenly divides the (static) input -> the plain pool with
  kernel = stride = input / output (torch's windows are exactly those); otherwise (ONNX has no
  adaptive pool) torch's own windows, output ``i`` of an axis of ``n`` reading
  ``[floor(i n / out), ceil((i + 1) n / out))``: a ``Slice`` and a ``ReduceMax`` / ``ReduceMean``
  per output row, then per column (a max or mean over a rectangle is one over its rows, then its
  columns), joined by ``Concat``.
* ``flatten`` -> ``Flatten(axis=1)`` for ``(start_dim, end_dim) = (1, -1)``, ``Reshape``
  otherwise; ``index_select`` -> ``Gather``; ``matmul`` -> ``MatMul``; a transformer's
  ``layer_norm``, ``gelu``, ``softmax``, ``reshape``, ``transpose`` and ``mean`` as
  :mod:`._tokens` writes them; ``add``/``sub``/``mul`` -> ``Add``/``Sub``/``Mul``
  (numbers become scalar constants); ``param`` -> an initializer.

The static shapes that adaptive pools, reshapes and ceil-mode pools need come from a shape walk
(:func:`infer_shapes`) over the program, from the input shapes and the weights' shapes.

Floating-point weights are written as float32 (the activations' type); index tensors keep their
integer type. Graph values keep the program's node names, so a stage's inputs and outputs are fed
and read by the names :func:`cut_program` gives them.

Examples:
    >>> import numpy as np, onnxruntime as ort
    >>> from types import SimpleNamespace as Node
    >>> nodes = [Node(name="x", op="input", args=(), attrs={}, params=None),
    ...          Node(name="fc", op="linear", args=("x",), attrs={}, params={"weight": "w"}),
    ...          Node(name="out", op="output", args=("fc",), attrs={}, params=None)]
    >>> model = program_to_onnx(nodes, {"w": np.eye(2, dtype=np.float32)}, {"x": (None, 2)})
    >>> session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    >>> session.run(None, {"x": np.array([[1.0, 2.0]], np.float32)})[0].tolist()
    [[1.0, 2.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nestflex.deploy.onnxgraph import _proto as P
from nestflex.deploy.onnxgraph._errors import OnnxGraphError
from nestflex.deploy.onnxgraph._tokens import TOKEN_EMIT, TOKEN_SHAPES, matmul_shape

__all__ = ["BATCH", "SUPPORTED_OPS", "OnnxGraphError", "infer_shapes", "program_to_onnx", "stages_to_onnx"]

#: the symbolic name of the batch dimension in every graph's inputs and outputs
BATCH = "batch"

Shape = tuple  # of int, and None for the batch dimension
_FLOAT = np.dtype(np.float32)
_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


@dataclass(frozen=True)
class _Value:
    """What the shape walk knows of one value: its shape (``None``: the batch dimension) and dtype."""

    shape: Shape
    dtype: np.dtype


# --------------------------------------------------------------------------------------------
# reading nodes (duck-typed: the bundle schema's ProgramNode, or any object with its fields)


def _params(node: Any, level: int) -> Mapping[str, str]:
    per_level = getattr(node, "level_params", None)
    if not callable(per_level):
        return getattr(node, "params", None) or {}
    try:
        return per_level(level)
    except IndexError:  # params_per_level holds fewer levels
        raise _fail(node, f"has no params for `level` {level}", "pass a level of the program's capacity") from None


def _attrs(node: Any) -> Mapping[str, Any]:
    return getattr(node, "attrs", None) or {}


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def _where(node: Any) -> str:
    return f"node {node.name!r} ({node.op})"


def _fail(node: Any, message: str, hint: str | None = None) -> OnnxGraphError:
    return OnnxGraphError(f"{_where(node)}: {message}" + (f". HINT: {hint}" if hint else ""))


def _weights(node: Any, tensors: Mapping[str, Any], level: int) -> dict[str, Any]:
    """role -> array (or anything with ``.shape`` during the shape walk) of the node's params at ``level``."""
    out = {}
    for role, name in _params(node, level).items():
        if name not in tensors:
            raise _fail(node, f"its {role!r} is tensor {name!r}, which `tensors` does not hold",
                        f"pass every tensor the level reads (level {level}), cut to its region")
        out[role] = tensors[name]
    return out


# --------------------------------------------------------------------------------------------
# shapes


@dataclass(frozen=True)
class _Pool:
    """A pooling node's windows on its input, per spatial dimension (H, W)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]  # torch's padding, on both sides
    dilation: tuple[int, int]
    out: tuple[int, int]  # torch's output size
    end: tuple[int, int]  # the end padding that gives ``out`` under ONNX's floor-mode formula


def _pool_geometry(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> tuple[int, int]:
    """torch's output length of a pooling window along one dimension, and the end padding that
    makes ONNX's floor-mode formula give that length.

    torch (``pooling_output_shape``): ``(size + 2p - d(k-1) - 1 [+ s-1 if ceil]) // s + 1``, less
    one when ceil mode would start the last window past the input and its left padding. The end
    pad is at least ``p``; it is larger where ceil mode lets the last window overhang.
    """
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    span = (out - 1) * s + d * (k - 1) + 1  # padded length the windows cover
    return out, max(p, span - size - p)


def _pool(node: Any, x: _Value) -> _Pool:
    """The windows of a ``max_pool2d`` / ``avg_pool2d`` node on ``x``, checked as torch checks them."""
    at = _attrs(node)
    if len(x.shape) != 4:
        raise _fail(node, f"needs a 4-D input (N, C, H, W), got shape {_show(x.shape)}")
    kernel, stride = _pair(at["kernel_size"]), _pair(at.get("stride") or at["kernel_size"])  # torch: None = kernel
    pad, dilation = _pair(at.get("padding", 0)), _pair(at.get("dilation", 1))  # avg_pool2d has no dilation
    out, end = [], []
    for i in (0, 1):
        if 2 * pad[i] > kernel[i]:
            raise _fail(node, f"padding {pad[i]} is more than half the kernel {kernel[i]} (torch refuses it too)")
        n, e = _pool_geometry(x.shape[2 + i], kernel[i], stride[i], pad[i], dilation[i], bool(at.get("ceil_mode")))
        if n < 1:
            raise _fail(node, f"its window does not fit the input {_show(x.shape)} (output size {n})")
        out.append(n)
        end.append(e)
    return _Pool(kernel, stride, pad, dilation, (out[0], out[1]), (end[0], end[1]))


def _adaptive_size(node: Any, x: _Value) -> tuple[int, int]:
    if len(x.shape) != 4:
        raise _fail(node, f"needs a 4-D input (N, C, H, W), got shape {_show(x.shape)}")
    size = _attrs(node)["output_size"]
    pair = list(size) if isinstance(size, (list, tuple)) else [size, size]
    return tuple(x.shape[2 + i] if pair[i] is None else int(pair[i]) for i in (0, 1))  # None keeps the dim


def _adaptive_shape(node: Any, x: _Value) -> Shape:
    oh, ow = _adaptive_size(node, x)
    if oh < 1 or ow < 1:
        raise _fail(node, f"output size {(oh, ow)} must be positive")
    return (*x.shape[:2], oh, ow)


def _conv_shape(node: Any, x: _Value, w: Mapping[str, Any]) -> Shape:
    at = _attrs(node)
    weight = tuple(w["weight"].shape)
    if len(x.shape) != 4 or len(weight) != 4:
        raise _fail(node, f"needs a 4-D input and weight, got input {_show(x.shape)} and weight {weight}")
    groups = weight[0] if at.get("depthwise") else int(at.get("groups", 1))
    if x.shape[1] != weight[1] * groups:
        raise _fail(node, f"its input has {x.shape[1]} channels, its weight {weight} expects {weight[1] * groups} "
                          f"({weight[1]} x {groups} groups)", "the weights must be cut to the same level's region")
    stride, pad, dil = _pair(at.get("stride", 1)), _pair(at.get("padding", 0)), _pair(at.get("dilation", 1))
    out = [(x.shape[2 + i] + 2 * pad[i] - dil[i] * (weight[2 + i] - 1) - 1) // stride[i] + 1 for i in (0, 1)]
    if min(out) < 1:
        raise _fail(node, f"its kernel does not fit the input {_show(x.shape)} (output size {tuple(out)})")
    return (x.shape[0], weight[0], *out)


def _linear_shape(node: Any, x: _Value, w: Mapping[str, Any]) -> Shape:
    weight = tuple(w["weight"].shape)
    if len(weight) != 2 or not x.shape or x.shape[-1] != weight[1]:
        raise _fail(node, f"its input {_show(x.shape)} does not end in the weight's {weight[1:]} features",
                    "the weights must be cut to the same level's region")
    return (*x.shape[:-1], weight[0])


def _norm_shape(node: Any, x: _Value, w: Mapping[str, Any]) -> Shape:
    c = tuple(w["running_mean"].shape)
    if len(x.shape) < 2 or (x.shape[1],) != c:
        raise _fail(node, f"its input {_show(x.shape)} does not have the {c[0] if c else '?'} channels of its "
                          f"statistics", "the weights must be cut to the same level's region")
    return x.shape


def _dim(node: Any, d: int, rank: int, what: str) -> int:
    if not -rank <= d < max(rank, 1):
        raise _fail(node, f"`{what}` {d} is outside the input's {rank} dimensions")
    return d % rank if rank else 0


def _flatten_shape(node: Any, x: _Value) -> Shape:
    at, rank = _attrs(node), len(x.shape)
    start, end = _dim(node, at["start_dim"], rank, "start_dim"), _dim(node, at["end_dim"], rank, "end_dim")
    if start > end:
        raise _fail(node, f"start_dim {at['start_dim']} comes after end_dim {at['end_dim']}")
    merged = x.shape[start:end + 1]
    size = None if None in merged else math.prod(merged)
    return (*x.shape[:start], size, *x.shape[end + 1:])


def _broadcast(node: Any, a: Shape, b: Shape) -> Shape:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif da is None or db is None:  # the batch against a fixed size: the size (it must match at run time)
            out.append(db if da is None else da)
        else:
            raise _fail(node, f"shapes {_show(a)} and {_show(b)} do not broadcast")
    return tuple(reversed(out))


def _show(shape: Shape) -> str:
    return "(" + ", ".join("N" if d is None else str(d) for d in shape) + ")"


#: op -> fn(node, input value, weights) -> output shape, for ops with one tensor input (dtype kept)
_SHAPES: dict[str, Callable[[Any, _Value, Mapping[str, Any]], Shape]] = {
    "conv2d": _conv_shape,
    "linear": _linear_shape,
    "batch_norm": _norm_shape,
    "relu": lambda node, x, w: x.shape,
    "relu6": lambda node, x, w: x.shape,
    "identity": lambda node, x, w: x.shape,
    "max_pool2d": lambda node, x, w: (*x.shape[:2], *_pool(node, x).out),
    "avg_pool2d": lambda node, x, w: (*x.shape[:2], *_pool(node, x).out),
    "adaptive_avg_pool2d": lambda node, x, w: _adaptive_shape(node, x),
    "adaptive_max_pool2d": lambda node, x, w: _adaptive_shape(node, x),
    "flatten": lambda node, x, w: _flatten_shape(node, x),
    **TOKEN_SHAPES,  # transformers: layer_norm, gelu, softmax, reshape, transpose, mean (._tokens)
}
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul"}
_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
#: every op :func:`program_to_onnx` converts (the bundle schema's PROGRAM_OPS; a test keeps them in step)
SUPPORTED_OPS: tuple[str, ...] = ("input", "output", "param", *_SHAPES, *_BINARY, "index_select", "matmul")


def _array_dtype(node: Any, array: Any) -> np.dtype:
    """The dtype a weight is written with: floats as float32, index types as they are."""
    dtype = np.dtype(getattr(array, "dtype", _FLOAT))
    if dtype.kind == "f":
        return _FLOAT
    if dtype in _INDEX_DTYPES:
        return dtype
    raise _fail(node, f"a weight has dtype {dtype}; the graph holds float (written as float32), int64 or int32")


def _check_inputs(inputs: Mapping[str, Sequence[int | None]]) -> dict[str, _Value]:
    out = {}
    for name, shape in inputs.items():
        shape = tuple(shape)
        ok = all(d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0)
                 for d in shape) and None not in shape[1:]
        if not ok:
            raise OnnxGraphError(f"`inputs[{name!r}]` must be a shape of sizes >= 0 with None only first (the batch), "
                                 f"got {shape!r}. HINT: give full shapes, e.g. (None, 3, 32, 32)")
        out[name] = _Value(tuple(None if d is None else int(d) for d in shape), _FLOAT)
    return out


def _walk(nodes: Sequence[Any], tensors: Mapping[str, Any], inputs: Mapping[str, _Value],
          level: int, env: dict[str, _Value] | None = None) -> dict[str, _Value]:
    """Every value's shape and dtype, from the inputs' and the weights' shapes; raises on the first misfit
    (``env``, when given, holds the values computed up to it)."""
    env = {} if env is None else env
    env.update(inputs)

    def arg(node: Any, a: Any) -> _Value:
        if isinstance(a, str):
            if a not in env:
                raise _fail(node, f"reads {a!r}, which is neither an input nor an earlier node",
                            "a stage's inputs must list every value it reads from earlier stages")
            return env[a]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return _Value((), _FLOAT)
        raise _fail(node, f"has argument {a!r}; arguments are node names or numbers")

    for node in nodes:
        op = node.op
        if op not in SUPPORTED_OPS:
            raise _fail(node, f"op {op!r} has no ONNX conversion; supported ops: {', '.join(SUPPORTED_OPS)}")
        if op == "input":
            if node.name not in env:
                raise _fail(node, f"the program's input {node.name!r} has no shape in `inputs` (given: "
                                  f"{', '.join(map(repr, inputs)) or 'none'})")
        elif op == "output":
            for a in node.args:
                arg(node, a)
        elif op == "param":
            value = _weights(node, tensors, level)["value"]
            env[node.name] = _Value(tuple(value.shape), _array_dtype(node, value))
        elif op in _BINARY:
            a, b = (arg(node, x) for x in node.args)
            env[node.name] = _Value(_broadcast(node, a.shape, b.shape), a.dtype)
        elif op == "index_select":
            x, index = (arg(node, a) for a in node.args)
            if len(index.shape) != 1 or index.dtype not in _INDEX_DTYPES:
                raise _fail(node, f"its index must be a 1-D int64 or int32 tensor, got {index.dtype} "
                                  f"{_show(index.shape)}")
            d = _dim(node, int(_attrs(node)["dim"]), len(x.shape), "dim")
            env[node.name] = _Value((*x.shape[:d], index.shape[0], *x.shape[d + 1:]), x.dtype)
        elif op == "matmul":
            a, b = (arg(node, x) for x in node.args)
            env[node.name] = _Value(matmul_shape(node, a.shape, b.shape), a.dtype)
        else:
            x = arg(node, node.args[0])
            env[node.name] = _Value(_SHAPES[op](node, x, _weights(node, tensors, level)), x.dtype)
    return env


def infer_shapes(nodes: Sequence[Any], tensors: Mapping[str, Any], inputs: Mapping[str, Sequence[int | None]],
                 level: int = 0, partial: dict[str, Shape] | None = None) -> dict[str, Shape]:
    """The shape of every value a program computes, from its input shapes and its weights' shapes.

    Args:
        nodes: the program's nodes in order (a whole program or one cut stage).
        tensors: tensor name -> array (or anything with a ``.shape``), cut to the level's region.
        inputs: input name -> full shape, ``None`` for the batch: ``{"x": (None, 3, 32, 32)}``.
        level: the level whose params the nodes read (``level_params``).
        partial: a dict that receives the shapes as they are inferred, so a caller still has
            those computed before a misfit raises (a blown-up activation is the root cause
            when a later node then fails on it).

    Returns:
        value name -> full shape (``None`` for the batch), the inputs included; a ``param``'s
        shape is its tensor's (no batch).

    Raises:
        OnnxGraphError: an op without a conversion, a missing tensor or input shape, an argument
            that names no earlier value, a shape a node cannot take (named in the message).

    Examples:
        >>> from types import SimpleNamespace as Node
        >>> pool = Node(name="pool", op="max_pool2d", args=("x",), params=None, attrs={
        ...     "kernel_size": 3, "stride": 2, "padding": 0, "dilation": 1, "ceil_mode": True})
        >>> infer_shapes([pool], {}, {"x": (None, 8, 6, 6)})["pool"]
        (None, 8, 3, 3)
    """
    env: dict[str, _Value] = {}
    try:
        _walk(nodes, tensors, _check_inputs(inputs), level, env)
    finally:
        if partial is not None:
            partial.update({k: v.shape for k, v in env.items()})
    return {k: v.shape for k, v in env.items()}


# --------------------------------------------------------------------------------------------
# the graph


class _Graph:
    """The ONNX graph under construction: nodes, initializers, and unique value names."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.nodes: list[P.Message] = []
        self.initializers: list[P.Message] = []
        self.taken = set(taken)  # program names first: helpers never take a name the program uses
        self._consts: dict[Any, str] = {}

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def weight(self, key: Any, base: str, make: Callable[[], np.ndarray]) -> str:
        """An initializer, once per ``key`` (a tensor read by several nodes is stored once)."""
        if key not in self._consts:
            name = self.fresh(base)
            self.initializers.append(P.tensor(name, make()))
            self._consts[key] = name
        return self._consts[key]

    def const(self, value: Any, dtype: Any, base: str) -> str:
        array = np.asarray(value, dtype=dtype)
        return self.weight(("const", array.dtype.str, array.shape, array.tobytes()), base, lambda: array)

    def add(self, op_type: str, inputs: Sequence[str], output: str, name: str, *attrs: P.Message) -> str:
        self.nodes.append(P.node(op_type, inputs, [output], name, attrs))
        return output


def _float(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=_FLOAT)


def _emit_conv(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    at = _attrs(node)
    weight = arrays["weight"]
    pad = _pair(at.get("padding", 0))
    groups = weight.shape[0] if at.get("depthwise") else int(at.get("groups", 1))
    g.add("Conv", [x, w["weight"], *([w["bias"]] if "bias" in w else [])], node.name, node.name,
          P.attr_ints("kernel_shape", weight.shape[2:]), P.attr_ints("strides", _pair(at.get("stride", 1))),
          P.attr_ints("pads", [*pad, *pad]), P.attr_ints("dilations", _pair(at.get("dilation", 1))),
          P.attr_int("group", groups))


def _emit_linear(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    bias = [w["bias"]] if "bias" in w else []
    if len(xv.shape) == 2:  # Gemm reads the (out, in) weight as it is stored
        g.add("Gemm", [x, w["weight"], *bias], node.name, node.name, P.attr_int("transB", 1))
        return
    wt = g.weight((w["weight"], "T"), f"{w['weight']}.T",
                  lambda: np.ascontiguousarray(_float(arrays["weight"]).T))
    if not bias:
        g.add("MatMul", [x, wt], node.name, node.name)
        return
    product = g.add("MatMul", [x, wt], g.fresh(f"{node.name}/matmul"), f"{node.name}/matmul")
    g.add("Add", [product, bias[0]], node.name, node.name)


def _emit_norm(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    c = arrays["running_mean"].shape[0]
    scale = w["weight"] if "weight" in w else g.const(np.ones(c), _FLOAT, f"{node.name}.weight")
    shift = w["bias"] if "bias" in w else g.const(np.zeros(c), _FLOAT, f"{node.name}.bias")
    g.add("BatchNormalization", [x, scale, shift, w["running_mean"], w["running_var"]], node.name, node.name,
          P.attr_float("epsilon", float(_attrs(node)["eps"])))


def _emit_max_pool(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    pool = _pool(node, xv)
    pads = [*pool.pad, *pool.end]
    if any(p >= k for p, k in zip(pads, [*pool.kernel, *pool.kernel])):  # onnxruntime wants pads below the kernel
        x = _pad(g, node, x, pads, -np.inf)
        pads = [0, 0, 0, 0]
    g.add("MaxPool", [x], node.name, node.name, P.attr_ints("kernel_shape", pool.kernel),
          P.attr_ints("strides", pool.stride), P.attr_ints("pads", pads), P.attr_ints("dilations", pool.dilation))


def _pad(g: _Graph, node: Any, x: str, pads: Sequence[int], value: float) -> str:
    """``x`` (N, C, H, W) padded by ``pads`` = (top, left, bottom, right) with the constant ``value``."""
    top, left, bottom, right = pads
    amounts = g.const([0, 0, top, left, 0, 0, bottom, right], np.int64, f"{node.name}/pads")
    fill = g.const(value, _FLOAT, f"{node.name}/pad_value")
    return g.add("Pad", [x, amounts, fill], g.fresh(f"{node.name}/pad"), f"{node.name}/pad")


def _avg_divisors(size: int, k: int, s: int, p: int, out: int, include_pad: bool) -> np.ndarray:
    """torch's divisor per output position along one dimension (``avg_pool2d``'s CPU kernel):
    the window clipped to the padded input when padding counts, to the input when it does not."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if include_pad:
        return (end - start).astype(np.float64)
    return (np.minimum(end, size) - np.maximum(start, 0)).astype(np.float64)


def _emit_avg_pool(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    at, pool = _attrs(node), _pool(node, xv)
    include_pad, override = bool(at.get("count_include_pad", True)), at.get("divisor_override")
    if override is None and pool.end == pool.pad:
        # every window lies inside the padded input: ONNX divides as torch does (by the kernel
        # area with padding counted, by the input elements without)
        g.add("AveragePool", [x], node.name, node.name, P.attr_ints("kernel_shape", pool.kernel),
              P.attr_ints("strides", pool.stride), P.attr_ints("pads", [*pool.pad, *pool.pad]),
              P.attr_int("count_include_pad", int(include_pad and any(pool.pad))))
        return
    # torch's own divisor: window means over zero padding (ONNX divides by the kernel area),
    # times area / torch's divisor per output position
    if any(pool.pad) or any(pool.end):
        x = _pad(g, node, x, [*pool.pad, *pool.end], 0.0)
    mean = g.add("AveragePool", [x], g.fresh(f"{node.name}/mean"), f"{node.name}/mean",
                 P.attr_ints("kernel_shape", pool.kernel), P.attr_ints("strides", pool.stride))
    area = pool.kernel[0] * pool.kernel[1]
    if override is not None:
        factor = np.asarray(area / int(override))
    else:
        rows, cols = (_avg_divisors(xv.shape[2 + i], pool.kernel[i], pool.stride[i], pool.pad[i], pool.out[i],
                                    include_pad) for i in (0, 1))
        factor = area / np.outer(rows, cols)
    g.add("Mul", [mean, g.const(factor, _FLOAT, f"{node.name}/scale")], node.name, node.name)


def _emit_adaptive(kind: str) -> Callable[..., None]:
    def emit(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
        oh, ow = _adaptive_size(node, xv)
        if (oh, ow) == (1, 1):
            g.add(f"Global{kind}Pool", [x], node.name, node.name)
            return
        h, w = xv.shape[2:]
        if h % oh == 0 and w % ow == 0:  # torch's windows are exactly a plain pool's
            kernel = (h // oh, w // ow)
            g.add(f"{kind}Pool", [x], node.name, node.name, P.attr_ints("kernel_shape", kernel),
                  P.attr_ints("strides", kernel))
            return
        # torch's windows otherwise: output i of an axis of n reads [floor(i n / out), ceil((i + 1) n / out)),
        # each axis in turn (a max or mean over a rectangle is one over its rows, then its columns)
        reduce = {"Max": "ReduceMax", "Average": "ReduceMean"}[kind]
        value = x
        for axis, n, out in ((2, h, oh), (3, w, ow)):
            if n == out:
                continue
            parts = []
            for i in range(out):
                start, end = (i * n) // out, -((-(i + 1) * n) // out)
                piece = g.add("Slice", [value, g.const([start], np.int64, "start"), g.const([end], np.int64, "end"),
                                        g.const([axis], np.int64, "axis")], g.fresh(f"{node.name}_slice"),
                              g.fresh(f"{node.name}_slice"))
                parts.append(g.add(reduce, [piece], g.fresh(f"{node.name}_reduce"), g.fresh(f"{node.name}_reduce"),
                                   P.attr_ints("axes", [axis]), P.attr_int("keepdims", 1)))
            value = g.add("Concat", parts, g.fresh(f"{node.name}_axis{axis}"), g.fresh(f"{node.name}_axis{axis}"),
                          P.attr_int("axis", axis))
        g.add("Identity", [value], node.name, node.name)

    return emit


def _emit_flatten(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    at, rank = _attrs(node), len(xv.shape)
    start, end = _dim(node, at["start_dim"], rank, "start_dim"), _dim(node, at["end_dim"], rank, "end_dim")
    if start == 1 and end == rank - 1:
        g.add("Flatten", [x], node.name, node.name, P.attr_int("axis", 1))
        return
    if start == end:
        g.add("Identity", [x], node.name, node.name)
        return
    shape = _flatten_shape(node, xv)
    # 0 copies the input's (batch) size, -1 takes what is left: the one size not known until run time
    target = [0 if d is None and i == 0 and start > 0 else (-1 if d is None else d) for i, d in enumerate(shape)]
    g.add("Reshape", [x, g.const(target, np.int64, f"{node.name}/shape")], node.name, node.name)


def _unary(op_type: str) -> Callable[..., None]:
    return lambda g, node, x, xv, w, arrays: g.add(op_type, [x], node.name, node.name)


def _emit_relu6(g: _Graph, node: Any, x: str, xv: _Value, w: Mapping[str, str], arrays: Mapping[str, Any]) -> None:
    g.add("Clip", [x, g.const(0.0, _FLOAT, "zero"), g.const(6.0, _FLOAT, "six")], node.name, node.name)


#: op -> fn(graph, node, input value name, input value, role -> initializer name, role -> array)
_EMIT: dict[str, Callable[..., None]] = {
    "conv2d": _emit_conv,
    "linear": _emit_linear,
    "batch_norm": _emit_norm,
    "relu": _unary("Relu"),
    "relu6": _emit_relu6,
    "identity": _unary("Identity"),
    "max_pool2d": _emit_max_pool,
    "avg_pool2d": _emit_avg_pool,
    "adaptive_avg_pool2d": _emit_adaptive("Average"),
    "adaptive_max_pool2d": _emit_adaptive("Max"),
    "flatten": _emit_flatten,
    **TOKEN_EMIT,
}
assert set(_EMIT) == set(_SHAPES)


def _convert(nodes: Sequence[Any], tensors: Mapping[str, Any], inputs: Mapping[str, _Value], outputs: Sequence[str],
             level: int, name: str, producer: str) -> tuple[bytes, dict[str, _Value]]:
    values = _walk(nodes, tensors, inputs, level)
    if not outputs:
        last = [n for n in nodes if n.op == "output"]
        if not last:
            raise OnnxGraphError("the program has no `output` node and `outputs` is empty. HINT: name the values the "
                                 "graph returns (a cut stage's outputs, as cut_program gives them)")
        outputs = [a for a in last[-1].args if isinstance(a, str)]
    for o in outputs:
        if o not in values:
            raise OnnxGraphError(f"`outputs` names {o!r}, which is neither an input nor a node of the program")
    g = _Graph([*inputs, *(n.name for n in nodes)])
    env: dict[str, str] = {k: k for k in inputs}  # program value -> graph value

    def initializer(node: Any, tensor: str) -> str:  # named after the tensor, stored once however often read
        return g.weight(tensor, tensor, lambda: np.asarray(tensors[tensor], dtype=_array_dtype(node, tensors[tensor])))

    def arg(a: Any) -> str:
        return env[a] if isinstance(a, str) else g.const(a, _FLOAT, f"scalar_{a}".replace(".", "_").replace("-", "m"))

    for node in nodes:
        op = node.op
        if op in ("input", "output"):
            continue
        if op == "param":
            env[node.name] = initializer(node, _params(node, level)["value"])
            continue
        if op in _BINARY:
            a, b = node.args
            if not isinstance(a, str) and not isinstance(b, str):  # two numbers: the result is a constant
                env[node.name] = g.const(_FOLD[op](a, b), _FLOAT, node.name)
                continue
            g.add(_BINARY[op], [arg(a), arg(b)], node.name, node.name)
        elif op == "index_select":
            data, index = node.args
            g.add("Gather", [env[data], env[index]], node.name, node.name,
                  P.attr_int("axis", int(_attrs(node)["dim"])))
        elif op == "matmul":
            g.add("MatMul", [env[a] for a in node.args], node.name, node.name)
        else:
            params = _params(node, level)
            names = {role: initializer(node, t) for role, t in params.items()}
            arrays = {role: tensors[t] for role, t in params.items()}
            _EMIT[op](g, node, env[node.args[0]], values[node.args[0]], names, arrays)
        env[node.name] = node.name
    # graph outputs keep the program's names; a value stored under another name (a param's
    # initializer, a folded constant) or returned twice goes out through an Identity. An input
    # returned as it is (a skip connection that crosses a stage untouched) is a valid output.
    out_infos, returned = [], set()
    for o in outputs:
        value = env[o]
        if value != o or value in returned:
            value = g.add("Identity", [value], g.fresh(f"{o}/out"), f"{o}/out")
        returned.add(value)
        v = values[o]
        out_infos.append(P.value_info(value, P.DATA_TYPES[v.dtype], [BATCH if d is None else d for d in v.shape]))
    in_infos = [P.value_info(k, P.FLOAT, [BATCH if d is None else d for d in v.shape]) for k, v in inputs.items()]
    graph = P.graph(name, g.nodes, in_infos, out_infos, g.initializers)
    return P.model(graph, producer=producer), values


def program_to_onnx(nodes: Sequence[Any], tensors: Mapping[str, Any], inputs: Mapping[str, Sequence[int | None]],
                    outputs: Sequence[str] = (), *, level: int = 0, name: str = "nestflex_program",
                    producer: str = "nestflex") -> bytes:
    """A program (or one cut stage) as a serialised ONNX model (opset 17) that onnxruntime runs.

    Args:
        nodes: the nodes in execution order (``ProgramNode`` or any object with ``name``, ``op``,
            ``args``, ``attrs`` and ``level_params(level)`` or ``params``). A cut stage's nodes
            come without the program's ``input`` node: its inputs are the earlier values it reads.
        tensors: tensor name -> numpy array, already cut to ``level``'s region; floats are
            written as float32, index tensors as int64/int32. Tensors no node reads are ignored.
        inputs: the graph's inputs, name -> full shape with ``None`` for the batch, in order:
            ``{"x": (None, 3, 32, 32)}``; for a stage, the shapes of the values it receives
            (:func:`infer_shapes` on the whole program gives them, or use :func:`stages_to_onnx`).
        outputs: the values the graph returns, in order (a stage's, as ``cut_program`` gives
            them); empty: the ``output`` node's arguments.
        level: the level whose params the nodes read (``level_params(level)``).
        name: the graph's name.
        producer: the model's ``producer_name``.

    Returns:
        The ModelProto's bytes. Inputs and outputs keep the program's names; the batch dimension
        is symbolic (``"batch"``).

    Raises:
        OnnxGraphError: an op outside :data:`SUPPORTED_OPS`, a missing tensor or input shape, a
            shape a node cannot take, an output that names no value.

    Examples:
        >>> import numpy as np
        >>> from types import SimpleNamespace as Node
        >>> relu = Node(name="r", op="relu", args=("x",), attrs={}, params=None)
        >>> model = program_to_onnx([relu], {}, {"x": (None, 4)}, ["r"])
        >>> model[:2]  # ModelProto field 1 (ir_version), varint 8
        b'\\x08\\x08'
    """
    return _convert(nodes, tensors, _check_inputs(inputs), list(outputs), level, name, producer)[0]


def stages_to_onnx(stages: Sequence[tuple[Sequence[str], Sequence[Any], Sequence[str]]], tensors: Mapping[str, Any],
                   inputs: Mapping[str, Sequence[int | None]], *, level: int = 0, name: str = "nestflex_stage",
                   producer: str = "nestflex") -> list[bytes]:
    """Every stage of a cut program as its own ONNX model, the shapes handed from stage to stage.

    Args:
        stages: ``(inputs, nodes, outputs)`` per stage, as ``cut_program`` returns them.
        tensors: tensor name -> numpy array, already cut to ``level``'s region (as for
            :func:`program_to_onnx`).
        inputs: the first stage's input shapes (``{"x": (None, 3, 32, 32)}``).
        level: the level whose params the nodes read (``level_params(level)``).
        name: the graphs' names, suffixed with the stage number.
        producer: the models' ``producer_name``.

    Returns:
        One model per stage; stage ``k`` takes stage ``k - 1``'s outputs by name.

    Raises:
        OnnxGraphError: as :func:`program_to_onnx`, or a stage reads a value no earlier stage made.
    """
    known = _check_inputs(inputs)
    models = []
    for k, (ins, body, outs) in enumerate(stages):
        missing = [i for i in ins if i not in known]
        if missing:
            raise OnnxGraphError(f"stage {k} reads {missing}, which no earlier stage computes and `inputs` does not "
                                 f"give. HINT: pass the stages of one program, in order, as cut_program returns them")
        model, values = _convert(body, tensors, {i: known[i] for i in ins}, list(outs), level, f"{name}_{k}", producer)
        known.update(values)
        models.append(model)
    return models
