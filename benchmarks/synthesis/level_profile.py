"""Where a level's time goes, operator by operator: why time does not follow MACs at batch 1 (issue 23).

For each level and each backend asked for, the level's onnxruntime graph (the one the backend
runs: the bundle's, int8, padded) is run ``--runs`` times at batch 1 with onnxruntime's profiler,
and each operator's median kernel time is kept with its output shape. Beside it, the call's wall
time without the profiler and the cost of a call that does nothing (one Identity on the same
input): the session's own fixed cost. Each operator is sorted into

- ``conv_shrinking``: a Conv/Gemm whose output shape *as it runs* (onnxruntime's profiled shape:
  after its channel blocking, NCHWc, or the ``_pad8`` padding) is smaller in the smallest level
  than in the largest;
- ``conv_constant``: a Conv/Gemm whose shape as it runs is the same in the smallest and the
  largest level: the kernel does the same work whatever the level keeps (the first layers the
  pruning kept whole, and narrower layers the blocking rounds back up). Its ``macs`` are the
  level's own (from the unpadded float graph), so a constant layer's MACs can still shrink;
- ``other``: everything else (quantize / dequantize, layout transposes and reorders, pooling,
  flatten, the classifier's batch norm): operators with no MACs whose time hardly depends on width.

    python benchmarks/synthesis/level_profile.py --bundle runs/seeds_b2/seed_0/bundle.nfx \\
        --backends onnxruntime onnxruntime_int8_pad8 --out runs/bench_level_profile

Writes ``summary.json``: per backend and level, ``wall_us`` (a call without the profiler),
``nodes_us`` (sum of the
operators' profiled medians; the profiler adds its own cost per operator, so this exceeds the
wall time and shares are read against it), ``groups_us`` / ``groups_share`` (the three groups
above), ``not_shrinking_share_of_largest`` (conv_constant + other over the largest level's
profiled sum: the floor of the level's time fraction), ``time_fraction`` (wall),
``macs_fraction``, and the operators; ``call_overhead_us`` (the Identity call). Timings are
medians on this machine (recorded under ``machine``), one thread.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from nestflex._io import write_json
from nestflex._machine import machine
from nestflex.deploy import load
from nestflex.deploy.backends.base import get_backend
from nestflex.deploy.backends.op_profile import CONV_OPS, operator_times
from nestflex.deploy.timing import median_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--backends", nargs="+", default=["onnxruntime", "onnxruntime_int8_pad8"])
    p.add_argument("--runs", type=int, default=300, help="profiled runs per level (medians)")
    add_out_args(p, "summary.json and run.json")
    args = p.parse_args(argv)
    resolve_out(args, __file__)
    return args


def _session(path: Path | bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts,
                                providers=["CPUExecutionProvider"])


def call_overhead_us(shape: tuple[int, ...], runs: int) -> float:
    """A session call that does nothing (Identity on the level's input): what any call costs."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.zeros(shape, np.float32)
    session = _session(model.SerializeToString())
    return 1e3 * median_ms(lambda: session.run(None, {"x": x}), max(runs, 1000), warmup=50)


def wall_us(paths: list[Path], x: np.ndarray, runs: int, rounds: int = 10) -> list[float]:
    """Each graph's median call (no profiler), the graphs in turns: ``rounds`` rounds of
    ``runs / rounds`` consecutive calls each, so a slow spell of the machine hits every level
    alike while each call finds its level's weights in cache, as a device serving one level does
    (alternating call by call evicts them: float32 levels then measured ~1.5x slower)."""
    sessions = [_session(p) for p in paths]
    calls = [lambda s=s: s.run(None, {s.get_inputs()[0].name: x}) for s in sessions]
    per = max(runs // rounds, 1)
    times: list[list[float]] = [[] for _ in paths]
    for _ in range(rounds):
        for k, call in enumerate(calls):
            times[k].append(1e3 * median_ms(call, per, warmup=min(50, per)))
    return [float(np.median(t)) for t in times]


def profile_level(path: Path, x: np.ndarray, runs: int) -> dict[str, Any]:
    """The level's operators' profiled medians."""
    ops = operator_times(path, x, runs)
    return {"nodes_us": sum(o["us"] for o in ops), "operators": ops}


def layer_macs(path: Path) -> list[int]:
    """MACs of each Conv/Gemm of a float ONNX graph, in graph order (the order they run in)."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    g = model.graph
    dims = {i.name: list(numpy_helper.to_array(i).shape) for i in g.initializer}
    for v in list(g.value_info) + list(g.output):
        dims[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    out = []
    for node in g.node:
        if node.op_type == "Conv":
            w, y = dims[node.input[1]], dims[node.output[0]]
            out.append(int(math.prod(w) * y[2] * y[3]))  # C_out x C_in/groups x kh x kw per output pixel
        elif node.op_type in ("Gemm", "MatMul"):
            out.append(int(math.prod(dims[node.input[1]])))
    return out


def group(levels: list[dict[str, Any]], macs: list[list[int]] | None = None) -> None:
    """Sort each level's operators into conv_shrinking / conv_constant / other (see the module doc).

    The levels are nested (one topology, narrower widths), so the k-th Conv/Gemm to run in one
    level is the k-th in another; a layer is constant when its output shape is the same in the
    smallest and the largest level."""
    convs = CONV_OPS

    def conv_shapes(lv: dict[str, Any]) -> list:
        return [o["shape"] for o in lv["operators"] if o["op"] in convs]

    small, large = conv_shapes(levels[0]), conv_shapes(levels[-1])
    if len(small) != len(large):
        raise SystemExit(f"the smallest and largest level run {len(small)} and {len(large)} Conv/Gemm operators: "
                         f"not one nested topology, so their layers cannot be matched")
    top_macs = None if macs is None else sum(macs[-1])
    for i, lv in enumerate(levels):
        g = collections.Counter()
        m = collections.Counter()
        k = 0
        for o in lv["operators"]:
            if o["op"] in convs:
                o["group"] = "conv_constant" if small[k] == large[k] else "conv_shrinking"
                if macs is not None and len(macs[i]) == len(small):
                    o["macs"] = macs[i][k]
                    m[o["group"]] += macs[i][k]
                k += 1
            else:
                o["group"] = "other"
            g[o["group"]] += o["us"]
        lv["groups_us"] = {name: g.get(name, 0.0) for name in ("conv_shrinking", "conv_constant", "other")}
        lv["groups_share"] = {name: v / lv["nodes_us"] for name, v in lv["groups_us"].items()}
        if m:  # the groups' MACs, as shares of the largest level's (the goal's MACs fraction, split)
            lv["groups_macs_share_of_largest"] = {name: m.get(name, 0) / top_macs
                                                  for name in ("conv_shrinking", "conv_constant")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    bundle = load(args.bundle)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    shape = (1, *bundle.spec.input.shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    macs = [float(r["macs"]) for r in bundle.levels]
    results = {}
    for name in args.backends:
        backend = get_backend(name)
        levels = []
        paths = [backend.model_path(bundle, k) for k in range(bundle.num_levels)]
        walls = wall_us(paths, x, args.runs)
        for k, path in enumerate(paths):
            row = {"wall_us": walls[k], **profile_level(path, x, args.runs)}
            row.update(level=k, macs_fraction=macs[k] / macs[-1])
            levels.append(row)
            print(f"{name} level {k}: {row['wall_us']:.1f} us wall, {row['nodes_us']:.1f} us in "
                  f"{len(row['operators'])} operators", flush=True)
        float_graphs = [get_backend("onnxruntime").model_path(bundle, k) for k in range(bundle.num_levels)]
        group(levels, [layer_macs(p) for p in float_graphs])  # the levels' own MACs, not the padding's
        top = levels[-1]
        for lv in levels:
            lv["time_fraction"] = lv["wall_us"] / top["wall_us"]
            # profiled: the profiler's own cost per operator inflates every one alike, so the
            # shares are read against the profiled sum, not the wall time
            lv["profiled_fraction"] = lv["nodes_us"] / top["nodes_us"]
            lv["not_shrinking_share_of_largest"] = (lv["groups_us"]["conv_constant"]
                                                    + lv["groups_us"]["other"]) / top["nodes_us"]
        results[name] = levels
    summary = {"benchmark": "level_profile", "machine": machine(), "bundle": args.bundle, "threads": 1,
               "runs": args.runs, "call_overhead_us": call_overhead_us(shape, args.runs), "backends": results}
    write_json(out / "summary.json", summary)
    write_run(out, __file__, argv)
    print(f"call overhead (Identity): {summary['call_overhead_us']:.1f} us")
    for name, levels in results.items():
        for lv in levels:
            g = lv["groups_us"]
            print(f"{name:24s} level {lv['level']}: wall {lv['wall_us']:6.1f} us (fraction {lv['time_fraction']:.2f}, "
                  f"MACs {lv['macs_fraction']:.2f}); profiled {lv['nodes_us']:6.1f} us: conv shrinking "
                  f"{g['conv_shrinking']:6.1f}, conv constant {g['conv_constant']:5.1f}, other {g['other']:5.1f}; "
                  f"not shrinking = {lv['not_shrinking_share_of_largest']:.2f} of the largest level's"
                  + ("" if "groups_macs_share_of_largest" not in lv else
                     f"; constant convs' MACs {lv['groups_macs_share_of_largest']['conv_constant']:.2f}"))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
