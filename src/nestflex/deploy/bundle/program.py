"""The program a bundle describes, checked as a network: cutting it at split points and exit taps, and
the shapes of every level, stage, head and split before anything runs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.program_records import Program, ProgramNode
from nestflex.deploy.onnxgraph import OnnxGraphError, infer_shapes

__all__ = ["cut_program", "check_shapes", "MAX_ACTIVATION_ELEMENTS"]

Node = ProgramNode


Region = Sequence[int] | None


def _nodes(nodes: Sequence[Node] | Sequence[Mapping[str, Any]]) -> Sequence[Node]:
    """Typed nodes; a program given as JSON dicts (the manifest form) is read and checked once here."""
    if nodes and isinstance(nodes[0], Mapping):
        return Program.from_json(list(nodes)).nodes
    return nodes


def cut_program(nodes: Sequence[Node], cuts: Sequence[str]) -> list[tuple[list[str], list[Node], list[str]]]:
    """Cut a program after each node named in ``cuts`` (in execution order).

    Returns one ``(inputs, nodes, outputs)`` per stage: stage ``k`` takes the values named by
    ``inputs`` (the program input for stage 0), runs ``nodes`` and returns the values named by
    ``outputs``: the cut node first, then every other value a later stage still needs (skip
    connections), in definition order; the last stage returns the program output.

    Raises:
        BundleError: a cut names no node of the program, or cuts are out of order.
    """
    nodes = _nodes(nodes)
    index = {n.name: i for i, n in enumerate(nodes)}
    for c in cuts:
        if c not in index:
            raise BundleError(f"cut point {c!r} is not a node of the program. HINT: the manifest is inconsistent")
    positions = [index[c] for c in cuts]
    if positions != sorted(positions) or len(set(positions)) != len(positions):
        raise BundleError(f"cut points {list(cuts)} are not in execution order")
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for a in n.args:
            if isinstance(a, str):
                last_use[a] = i
    inputs = [n.name for n in nodes if n.op == "input"]
    stages, start = [], 0
    params = {n.name: n for n in nodes if n.op == "param"}
    for c, p in zip([*cuts, None], [*positions, len(nodes) - 1]):
        body = list(nodes[start : p + 1])
        # a `param` node defined in an earlier stage is repeated where used: weights never cross a cut
        own = {n.name for n in body}
        used = [a for n in body for a in n.args if isinstance(a, str) and a in params and a not in own]
        body = [params[a] for a in dict.fromkeys(used)] + body
        if c is None:
            outputs: list[str] = []
        else:
            live = [n.name for n in nodes[: p + 1] if n.op != "param" and last_use.get(n.name, -1) > p]
            outputs = [c, *[name for name in live if name != c]]
        stages.append((inputs, body, outputs))
        inputs, start = outputs, p + 1
    return stages


#: the largest activation (elements per sample) a program may produce; far above any CNN this
#: runtime serves (VGG-16 at 32x32: 65,536), far below what would exhaust a device's memory
MAX_ACTIVATION_ELEMENTS = 2**26


def check_shapes(spec: Any) -> list[str]:
    """Infer the shapes of every program of a validated manifest: nothing read, nothing computed.

    The schema checks each field on its own; this checks that they fit together as a network
    before anything runs: every level of the capacity program, every exit set's stages and heads,
    and every split's head and tail must accept the declared input shape, end in ``(num_classes,)``
    logits per sample, and keep every activation under :data:`MAX_ACTIVATION_ELEMENTS` per sample (a stride,
    padding or kernel edited inside its range can still break a conv, or blow an activation up).

    The shapes come from the ONNX writer's shape walk (:func:`nestflex.deploy.onnxgraph.infer_shapes`,
    plain Python over the weights' declared shapes), the same walk that later writes the graphs
    the runtime runs, so a bundle that loads is one the runtime can build.

    Returns:
        one line per problem (empty when the bundle is consistent).
    """
    table = spec.weights.tensors
    cap = spec.capacity
    want = (int(spec.num_classes),)
    problems: list[str] = []

    def meta(names: Sequence[str], level: int, regions: Mapping[str, Sequence[Region]]) -> dict[str, _Meta]:
        out = {}
        for n in names:
            regs = regions.get(n)
            shape = table[n].shape if regs is None else regs[level]
            if shape is not None:
                out[n] = _Meta(tuple(shape), np.dtype(table[n].dtype))
        return out

    def run(where: str, nodes: Sequence[Node], inputs: Mapping[str, Sequence[int | None]], tensors, level: int,
            outputs: Sequence[str] | None = None) -> Any:
        shapes: dict[str, tuple] = {}
        error = None
        try:
            infer_shapes(nodes, tensors, inputs, level, partial=shapes)
        except OnnxGraphError as e:
            error = f"{where} fails shape inference ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        # an oversized activation is the root cause when a later node then fails on it
        big = [(k, math.prod(v[1:])) for k, v in shapes.items()
               if v and v[0] is None and math.prod(v[1:]) > MAX_ACTIVATION_ELEMENTS]
        if big:
            problems.append(f"{where}: node {big[0][0]!r} produces {big[0][1]:,} elements per sample, above "
                            f"{MAX_ACTIVATION_ELEMENTS:,}")
            return None
        if error is not None:
            problems.append(error)
            return None
        if outputs:
            return {o: shapes[o] for o in outputs}
        out = [a for a in next(n for n in nodes if n.op == "output").args]
        return [shapes.get(a) if isinstance(a, str) else () for a in out]

    def ends_in_logits(where: str, out: Any) -> None:
        if out is None:  # it failed: run() reported why
            return
        if len(out) != 1:  # an output node with several args gives a tuple
            problems.append(f"{where} ends in {len(out)} outputs, expected one tensor of logits")
        elif tuple(out[0][1:]) != want:
            problems.append(f"{where} ends in per-sample shape {tuple(out[0][1:])}, expected {want}")

    x = (None, *spec.input.shape)
    nodes = cap.program.nodes
    top = cap.num_levels - 1
    for level in range(cap.num_levels):
        out = run(f"capacity program at level {level}", nodes, {nodes[0].name: x},
                  meta(cap.program.tensor_names(), level, cap.regions), level)
        ends_in_logits(f"capacity program at level {level}", out)
    if problems:
        return problems  # stages and splits cut the same program: one report is enough
    top_tensors = meta(cap.program.tensor_names(), top, cap.regions)
    for s in spec.splits:
        (ins, head, outs), (_, tail, _) = cut_program(nodes, [s.node])
        crossing = run(f"split {s.name!r} head", head, {ins[0]: x}, top_tensors, top, outs)
        if crossing is not None:
            run(f"split {s.name!r} tail", tail, crossing, top_tensors, top)
    for ex in spec.exit_sets:
        if ex.backbone == "shared":
            backbone, level, tensors = nodes, top, top_tensors
        else:
            backbone, level, tensors = ex.program.nodes, 0, meta(ex.program.tensor_names(), 0, {})
        heads = meta(list(dict.fromkeys(t for h in ex.heads for t in h.program.tensor_names())), 0, {})
        state: Mapping[str, Any] = {backbone[0].name: x}
        for k, (ins, body, outs) in enumerate(cut_program(backbone, ex.taps)):
            result = run(f"{ex.kind} exits, stage {k}", body, {i: state[i] for i in ins}, tensors, level,
                         outs or None)
            if result is None:
                break
            if k < len(ex.heads):  # a stage hands its outputs on; its head reads the first
                state = result
                head = ex.heads[k].program.nodes
                logits = run(f"{ex.kind} exit {k} head", head, {head[0].name: result[outs[0]]}, heads, 0)
            else:
                logits = result
            ends_in_logits(f"{ex.kind} exit {k}", logits)
    return problems


class _Meta:
    """A weight's declared shape and dtype, without its data (what the shape walk reads)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
