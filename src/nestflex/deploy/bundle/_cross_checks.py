"""The checks that span manifest sections (levels against the capacity, programs against the weights
table and the safetensors header, exit taps and heads against their backbone, split nodes, the files
the manifest points at): :func:`_cross_check`, which :func:`nestflex.deploy.bundle.manifest.parse_manifest`
runs once every section has been read. Each check runs only on sections that read cleanly.

Private to :mod:`nestflex.deploy.bundle`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from nestflex.deploy.bundle._reading import _join, _Reader, _show
from nestflex.deploy.bundle.capacity_records import Capacity, LevelRow
from nestflex.deploy.bundle.constants import DTYPES, FLOAT_DTYPES, INDEX_DTYPES, WEIGHTS
from nestflex.deploy.bundle.exit_records import ExitSet
from nestflex.deploy.bundle.file_records import OnnxFile, SampleSet, TensorInfo, Weights
from nestflex.deploy.bundle.input_records import InputSpec
from nestflex.deploy.bundle.program_records import Program
from nestflex.deploy.bundle.quantization_records import PrecisionPlan
from nestflex.deploy.bundle.split_records import SplitPoint

#: safetensors header dtype -> manifest spelling
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
#: ops whose output has the channels of their (first) input
_SAME_CHANNELS = ("batch_norm", "relu", "relu6", "identity", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                  "adaptive_max_pool2d")


def _cross_check(r: _Reader, cap: Capacity | None, levels: list[LevelRow | None], sets: list[ExitSet | None],
                 set_paths: list[str], splits: list[SplitPoint | None], weights: Weights | None,
                 header: Mapping[str, Any] | None, spec_input: InputSpec | None, files: Mapping[str, Any],
                 profiles: Any, precision: PrecisionPlan | None, onnx: list[OnnxFile | None],
                 switching: Any, samples: SampleSet | None = None) -> None:
    """Consistency between sections; each check runs only on sections that read cleanly."""
    table = weights.tensors if weights is not None else None
    if weights is not None and header is not None:
        _check_header(r, weights, header)
    K = cap.num_levels if cap is not None else None
    if K is not None and all(row is not None for row in levels):
        if len(levels) != K:
            r.fail("levels", f"has {len(levels)} rows, but capacity.num_levels is {K} (one row per level)")
        else:
            for k, row in enumerate(levels):
                if row.weight_bytes != cap.level_bytes[k]:
                    r.fail(f"levels[{k}].weight_bytes", f"must equal capacity.level_bytes[{k}] ({cap.level_bytes[k]}), "
                                                        f"got {_show(row.weight_bytes)}")
    if isinstance(switching, tuple) and K is not None:
        for i, row in enumerate(switching):
            for key in ("from", "to"):
                if isinstance(row.get(key), int) and not row[key] < K:
                    r.fail(f"switching[{i}].{key}", f"must be a level in [0, {K - 1}], got {_show(row[key])}")
    in_ch = spec_input.shape[0] if spec_input is not None else None
    cap_ok = cap is not None and table is not None and _check_capacity(r, cap, table, in_ch)
    # exit sets
    kinds: dict[str, str] = {}
    for path, s in zip(set_paths, sets):
        if s is None:
            continue
        if s.kind in kinds:
            r.fail(_join(path, "kind"), f"repeats kind {s.kind!r} (also {kinds[s.kind]}); a bundle holds one set per kind")
        kinds.setdefault(s.kind, path)
        if table is not None and (cap_ok or (cap is not None and s.backbone == "own")):
            _check_exit_set(r, s, path, cap, table, in_ch)
    # split points cut the capacity program
    if cap is not None:
        ops = {n.name: n.op for n in cap.program.nodes}
        names = set()
        for i, s in enumerate(splits):
            if s is None:
                continue
            p = _join("splits", i)
            if s.name in names:
                r.fail(_join(p, "name"), f"repeats split point {s.name!r}")
            names.add(s.name)
            if ops.get(s.node) in (None, "output"):
                r.fail(_join(p, "node"), f"names {s.node!r}, which is not a node of capacity.program the program can "
                                         f"be cut after")
            for j, (t, _) in enumerate(s.tensors):
                if t not in ops:
                    r.fail(f"{p}.tensors[{j}][0]", f"names {t!r}, which is not a node of capacity.program")
    # files the manifest points at are listed (and so checked) in `files`
    listed = set(files)
    refs = [(_join("profiles", k), f) for k, f in (profiles.items() if isinstance(profiles, dict) else ())]
    if precision is not None:
        refs.append(("precision.file", precision.file))
    if samples is not None:
        refs.append(("samples.file", samples.file))
    for path, s in zip(set_paths, sets):
        if s is not None:
            refs.append((_join(path, "profile"), s.profile))
            if s.calibration is not None:
                refs.append((_join(_join(path, "calibration"), "file"), s.calibration.get("file")))
    refs += [(_join(_join("onnx", i), "file"), o.file) for i, o in enumerate(onnx) if o is not None]
    for path, rel in refs:
        if isinstance(rel, str) and rel not in listed:
            r.fail(path, f"names {rel!r}, which `files` does not list (so it is neither shipped nor checked)")


def _check_header(r: _Reader, weights: Weights, header: Mapping[str, Any]) -> None:
    if not isinstance(header, Mapping):
        r.fail("weights", f"cannot be checked: the {WEIGHTS} header is not a JSON object")
        return
    body = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in weights.tensors.items():
        p = _join(_join("weights", "tensors"), name)
        got = body.get(name)
        if got is None:
            r.fail(p, f"is in the manifest but not in {WEIGHTS}")
            continue
        dtype = got.get("dtype") if isinstance(got, Mapping) else None
        shape = got.get("shape") if isinstance(got, Mapping) else None
        dtype = _SAFETENSORS_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
            r.fail(p, f"cannot be checked: {WEIGHTS} gives it no valid shape ({_show(got)})")
        elif list(shape) != list(info.shape) or dtype != info.dtype:
            r.fail(p, f"says {info.dtype}{list(info.shape)}, but {WEIGHTS} holds {dtype}{list(shape)}")
    extra = sorted(set(body) - set(weights.tensors))
    if extra:
        r.fail(_join("weights", "tensors"), f"does not list tensors {WEIGHTS} holds: {extra[:5]}"
                                            f"{f' and {len(extra) - 5} more' if len(extra) > 5 else ''}")


def _check_program_tensors(r: _Reader, prog: Program, path: str, table: Mapping[str, TensorInfo]) -> bool:
    """Every params entry names a tensor of the table, of a dtype its op can use."""
    ok = True
    for i, n in enumerate(prog.nodes):
        np_ = _join(path, i)
        entries = [("params", None, n.params)] if n.params is not None else []
        entries += [("params_per_level", k, p) for k, p in enumerate(n.params_per_level or ())]
        for key, k, params in entries:
            base = _join(np_, key) if k is None else _join(_join(np_, key), k)
            for role, t in (params or {}).items():
                info = table.get(t)
                if info is None:
                    r.fail(_join(base, role), f"names tensor {t!r}, which weights.tensors does not hold "
                                              f"(node {n.name!r})")
                    ok = False
                elif n.op != "param" and info.dtype not in FLOAT_DTYPES:
                    r.fail(_join(base, role), f"names {info.dtype} tensor {t!r}; a `{n.op}` node computes "
                                              f"with floating-point weights")
                    ok = False
    # the index of an index_select is an integer tensor
    for i, n in enumerate(prog.nodes):
        if n.op == "index_select" and isinstance(n.args[1], str):
            src = prog.node(n.args[1])
            t = (src.params or {}).get("value") if src is not None else None
            info = table.get(t) if t else None
            if info is not None and (info.dtype not in INDEX_DTYPES or len(info.shape) != 1):
                r.fail(_join(_join(_join(path, i), "args"), 1),
                       f"names param {n.args[1]!r} holding {info.dtype}{list(info.shape)}; an index is a 1-d int64 "
                       f"tensor")
                ok = False
    return ok


def _channels(prog: Program, table: Mapping[str, TensorInfo], cap: Capacity | None, level: int,
              in_ch: int | None, r: _Reader | None = None, path: str = "", label: str = "") -> dict[str, int | None]:
    """Channels (dim 1) of every node's output at ``level``, where the program determines them.

    With ``r``, also checks that conv, linear-free and BatchNorm weights fit the channels they read.
    """
    ch: dict[str, int | None] = {}

    def shape(t: str | None) -> tuple[int, ...] | None:
        if t is None or t not in table:
            return None
        return cap.region(t, level, table[t].shape) if cap is not None else table[t].shape

    for i, n in enumerate(prog.nodes):
        first = n.args[0] if n.args and isinstance(n.args[0], str) else None
        src = ch.get(first) if first is not None else None
        params = n.level_params(level)
        out: int | None = None
        if n.op == "input":
            out = in_ch
        elif n.op == "conv2d":
            w = shape(params.get("weight"))
            if w is not None and len(w) == 4:
                out = w[0]
                depthwise = n.attrs.get("depthwise")
                want = w[0] if depthwise else w[1] * n.attrs.get("groups", 1)
                if r is not None and src is not None and want != src:
                    r.fail(_join(path, i), f"(conv2d {n.name!r}) reads {src} channels{label}, but its weight "
                                           f"{'region ' if cap else ''}{list(w)} takes {want}")
        elif n.op == "linear":
            w = shape(params.get("weight"))
            out = w[0] if w is not None and len(w) == 2 else None
        elif n.op in _SAME_CHANNELS:
            out = src
            if n.op == "batch_norm" and r is not None and src is not None:
                m = shape(params.get("running_mean"))
                if m is not None and m != (src,):
                    r.fail(_join(path, i), f"(batch_norm {n.name!r}) normalises {src} channels{label}, but its "
                                           f"running_mean {'region ' if cap else ''}is {list(m)}")
        elif n.op in ("add", "sub", "mul"):
            known = [ch.get(a) for a in n.args if isinstance(a, str) and ch.get(a) is not None]
            out = known[0] if known else None
        elif n.op == "index_select":
            idx = prog.node(n.args[1]) if isinstance(n.args[1], str) else None
            t = shape((idx.params or {}).get("value") if idx is not None else None)
            out = (t[0] if t else None) if n.attrs.get("dim") == 1 else src
        elif n.op == "flatten":
            out = src if n.attrs.get("start_dim", 0) > 1 else None
        ch[n.name] = out
    return ch


def _check_capacity(r: _Reader, cap: Capacity, table: Mapping[str, TensorInfo], in_ch: int | None) -> bool:
    """Whether the capacity program can be walked at every level (what the exit-set checks rely on)."""
    K = cap.num_levels
    path = "capacity.program"
    ok = _check_program_tensors(r, cap.program, path, table)
    for i, n in enumerate(cap.program.nodes):
        if n.params_per_level is not None and len(n.params_per_level) not in (1, K):
            r.fail(f"{path}[{i}].params_per_level", f"has {len(n.params_per_level)} entries, expected 1 or {K} "
                                                     f"(one per level, capacity.num_levels)")
            ok = False
    # regions: each per-level shape fits inside its tensor
    for name, per in cap.regions.items():
        p = _join("capacity.regions", name)
        info = table.get(name)
        if info is None:
            r.fail(p, f"names tensor {name!r}, which weights.tensors does not hold")
            ok = False
            continue
        for k, s in enumerate(per):
            if s is None:
                continue
            if len(s) != len(info.shape) or any(a > b for a, b in zip(s, info.shape)):
                r.fail(_join(p, k), f"must be a shape of rank {len(info.shape)} inside the tensor's "
                                    f"{list(info.shape)} (each 0 <= r <= dim), got {_show(list(s))}")
                ok = False
    if not ok:
        return False
    # each level reads only tensors it has a region for
    for k in range(K):
        for i, n in enumerate(cap.program.nodes):
            for t in n.level_params(k).values():
                per = cap.regions.get(t)
                if per is not None and per[k] is None:
                    r.fail(_join(_join(path, i), "params"), f"(node {n.name!r}) reads {t!r} at level {k}, but "
                                                            f"capacity.regions gives that level no region of it")
                    ok = False
    if not ok:
        return False
    # level_bytes: what the runtime keeps resident at each level
    names = cap.program.tensor_names()
    for k in range(K):
        total = 0
        for t in names:
            s = cap.region(t, k, table[t].shape)
            total += 0 if s is None else math.prod(s) * DTYPES[table[t].dtype]
        if total != cap.level_bytes[k]:
            r.fail(f"capacity.level_bytes[{k}]", f"must be the bytes level {k} reads ({total}, from the program's "
                                                 f"tensors and regions), got {_show(cap.level_bytes[k])}")
    for k in range(K):
        _channels(cap.program, table, cap, k, in_ch, r, path, f" at level {k}")
    return True  # wrong byte counts or channels are reported, but the program can still be walked


def _check_exit_set(r: _Reader, s: ExitSet, path: str, cap: Capacity, table: Mapping[str, TensorInfo],
                    in_ch: int | None) -> None:
    K = cap.num_levels
    if s.backbone == "shared":
        if s.level is not None and s.level != K - 1:
            r.fail(_join(path, "level"), f"must be {K - 1} (the largest level: a shared backbone runs there), "
                                         f"got {_show(s.level)}")
        prog, prog_path, level, region_cap = cap.program, "capacity.program", K - 1, cap
    else:
        prog, prog_path, level, region_cap = s.program, _join(path, "program"), 0, None
        if not _check_program_tensors(r, prog, prog_path, table):
            return
    order = {n.name: i for i, n in enumerate(prog.nodes)}
    last = -1
    for j, tap in enumerate(s.taps):
        p = _join(_join(path, "taps"), j)
        pos = order.get(tap)
        if pos is None or prog.nodes[pos].op in ("output", "param"):
            r.fail(p, f"names {tap!r}, which is not a node of the backbone program ({prog_path}) a head can read")
        elif pos <= last:
            r.fail(p, f"names {tap!r}, which does not come after the previous tap; taps are in execution order")
        else:
            last = pos
    ch = _channels(prog, table, region_cap, level, in_ch)
    for j, head in enumerate(s.heads):
        hp = _join(_join(path, "heads"), j)
        if not _check_program_tensors(r, head.program, _join(hp, "program"), table):
            continue
        tapped = ch.get(s.taps[j]) if j < len(s.taps) else None
        if head.tap_channels is not None and tapped is not None and head.tap_channels != tapped:
            r.fail(_join(hp, "tap_channels"), f"must be the channels of tap {s.taps[j]!r} ({tapped}), "
                                              f"got {_show(head.tap_channels)}")
        if head.filters is not None:
            t = head.index_tensor()
            info = table.get(t) if t else None
            if info is not None and list(info.shape) != [len(head.filters)]:
                r.fail(_join(hp, "filters"), f"lists {len(head.filters)} filters, but the index tensor {t!r} holds "
                                             f"{list(info.shape)}")
        _channels(head.program, table, None, 0, tapped, r, _join(hp, "program"), "")
