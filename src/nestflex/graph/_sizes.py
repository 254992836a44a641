"""Sizes read from tensor shapes that a cut leaves behind: recomputed after the cut, not sent.

A block that reads ``B, C, H, W = x.shape`` before a cut and reshapes with them after it (PiT's
and CoaT's stages, around their token blocks) would make those ints cross the cut. They need
not: the trace runs at a fixed per-sample shape, so each such size is either a constant (``C``,
``H``, ``W``, a class token count) or a multiple of the batch (``B``), which the tail reads off
the tensor that crosses (its dim 0 is the batch). :func:`size_value` evaluates a size node at a
given batch from the traced shapes; :func:`rebuild` writes it into the tail's graph.
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

__all__ = ["rebuild", "recomputable", "size_value"]

_INT_OPS = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
            operator.floordiv: operator.floordiv, operator.neg: operator.neg}
_MISSING = object()


def size_value(node: Any, batch: int, _depth: int = 0) -> Any:
    """The value of a size node at batch ``batch``, or ``None`` when it is not one.

    Args:
        node: an fx node of a traced graph with ``meta["shape"]`` (or a literal argument).
        batch: the batch size to evaluate at (the trace ran at 1).

    Returns:
        an int or a tuple of ints; ``None`` for anything else (a tensor, a value that depends on
        tensor contents).
    """
    if not isinstance(node, fx.Node):
        return node if isinstance(node, int) and not isinstance(node, bool) else None
    if _depth > 32:
        return None
    shape = node.meta.get("shape")
    if node.op == "call_function" and node.target is getattr and len(node.args) == 2 and node.args[1] == "shape":
        return _batched(node.args[0], batch)
    if node.op == "call_method" and node.target == "size":
        full = _batched(node.args[0], batch)
        dim = size_value(node.args[1], batch, _depth + 1) if len(node.args) > 1 else _MISSING
        if full is None or dim is None:
            return None
        return full if dim is _MISSING else full[dim]
    if shape is not None:
        return None  # a tensor
    if node.op == "call_method" and node.target == "dim" and isinstance(node.args[0], fx.Node):
        t = node.args[0].meta.get("shape")
        return len(t) if t is not None else None
    if node.op == "call_function" and node.target is operator.getitem:
        seq, index = size_value(node.args[0], batch, _depth + 1), node.args[1]
        if isinstance(seq, tuple) and isinstance(index, int) and -len(seq) <= index < len(seq):
            return seq[index]
        return None
    if node.op == "call_function" and node.target in _INT_OPS:
        args = [size_value(a, batch, _depth + 1) for a in node.args]
        if any(not isinstance(a, int) for a in args):
            return None
        return _INT_OPS[node.target](*args)
    return None


def _batched(tensor: Any, batch: int) -> tuple[int, ...] | None:
    """The shape of an activation at batch ``batch`` (the trace ran at 1); ``None`` for anything
    else: a parameter's leading 1 is not the batch."""
    shape = tensor.meta.get("shape") if isinstance(tensor, fx.Node) else None
    if shape is None or not shape or shape[0] != 1 or not _from_input(tensor):
        return None
    return (batch, *shape[1:])


def _from_input(node: fx.Node) -> bool:
    """Whether the model's input reaches ``node``."""
    seen, todo = {node}, [node]
    while todo:
        n = todo.pop()
        if n.op == "placeholder":
            return True
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return False


def recomputable(node: fx.Node) -> bool:
    """A size the tail can rebuild: an int that is a constant or a whole multiple of the batch."""
    one, two = size_value(node, 1), size_value(node, 2)
    return isinstance(one, int) and isinstance(two, int) and (one == two or two == 2 * one)


def rebuild(graph: fx.Graph, node: fx.Node, batched: fx.Node) -> Any:
    """The size ``node`` in ``graph``: its constant, or ``batched.size(0)`` times its multiple.

    Args:
        graph: the graph after the cut, being built.
        node: a :func:`recomputable` size node of the traced graph.
        batched: a value of ``graph`` whose dim 0 is the batch (a crossing tensor).

    Returns:
        the int constant, or the graph node that computes the size.
    """
    one, two = size_value(node, 1), size_value(node, 2)
    if one == two:
        return one
    size = graph.call_method("size", (batched, 0))
    return size if one == 1 else graph.call_function(operator.mul, (size, one))
