"""Translate a traced network into the op program the deploy runtime interprets.

The program is a JSON list of nodes in execution order (``nestflex.deploy.runtime`` runs it):
``{"name", "op", "args", "attrs", "params" | "params_per_level"}``. ``args`` are node names
(strings) or numbers. ``params`` map a role (``weight``, ``bias``, ...) to a tensor name in
``weights.safetensors``. A switchable BatchNorm has ``params_per_level`` instead, one mapping per
level. Nested conv/linear tensors get a ``regions`` entry: the prefix shape each level uses.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from nestflex.capacity.nested import NestedConv2d, NestedLinear, NestedNorm
from nestflex.errors import GraphError, NestflexError
from nestflex.graph._tracer import trace_module

__all__ = ["ExportError", "Program", "build_program"]


class ExportError(NestflexError, ValueError):
    """A model, exit network or export argument cannot be written as a bundle."""


class Program:
    """The nodes of one component, the tensors they read and the per-level regions of nested ones."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.regions: dict[str, list[list[int] | None]] = {}


_FUNCTIONS: dict[Any, str] = {
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub",
    operator.mul: "mul", torch.mul: "mul", operator.iadd: "add", operator.imul: "mul",
    F.relu: "relu", torch.relu: "relu", torch.flatten: "flatten", torch.index_select: "index_select",
    # transformers (issue 40): attention products, token layouts, pooling over tokens
    operator.matmul: "matmul", torch.matmul: "matmul", torch.transpose: "transpose", torch.reshape: "reshape",
    torch.softmax: "softmax", F.softmax: "softmax", torch.mean: "mean", F.gelu: "gelu",
}
_METHODS = {"flatten": "flatten", "relu": "relu", "add": "add", "mul": "mul", "sub": "sub",
            "index_select": "index_select", "matmul": "matmul", "transpose": "transpose", "reshape": "reshape",
            "view": "reshape", "softmax": "softmax", "mean": "mean"}
_SIMPLE_MODULES: dict[type, str] = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Identity: "identity", nn.Dropout: "identity", nn.Dropout2d: "identity",
}


def _arg_of(node: fx.Node, i: int, key: str, default: Any = None) -> Any:
    """Argument ``i`` of a call, passed by position or as ``key=``."""
    return node.kwargs.get(key, node.args[i] if len(node.args) > i else default)


