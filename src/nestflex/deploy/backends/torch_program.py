"""The op-program interpreter in torch eager: the reference the other backends are checked against,
and what the ``eager`` / ``channels_last`` backends (:mod:`.eager`) run. Imports torch: only the
eager backends import this module, and only when one prepares something.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from nestflex.deploy.bundle.program import _nodes
from nestflex.deploy.bundle.program_records import ProgramNode as Node

__all__ = ["OPS", "run_program"]

# --------------------------------------------------------------------------------------------
# the op-program interpreter
def _arg(a: Any, env: Mapping[str, Any]) -> Any:
    return env[a] if isinstance(a, str) else a


def _conv2d(node: Node, x: torch.Tensor, w: Mapping[str, torch.Tensor]) -> torch.Tensor:
    at = node.attrs
    weight = w["weight"]
    groups = weight.shape[0] if at.get("depthwise") else at["groups"]
    return F.conv2d(x, weight, w.get("bias"), at["stride"], at["padding"], at["dilation"], groups)


def _batch_norm(node: Node, x: torch.Tensor, w: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return F.batch_norm(x, w["running_mean"], w["running_var"], w.get("weight"), w.get("bias"), False, 0.0,
                        node.attrs["eps"])


def _max_pool(node: Node, x: torch.Tensor, w) -> torch.Tensor:
    at = node.attrs
    return F.max_pool2d(x, at["kernel_size"], at["stride"], at["padding"], at["dilation"], at["ceil_mode"])


def _avg_pool(node: Node, x: torch.Tensor, w) -> torch.Tensor:
    at = node.attrs
    return F.avg_pool2d(x, at["kernel_size"], at["stride"], at["padding"], at["ceil_mode"], at["count_include_pad"],
                        at.get("divisor_override"))


def _size(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


#: op name -> fn(node, first input, weights of this node) for ops with one tensor input
OPS: dict[str, Callable[..., torch.Tensor]] = {
    "conv2d": _conv2d,
    "linear": lambda node, x, w: F.linear(x, w["weight"], w.get("bias")),
    "batch_norm": _batch_norm,
    "relu": lambda node, x, w: F.relu(x),
    "relu6": lambda node, x, w: F.hardtanh(x, 0.0, 6.0),
    "identity": lambda node, x, w: x,
    "max_pool2d": _max_pool,
    "avg_pool2d": _avg_pool,
    "adaptive_avg_pool2d": lambda node, x, w: F.adaptive_avg_pool2d(x, _size(node.attrs["output_size"])),
    "adaptive_max_pool2d": lambda node, x, w: F.adaptive_max_pool2d(x, _size(node.attrs["output_size"])),
    "flatten": lambda node, x, w: torch.flatten(x, node.attrs["start_dim"], node.attrs["end_dim"]),
    # transformers (issue 40)
    "layer_norm": lambda node, x, w: F.layer_norm(x, (node.attrs["channels"],), w.get("weight"), w.get("bias"),
                                                  node.attrs["eps"]),
    "gelu": lambda node, x, w: F.gelu(x),
    "softmax": lambda node, x, w: torch.softmax(x, node.attrs["dim"]),
    "mean": lambda node, x, w: torch.mean(x, node.attrs["dim"], keepdim=node.attrs["keepdim"]),
    "transpose": lambda node, x, w: torch.transpose(x, node.attrs["dim0"], node.attrs["dim1"]),
    "reshape": lambda node, x, w: torch.reshape(x, tuple(node.attrs["shape"])),
}


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "matmul": operator.matmul}


#: ops run_program handles itself; with OPS and _BINARY exactly the schema's PROGRAM_OPS (tested)
_SPECIAL = ("input", "output", "param", "index_select")


def _node_weights(node: Node, tensors: Mapping[str, torch.Tensor], level: int) -> dict[str, torch.Tensor]:
    return {role: tensors[name] for role, name in node.level_params(level).items()}


def run_program(nodes: Sequence[Node], env: dict[str, Any], tensors: Mapping[str, torch.Tensor], level: int = 0) -> Any:
    """Run ``nodes`` (:class:`~nestflex.deploy.bundle.program_records.ProgramNode`, or their JSON dicts) in order;
    ``env`` holds the inputs by node name and receives every result.

    The program was validated when the bundle was loaded (:mod:`nestflex.deploy.bundle.program_records`), so
    this loop only dispatches.

    Returns the ``output`` node's value (a tensor or a tuple), or ``None`` if ``nodes`` has none.
    """
    for node in _nodes(nodes):
        op = node.op
        if op == "input":
            continue
        if op == "output":
            args = [_arg(a, env) for a in node.args]
            return args[0] if len(args) == 1 else tuple(args)
        if op == "param":
            env[node.name] = tensors[node.params["value"]]
        elif op in _BINARY:
            a, b = (_arg(x, env) for x in node.args)
            env[node.name] = _BINARY[op](a, b)
        elif op == "index_select":  # FlexDNN exits: the top-k filters of the tapped map
            a, index = (_arg(x, env) for x in node.args)
            env[node.name] = torch.index_select(a, node.attrs["dim"], index)
        else:
            env[node.name] = OPS[op](node, _arg(node.args[0], env), _node_weights(node, tensors, level))
    return None
