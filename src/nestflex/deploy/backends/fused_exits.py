"""An exit set's whole batch-1 early-exit policy as one ONNX graph (one onnxruntime call per frame).

Run stage by stage, early exit costs a session call per stage and per head; on a small CNN at
batch 1 those calls cost more than the stages compute (docs/synthesis.md). Here the bundle's
stage and head graphs are chained into one graph of blocks: block 0 (the stages up to the first
exit, its head and confidence) runs in the main graph, and each later block runs in the ``else``
branch of an ``If`` on whether the sample has already left, whose ``then`` branch passes the
answer on. The final block applies the fallback over every exit's confidence. A sample's call
computes exactly the stages and heads up to where it leaves, in one ``run``; after that each
block costs one ``If`` of a few ``Identity`` nodes.

Inputs: ``input`` (one sample, the bundle's input shape) and ``thresholds`` (float32, one per
early exit; compared in float32 as the torch policy compares them). Outputs: ``logits`` (1, C),
``exit_index``, ``answer_index`` (int64, (1,)) and ``confidence`` (float32, (1,)): the fields
of :class:`~nestflex.deploy.exits.ExitResult`.

The weights go to a file beside the graph (``<graph>.data``, ONNX external data): onnxruntime
held the graph's ``If`` branches with their weights inline twice, once in the session's tensors and
once in the branch attributes it keeps, 10 MB of resident memory for 4 MB of weights on the default
recipe's exit set against 6 MB with the weights outside (docs/deploy.md: memory).

Only the two built-in confidences (``max_prob``, ``entropy``) have a graph form; a registered
custom one runs stage by stage.

``active`` keeps only some early exits (the synthesis's time-aware exit choice,
:func:`nestflex.deploy.tune.choose_active_exits`): the stages between two kept exits run as
one block and a dropped exit's head is never computed. ``exit_index`` / ``answer_index`` still
number the exits of the whole set, and ``thresholds`` still has one entry per early exit (the
dropped ones' are not read).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from nestflex._io import atomic_write_bytes
from nestflex.deploy.backends._onnx import import_onnx

__all__ = ["FUSED_CONFIDENCES", "fuse_exits", "weights_file"]

#: Confidence measures the fused graph can compute.
FUSED_CONFIDENCES: tuple[str, ...] = ("max_prob", "entropy")

_OUTPUTS = ("logits", "exit_index", "answer_index", "confidence")

#: tensors at least this large go to the weights file; the graph's small constants stay inline
_EXTERNAL_MIN_BYTES = 1024
#: each tensor starts at a multiple of this in the weights file (a page: onnxruntime may map it)
_ALIGN = 4096


def weights_file(graph: Path) -> Path:
    """The file beside fused graph ``graph`` holding its weights (``<graph name>.data``).

    Args:
        graph: the fused graph's path.
    """
    return graph.with_name(graph.name + ".data")


def fuse_exits(stages: Sequence[Path], heads: Sequence[Path], taps: Sequence[int], num_classes: int,
               confidence: str, fallback: str, dst: Path, active: Sequence[int] | None = None) -> Path:
    """Write the fused early-exit graph of ``stages`` (K ONNX files, the last one ending in the
    final logits) and ``heads`` (K - 1 files, head ``k`` reading stage ``k``'s output ``taps[k]``)
    to ``dst`` (atomically) and return it. ``active``: the early exits kept (default all).

    Raises:
        MissingOnnxError: the ``onnx`` package (``nestflex[tune]``) is not installed.
    """
    onnx = import_onnx("the fused early-exit graph")
    from onnx import TensorProto, helper

    if confidence not in FUSED_CONFIDENCES:
        raise ValueError(f"no graph form for the confidence {confidence!r}; fused: {', '.join(FUSED_CONFIDENCES)}. "
                         f"HINT: a set calibrated with another confidence runs stage by stage")
    models = [onnx.load(str(p)) for p in stages]
    head_models = [onnx.load(str(p)) for p in heads]
    opset = max(o.version for m in models + head_models for o in m.opset_import if o.domain in ("", "ai.onnx"))
    num = len(models)
    # the exits kept, final last: block g runs the stages after exit ends[g - 1] up to ends[g]
    ends = sorted(set(range(num - 1) if active is None else active))
    if any(not 0 <= k < num - 1 for k in ends):
        raise ValueError(f"`active` must name early exits in [0, {num - 2}], got {list(active or ())}. HINT: the "
                         f"final exit always runs; pass the early exits to keep, or None for all")
    ends.append(num - 1)

    def embed(model: Any, prefix: str, feeds: Sequence[str]) -> tuple[list, list, list[str]]:
        """``model``'s nodes and initializers with every name prefixed, its inputs wired to ``feeds``;
        returns (nodes, initializers, output names)."""
        g = model.graph
        rename = {i.name: f for i, f in zip(g.input, feeds)}
        for init in g.initializer:
            rename[init.name] = prefix + init.name
        for node in g.node:
            for o in node.output:
                if o:
                    rename[o] = prefix + o
        nodes = []
        for node in g.node:
            n = onnx.NodeProto()
            n.CopyFrom(node)
            n.name = prefix + (node.name or node.op_type)
            n.input[:] = [rename.get(i, i) if i else i for i in node.input]
            n.output[:] = [rename[o] if o else o for o in node.output]
            nodes.append(n)
        inits = []
        for init in g.initializer:
            t = onnx.TensorProto()
            t.CopyFrom(init)
            t.name = rename[init.name]
            inits.append(t)
        return nodes, inits, [rename[o.name] for o in g.output]

    def conf_nodes(logits: str, out: str, p: str) -> list:
        if confidence == "max_prob":
            return [helper.make_node("Softmax", [logits], [p + "prob"], axis=-1),
                    helper.make_node("ReduceMax", [p + "prob"], [out], axes=[-1], keepdims=0)
                    if opset < 18 else helper.make_node("ReduceMax", [p + "prob", "axis_last"], [out], keepdims=0)]
        return [helper.make_node("LogSoftmax", [logits], [p + "logp"], axis=-1),
                helper.make_node("Exp", [p + "logp"], [p + "prob"]),
                helper.make_node("Mul", [p + "prob", p + "logp"], [p + "plogp"]),
                helper.make_node("ReduceSum", [p + "plogp", "axis_last"], [p + "negent"], keepdims=0),
                helper.make_node("Div", [p + "negent", "log_classes"], [p + "scaled"]),  # as torch: / log C
                helper.make_node("Add", [p + "scaled", "one"], [p + "raw"]),
                helper.make_node("Clip", [p + "raw", "zero", "one"], [out])]

    def outputs_of(prefix: str) -> list:
        return [helper.make_tensor_value_info(prefix + "logits", TensorProto.FLOAT, [1, num_classes]),
                helper.make_tensor_value_info(prefix + "exit_index", TensorProto.INT64, [1]),
                helper.make_tensor_value_info(prefix + "answer_index", TensorProto.INT64, [1]),
                helper.make_tensor_value_info(prefix + "confidence", TensorProto.FLOAT, [1])]

    state = ("L", "I", "A", "C", "done")  # the answer so far: logits, exit index, answer index, confidence, left
    kinds = {"L": TensorProto.FLOAT, "I": TensorProto.INT64, "A": TensorProto.INT64, "C": TensorProto.FLOAT,
             "done": TensorProto.BOOL}

    def run_block(g: int, feeds: Sequence[str]) -> tuple[list, list, list[str], list[str]]:
        """Nodes and initializers of block ``g`` (its stages, its exit's head and confidence) on ``feeds``;
        returns them with the names of the answer state it writes (``state``, less ``done`` for the final
        block) and of its last stage's outputs."""
        k, nodes, inits = ends[g], [], []
        for j in range(ends[g - 1] + 1 if g else 0, k + 1):  # the block's stages, chained
            stage_nodes, stage_inits, feeds = embed(models[j], f"s{j}/", feeds)
            nodes += stage_nodes
            inits += stage_inits
        logits = feeds[0]  # the final exit: the last stage's first output, as stage by stage
        if k < num - 1:
            head_nodes, head_inits, head_outs = embed(head_models[k], f"h{k}/", [feeds[taps[k]]])
            nodes += head_nodes
            inits += head_inits
            logits = head_outs[0]
        conf = f"c{k}/confidence"
        nodes += conf_nodes(logits, conf, f"c{k}/")
        if k < num - 1:
            nodes += [helper.make_node("Gather", ["thresholds", f"k{k}"], [f"t{k}"], axis=0),
                      helper.make_node("Greater", [conf, f"t{k}"], [f"leave{k}"])]
            return nodes, inits, [logits, f"k{k}", f"k{k}", conf, f"leave{k}"], list(feeds)
        if fallback == "most_confident" and num > 1:  # nothing passed: the most confident exit answers
            confs = [f"C{i}" for i in ends[:-1]] + [conf]
            zs = [f"Z{i}" for i in ends[:-1]] + [logits]
            nodes += [helper.make_node("Concat", confs, ["all_conf"], axis=0),
                      helper.make_node("ArgMax", ["all_conf"], ["best"], axis=0, keepdims=1),  # first of ties
                      helper.make_node("Concat", zs, ["all_logits"], axis=0),
                      helper.make_node("Gather", ["all_logits", "best"], ["best_logits"], axis=0),
                      helper.make_node("Gather", ["all_conf", "best"], ["best_conf"], axis=0),
                      helper.make_node("Gather", ["exit_numbers", "best"], ["best_exit"], axis=0)]
            return nodes, inits, ["best_logits", "last_index", "best_exit", "best_conf"], list(feeds)
        return nodes, inits, [logits, "last_index", "last_index", conf], list(feeds)

    # A flat chain, not nested branches: block 0 runs in the main graph, and block g in the ``else`` branch
    # of an ``If`` on whether the sample has left by block g - 1, whose ``then`` branch passes the answer
    # on. Each branch holds its own stages' weights, so onnxruntime prepacks them as in any graph; nested
    # branches would put every deeper weight inside the attribute of each ``If`` above it, and onnxruntime
    # held a 12-exit set's 4 MB of weights about 20 times (81 MB, docs/deploy.md).
    nodes, inits, written, feeds = run_block(0, ["input"])
    k0 = ends[0]
    nodes += [helper.make_node("Identity", [src], [f"{name}{k0}"]) for src, name in zip(written, state)]
    if k0 < num - 1:
        nodes.append(helper.make_node("Identity", [written[0]], [f"Z{k0}"]))  # the logits the fallback reads
    prev, shapes = k0, []
    for g in range(1, len(ends)):
        k = ends[g]
        run_nodes, run_inits, written, outs = run_block(g, feeds)
        names = list(state if k < num - 1 else state[:4])
        # the branch outputs: the answer state, then (early exits) the logits the fallback reads, then the
        # block's last stage outputs (the next block's inputs)
        run_out = [f"run{k}/{n}" for n in names] + ([f"run{k}/Z"] if k < num - 1 else [])
        run_out += [f"run{k}/f{i}" for i in range(len(outs))] if k < num - 1 else []
        run_src = written + ([written[0]] if k < num - 1 else []) + (outs if k < num - 1 else [])
        run_nodes += [helper.make_node("Identity", [a], [b]) for a, b in zip(run_src, run_out)]
        skip_out = [f"skip{k}/{n}" for n in names] + ([f"skip{k}/Z"] if k < num - 1 else [])
        skip_out += [f"skip{k}/f{i}" for i in range(len(outs))] if k < num - 1 else []
        # skipped: the answer passes on; the fallback's logits and the next block's inputs are never read
        skip_src = [f"{n}{prev}" for n in names] + ([f"L{prev}"] if k < num - 1 else [])
        skip_nodes = [helper.make_node("Identity", [a], [b]) for a, b in zip(skip_src, skip_out)]
        for i, out in enumerate(skip_out[len(skip_src):]):
            # zeros of the block's output shape, where it is static: with both branches' shapes equal,
            # onnxruntime knows the next block's input shape and optimises its convolutions as in the
            # stage graph (NCHWc); an unknown shape cost the deep path half again its time
            shape = _static_shape(models[k].graph.output[i])
            if shape is None:
                skip_nodes.append(helper.make_node("Identity", [feeds[0]], [out]))
                continue
            shapes.append(helper.make_tensor(f"shape{k}_{i}", TensorProto.INT64, [len(shape)], shape))
            skip_nodes.append(helper.make_node("ConstantOfShape", [f"shape{k}_{i}"], [out]))
        top_out = [f"{n}{k}" for n in names] + ([f"Z{k}"] if k < num - 1 else [])
        top_feats = [f"f{k}_{i}" for i in range(len(outs))] if k < num - 1 else []
        top_out += top_feats

        types = [kinds[n] for n in names] + ([TensorProto.FLOAT] if k < num - 1 else [])
        types += [TensorProto.FLOAT] * len(top_feats)

        def infos(out: list[str]) -> list:
            return [helper.make_tensor_value_info(n, t, None) for n, t in zip(out, types)]

        nodes.append(helper.make_node(
            "If", [f"done{prev}"], top_out,
            then_branch=helper.make_graph(skip_nodes, f"left_before_{k}", [], infos(skip_out)),
            else_branch=helper.make_graph(run_nodes, f"block_{k}", [], infos(run_out), run_inits)))
        feeds, prev = top_feats, k
    nodes += [helper.make_node("Identity", [f"{n}{prev}"], [o]) for n, o in zip(state, _OUTPUTS)]
    consts = [helper.make_tensor(f"k{k}", TensorProto.INT64, [1], [k]) for k in ends[:-1]]  # only those read
    consts += shapes
    consts.append(helper.make_tensor("last_index", TensorProto.INT64, [1], [num - 1]))
    if fallback == "most_confident" and num > 1:
        consts.append(helper.make_tensor("exit_numbers", TensorProto.INT64, [len(ends)], ends))
    if confidence == "entropy" or opset >= 18:
        consts.append(helper.make_tensor("axis_last", TensorProto.INT64, [1], [-1]))
    if confidence == "entropy":
        consts += [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
                   helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
                   helper.make_tensor("log_classes", TensorProto.FLOAT, [], [math.log(max(num_classes, 2))])]
    shape = [d.dim_value or 1 for d in models[0].graph.input[0].type.tensor_type.shape.dim]
    graph = helper.make_graph(
        nodes, "nestflex_fused_exits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, *shape[1:]]),
         helper.make_tensor_value_info("thresholds", TensorProto.FLOAT, [max(num - 1, 1)])],
        outputs_of(""), consts + inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="nestflex.fused_exits")
    model.ir_version = min(model.ir_version, max(m.ir_version for m in models))
    onnx.checker.check_model(model)
    _write_with_external_weights(model, Path(dst))
    return dst


def _write_with_external_weights(model: Any, dst: Path) -> None:
    """Write ``model`` to ``dst`` with its large tensors (the branches' too) in :func:`weights_file`.

    The weights file is written first and the graph last, each atomically: a graph on disk always
    finds its weights, and the graph's presence is what marks the pair as built."""
    from onnx import TensorProto

    location = weights_file(dst).name
    data = bytearray()
    for tensor in _tensors(model.graph):
        raw = tensor.raw_data
        if len(raw) < _EXTERNAL_MIN_BYTES:
            continue
        data += bytes(-len(data) % _ALIGN)
        offset = len(data)
        data += raw
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    atomic_write_bytes(weights_file(dst), bytes(data))
    atomic_write_bytes(dst, model.SerializeToString())


def _tensors(graph: Any) -> list[Any]:
    """The initializers of ``graph`` and of every graph in its nodes' attributes, depth first."""
    from onnx import AttributeProto

    out = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                out += _tensors(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    out += _tensors(g)
    return out


def _static_shape(value: Any) -> list[int] | None:
    """The shape of graph output ``value`` at batch 1, or None where a dimension other than the batch is
    not a number."""
    dims = value.type.tensor_type.shape.dim
    shape = [1] + [d.dim_value for d in dims[1:]]
    return shape if dims and all(v > 0 for v in shape) else None