def _literal_int(v: Any, what: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ExportError(f"{where}: `{what}` must be a number written in the model, got {v!r}. HINT: a size read "
                          f"from a tensor (x.shape) cannot be stored in the program; use the model's own constants")
    return v


def _token_entry(op: str, node: fx.Node, where: str) -> dict[str, Any] | None:
    """The program node of a transformer op (issue 40), ``None`` for the other ops."""
    x = [_ref(node.args[0] if node.args else node.kwargs.get("input"), where)]
    if op == "transpose":
        return {"op": op, "args": x, "attrs": {"dim0": _literal_int(_arg_of(node, 1, "dim0"), "dim0", where),
                                               "dim1": _literal_int(_arg_of(node, 2, "dim1"), "dim1", where)}}
    if op == "reshape":
        shape = node.args[1:] if len(node.args) > 2 or not isinstance(_arg_of(node, 1, "shape"), (tuple, list)) \
            else _arg_of(node, 1, "shape")
        shape = [_literal_int(d, "shape", where) for d in shape]
        if not shape or shape[0] != -1:
            raise ExportError(f"{where}: reshape to {tuple(shape)}: the program reshapes each sample, so the target "
                              f"must start with -1 (the batch). HINT: write x.reshape(-1, ...) with the sample's sizes")
        return {"op": op, "args": x, "attrs": {"shape": shape}}
    if op in ("softmax", "mean"):
        dim = _literal_int(_arg_of(node, 1, "dim"), "dim", where)
        attrs = {"dim": dim} if op == "softmax" else {"dim": dim, "keepdim": bool(_arg_of(node, 2, "keepdim", False))}
        return {"op": op, "args": x, "attrs": attrs}
    if op == "gelu":
        if node.kwargs.get("approximate", "none") != "none":
            raise ExportError(f"{where}: gelu with approximate={node.kwargs['approximate']!r}; the bundle has the "
                              f"exact form only. HINT: use approximate='none'")
        return {"op": op, "args": x, "attrs": {}}
    return None


def _pair(v: Any) -> Any:
    return list(v) if isinstance(v, (tuple, list)) else v


def _ref(a: Any, where: str) -> Any:
    if isinstance(a, fx.Node):
        return a.name
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return a
    raise ExportError(f"{where}: argument {a!r} ({type(a).__name__}) is neither a tensor nor a number; the bundle "
                      f"program cannot express it. HINT: keep such logic out of the exported forward")


def build_program(
    model: nn.Module,
    prefix: str,
    nested: nn.Module | None = None,
    num_levels: int = 1,
) -> Program:
    """Trace ``model`` (a plain network) into a :class:`Program` whose tensors are named ``prefix + name``.

    Args:
        model: the plain network to trace (for a multi-capacity model: its largest level, from
            :func:`~nestflex.capacity.extract_level`).
        prefix: prepended to every tensor name.
        nested: the multi-capacity model ``model`` was extracted from; its nested layers give the
            per-level regions and BatchNorms, and its tensors (nested order, every level) are
            the ones stored.
        num_levels: levels of ``nested``.

    Raises:
        ExportError: a layer or function the runtime has no op for.
    """
    try:
        gm, _ = trace_module(model, strict=True)
    except GraphError as e:
        raise ExportError(f"{type(model).__name__} cannot be exported: {e}") from None
    state = (nested if nested is not None else model).state_dict()
    prog = Program()

    def tensor(name: str, region_fn: Callable[[int], list[int] | None] | None = None) -> str:
        key = prefix + name
        prog.tensors[key] = state[name].detach().cpu().contiguous()
        if region_fn is not None and nested is not None:
            prog.regions[key] = [region_fn(k) for k in range(num_levels)]
        return key

    for node in gm.graph.nodes:
        where = f"{type(model).__name__} node {node.name!r}"
        entry: dict[str, Any] = {"name": node.name}
        if node.op == "placeholder":
            entry["op"] = "input"
        elif node.op == "output":
            out = node.args[0]
            if not isinstance(out, fx.Node):
                raise ExportError(f"{where}: the network must return one tensor, got {type(out).__name__}")
            entry.update(op="output", args=[out.name])
        elif node.op == "get_attr":
            if node.target not in state:
                raise ExportError(f"{where}: reads attribute {node.target!r}, which is not a parameter or buffer")
            entry.update(op="param", params={"value": tensor(node.target)})
        elif node.op == "call_module":
            entry.update(_module_entry(gm.get_submodule(node.target), node, where, tensor,
                                       nested.get_submodule(node.target) if nested is not None else None, num_levels))
        elif node.op in ("call_function", "call_method") and node.target in (getattr, "size", "dim"):
            raise ExportError(f"{where}: reads a tensor's shape (x.shape, x.size()); the bundle program holds no "
                              f"sizes computed at run time. HINT: write the model's sizes as its own constants "
                              f"(x.reshape(-1, tokens, heads, head_dim)), as nestflex's exportable ViT does")
        elif node.op == "call_function":
            op = _FUNCTIONS.get(node.target)
            if op is None:
                raise ExportError(f"{where}: function {getattr(node.target, '__name__', node.target)} has no bundle op; "
                                  f"supported: {sorted({getattr(f, '__name__', str(f)) for f in _FUNCTIONS})}")
            entry.update(_call_entry(op, node, where))
        elif node.op == "call_method":
            op = _METHODS.get(node.target)
            if op is None:
                raise ExportError(f"{where}: tensor method .{node.target}() has no bundle op; supported: {sorted(_METHODS)}")
            entry.update(_call_entry(op, node, where))
        else:  # pragma: no cover - fx has no other ops
            raise ExportError(f"{where}: unsupported fx op {node.op!r}")
        prog.nodes.append(entry)
    return prog


def _call_entry(op: str, node: fx.Node, where: str) -> dict[str, Any]:
    token = _token_entry(op, node, where)
    if token is not None:
        return token
    if op == "flatten":
        start = node.kwargs.get("start_dim", node.args[1] if len(node.args) > 1 else 0)
        end = node.kwargs.get("end_dim", node.args[2] if len(node.args) > 2 else -1)
        return {"op": op, "args": [_ref(node.args[0], where)], "attrs": {"start_dim": start, "end_dim": end}}
    if op == "relu":
        return {"op": op, "args": [_ref(node.args[0], where)], "attrs": {}}
    if op == "index_select":
        # FlexDNN's channel selection (`FilterSubsetExit`): the index is a buffer, so it reaches
        # the program as a `param` node and the weights file as an int64 tensor
        x = node.kwargs.get("input", node.args[0] if node.args else None)
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        index = node.kwargs.get("index", node.args[2] if len(node.args) > 2 else None)
        if not isinstance(index, fx.Node) or isinstance(dim, bool) or not isinstance(dim, int):
            raise ExportError(f"{where}: index_select needs an int `dim` and a tensor index (a buffer), got dim={dim!r}, "
                              f"index={index!r}. HINT: register the selected indices as a buffer of the module")
        return {"op": op, "args": [_ref(x, where), _ref(index, where)], "attrs": {"dim": dim}}
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        raise ExportError(f"{where}: {op} with arguments {node.args} {dict(node.kwargs)} is not supported")
    return {"op": op, "args": [_ref(a, where) for a in node.args], "attrs": {}}


def _module_entry(module: nn.Module, node: fx.Node, where: str, tensor, nested_module: nn.Module | None,
                  num_levels: int) -> dict[str, Any]:
    args = [_ref(node.args[0], where)]
    target = node.target
    for cls, op in _SIMPLE_MODULES.items():
        if type(module) is cls:
            return {"op": op, "args": args, "attrs": {}}
    if type(module) is nn.Conv2d:
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            raise ExportError(f"{where}: conv `{target}` uses padding {module.padding!r}/{module.padding_mode!r}; "
                              f"the bundle supports numeric zero padding only")
        depthwise = isinstance(nested_module, NestedConv2d) and nested_module.depthwise
        attrs = {"stride": _pair(module.stride), "padding": _pair(module.padding), "dilation": _pair(module.dilation),
                 "groups": module.groups, "depthwise": depthwise}
        params = _linear_params(module, target, tensor, nested_module, depthwise)
        return {"op": "conv2d", "args": args, "attrs": attrs, "params": params}
    if type(module) is nn.Linear:
        return {"op": "linear", "args": args, "attrs": {}, "params": _linear_params(module, target, tensor, nested_module)}
    if isinstance(module, _BatchNorm) and type(module) in (nn.BatchNorm1d, nn.BatchNorm2d):
        if not module.track_running_stats or module.running_mean is None:
            raise ExportError(f"{where}: BatchNorm `{target}` has no running statistics; export needs eval-mode BN")
        roles = ["running_mean", "running_var"] + (["weight", "bias"] if module.affine else [])
        attrs = {"eps": module.eps}
        if isinstance(nested_module, NestedNorm):
            per_level = []
            for k in range(num_levels):
                per_level.append({r: tensor(f"{target}.levels.{k}.{r}", lambda lv, k=k, r=r: (
                    list(nested_module.levels[k].state_dict()[r].shape) if lv == k else None)) for r in roles})
            return {"op": "batch_norm", "args": args, "attrs": attrs, "params_per_level": per_level}
        return {"op": "batch_norm", "args": args, "attrs": attrs, "params": {r: tensor(f"{target}.{r}") for r in roles}}
    if type(module) is nn.MaxPool2d:
        if module.return_indices:
            raise ExportError(f"{where}: MaxPool2d `{target}` returns indices; not supported")
        attrs = {"kernel_size": _pair(module.kernel_size), "stride": _pair(module.stride), "padding": _pair(module.padding),
                 "dilation": _pair(module.dilation), "ceil_mode": module.ceil_mode}
        return {"op": "max_pool2d", "args": args, "attrs": attrs}
    if type(module) is nn.AvgPool2d:
        attrs = {"kernel_size": _pair(module.kernel_size), "stride": _pair(module.stride), "padding": _pair(module.padding),
                 "ceil_mode": module.ceil_mode, "count_include_pad": module.count_include_pad,
                 "divisor_override": module.divisor_override}
        return {"op": "avg_pool2d", "args": args, "attrs": attrs}
    if type(module) in (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d):
        if getattr(module, "return_indices", False):
            raise ExportError(f"{where}: AdaptiveMaxPool2d `{target}` returns indices; not supported")
        op = "adaptive_avg_pool2d" if type(module) is nn.AdaptiveAvgPool2d else "adaptive_max_pool2d"
        return {"op": op, "args": args, "attrs": {"output_size": _pair(module.output_size)}}
    if type(module) is nn.LayerNorm:
        if len(module.normalized_shape) != 1:
            raise ExportError(f"{where}: LayerNorm `{target}` normalises over {tuple(module.normalized_shape)}; the "
                              f"bundle normalises the last dim only (a transformer's channels)")
        params = {} if module.weight is None else {"weight": tensor(f"{target}.weight")}
        if module.bias is not None:
            params["bias"] = tensor(f"{target}.bias")
        return {"op": "layer_norm", "args": args, "attrs": {"eps": module.eps, "channels": module.normalized_shape[0]},
                "params": params}
    if type(module) is nn.GELU:
        if module.approximate != "none":
            raise ExportError(f"{where}: GELU `{target}` uses approximate={module.approximate!r}; the bundle has the "
                              f"exact form only. HINT: nn.GELU() (approximate='none')")
        return {"op": "gelu", "args": args, "attrs": {}}
    if type(module) is nn.Flatten:
        return {"op": "flatten", "args": args, "attrs": {"start_dim": module.start_dim, "end_dim": module.end_dim}}
    raise ExportError(
        f"{where}: layer `{target}` ({type(module).__name__}) has no bundle op. HINT: the bundle runtime supports "
        f"Conv2d, Linear, BatchNorm1d/2d, ReLU, ReLU6, Identity, Dropout, (Adaptive)Max/AvgPool2d, Flatten, add/sub/mul, "
        f"index_select (channel selection), and for transformers LayerNorm, GELU, matmul, softmax, reshape, transpose, "
        f"mean"
    )


def _linear_params(module: nn.Module, target: str, tensor, nested_module: nn.Module | None,
                   depthwise: bool = False) -> dict[str, str]:
    nested_ok = isinstance(nested_module, (NestedConv2d, NestedLinear))

    def weight_region(k: int) -> list[int]:
        full = list(nested_module.weight.shape)
        o = nested_module.nest_out[k]
        i = full[1] if depthwise else nested_module.nest_in[k] // (getattr(nested_module, "groups", 1) or 1)
        return [o, i, *full[2:]]

    params = {"weight": tensor(f"{target}.weight", weight_region if nested_ok else None)}
    if module.bias is not None:
        params["bias"] = tensor(f"{target}.bias", (lambda k: [nested_module.nest_out[k]]) if nested_ok else None)
    return params
