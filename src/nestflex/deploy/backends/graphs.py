"""The ONNX graph of every piece of a bundle the runtime runs: levels, exit stages and heads, split
heads and tails.

A bundle exported with ``onnx=True`` ships the graphs of its levels and exit sets (written by
``torch.onnx`` on the training side); those are used as they are. Anything a bundle does not ship
(a bundle exported with ``onnx=False``, any split's head and tail) is written here from the
bundle's own op program by :mod:`nestflex.deploy.onnxgraph` (numpy only, no torch, no onnx), with
the weights read from the bundle's safetensors file, and kept in the bundle's tuned folder
(:func:`~nestflex.deploy.backends.base.tuned_dir`), so each graph is written once per device.
Every function returns a path onnxruntime opens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from nestflex._io import atomic_write_bytes
from nestflex.deploy.backends.base import BackendError, _built
from nestflex.deploy.bundle.program import cut_program
from nestflex.deploy.bundle.weights import level_tensors
from nestflex.deploy.onnxgraph import infer_shapes, program_to_onnx, stages_to_onnx

__all__ = ["level_graph", "exit_graphs", "split_graphs", "cut_graphs", "shipped_level_graph"]


def shipped_level_graph(bundle: Any, level: int) -> Path | None:
    """The ONNX file the bundle ships for ``level``, or ``None``."""
    entry = next((o for o in bundle.spec.onnx if o.kind == "level" and o.extra.get("level") == level), None)
    return None if entry is None else bundle.file(entry.file)


def _input(bundle: Any) -> dict[str, tuple]:
    nodes = bundle.spec.capacity.program.nodes
    return {nodes[0].name: (None, *bundle.spec.input.shape)}


def _check_level(bundle: Any, level: int) -> None:
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < bundle.num_levels:
        raise BackendError(f"`level` must be an int in [0, {bundle.num_levels - 1}], got {level!r}")


def level_graph(bundle: Any, level: int, *, program: bool = False) -> Path:
    """The ONNX graph of ``level``: the bundle's own file, else one written from its program
    (always the program's with ``program=True``: the reference the shipped graphs are checked against)."""
    _check_level(bundle, level)
    shipped = None if program else shipped_level_graph(bundle, level)
    if shipped is not None:
        return shipped
    nodes = bundle.spec.capacity.program.nodes

    def build(target: Path) -> None:
        model = program_to_onnx(nodes, level_tensors(bundle, level), _input(bundle), level=level,
                                name=f"level_{level}")
        atomic_write_bytes(target, model)

    return _built(bundle, f"level_{level}.program.onnx", build)


def _exit_set(bundle: Any, key: str) -> Any:
    ex = bundle.spec.exit_set(key)
    if ex is None:
        raise BackendError(f"bundle {str(bundle.path)!r} has no exit set {key!r}")
    return ex


def exit_graphs(bundle: Any, key: str, *, program: bool = False) -> tuple[list[Path], list[Path], list[int]]:
    """An exit set's stage graphs (one per exit), head graphs (one per early exit) and, per early exit,
    which of its stage's outputs the head reads.

    The bundle's shipped stage and head files when it has all of them; else graphs written from the
    set's programs: the backbone (the capacity program's largest level when shared, the set's own
    program otherwise) cut after each tap, each head from its program. A written stage returns the
    tapped value first, so each head reads output 0. ``program=True``: always the written ones.
    """
    ex = _exit_set(bundle, key)
    n = len(ex.names)
    files = {} if program else {(o.kind, o.extra.get("stage", o.extra.get("exit"))): o for o in bundle.spec.onnx
                                if o.kind in ("stage", "exit") and o.exit_set == ex.kind}
    if all(("stage", k) in files for k in range(n)) and all(("exit", k) in files for k in range(n - 1)):
        return ([bundle.file(files[("stage", k)].file) for k in range(n)],
                [bundle.file(files[("exit", k)].file) for k in range(n - 1)],
                [int(files[("stage", k)].extra.get("tap_output") or 0) for k in range(n - 1)])
    if ex.backbone == "shared":
        nodes, level = bundle.spec.capacity.program.nodes, bundle.num_levels - 1
        names, regions, levels = None, None, None
    else:
        nodes, level = ex.program.nodes, 0
        names, regions, levels = ex.program.tensor_names(), {}, 1
    stages = cut_program(nodes, ex.taps)
    inputs = {nodes[0].name: (None, *bundle.spec.input.shape)}
    tag = f"{ex.kind}"
    tensors_cache: list[Any] = []

    def tensors() -> Any:
        if not tensors_cache:
            tensors_cache.append(level_tensors(bundle, level, names, regions, levels))
        return tensors_cache[0]

    def build_stages(targets: Sequence[Path]) -> None:
        for target, model in zip(targets, stages_to_onnx(stages, tensors(), inputs, level=level, name=f"{tag}_stage")):
            atomic_write_bytes(target, model)

    stage_paths: list[Path] = []
    for k in range(n):
        def build(target: Path, k: int = k) -> None:  # one pass writes every stage; the rest are found
            others = [target.with_name(f"{tag}.stage_{j}.program.onnx") for j in range(n)]
            others[k] = target
            build_stages(others)

        stage_paths.append(_built(bundle, f"{tag}.stage_{k}.program.onnx", build))
    head_paths = []
    if n > 1:
        shapes = infer_shapes(nodes, tensors(), inputs, level)
    for k, head in enumerate(ex.heads):
        hnodes = head.program.nodes

        def build(target: Path, hnodes: Any = hnodes, tap: str = ex.taps[k], k: int = k) -> None:
            weights = level_tensors(bundle, 0, head.program.tensor_names(), {}, 1) if head.program.tensor_names() else {}
            model = program_to_onnx(hnodes, weights, {hnodes[0].name: shapes[tap]}, name=f"{tag}_head_{k}")
            atomic_write_bytes(target, model)

        head_paths.append(_built(bundle, f"{tag}.head_{k}.program.onnx", build))
    return stage_paths, head_paths, [0] * (n - 1)


def split_graphs(bundle: Any, node: str, level: int | None = None) -> tuple[Path, Path, list[str]]:
    """The head and tail graphs of the capacity program at ``level`` (default: the largest) cut after
    ``node``, and the names of the tensors that cross (the head's outputs, the tail's inputs, in order)."""
    level = bundle.num_levels - 1 if level is None else level
    _check_level(bundle, level)
    nodes = bundle.spec.capacity.program.nodes
    (ins, head, outs), (_, tail, _) = cut_program(nodes, [node])
    cache: list[Any] = []

    def build(target: Path, part: int) -> None:
        if not cache:
            cache.extend(stages_to_onnx([(ins, head, outs), (outs, tail, [])], level_tensors(bundle, level),
                                        _input(bundle), level=level, name=f"split_{node}"))
        atomic_write_bytes(target, cache[part])

    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in node)
    head_path = _built(bundle, f"split.{safe}.l{level}.head.program.onnx", lambda t: build(t, 0))
    tail_path = _built(bundle, f"split.{safe}.l{level}.tail.program.onnx", lambda t: build(t, 1))
    return head_path, tail_path, list(outs)


def cut_graphs(bundle: Any, cuts: Sequence[str],
               level: int | None = None) -> tuple[list[Path], list[tuple[list[str], list[str]]]]:
    """The capacity program at ``level`` (default: the largest) cut after each node of ``cuts`` (in
    execution order): one graph per stage, and per stage the names of the values it takes and
    returns (``cut_program``'s; the last stage returns the logits, its output list is empty).

    What a split with exits on both sides runs (:class:`~nestflex.deploy.split.SplitRuntime`: cut at
    the split and at every exit tap). The files are named after a digest of the cuts, so each
    set of cuts is written once per device and shared by every runtime that asks for it.
    """
    import hashlib

    level = bundle.num_levels - 1 if level is None else level
    _check_level(bundle, level)
    nodes = bundle.spec.capacity.program.nodes
    stages = cut_program(nodes, list(cuts))
    digest = hashlib.sha256("\n".join(cuts).encode()).hexdigest()[:12]
    tag = f"cut.{digest}.l{level}"

    def build(target: Path, k: int) -> None:  # one pass writes every stage; the rest are found
        models = stages_to_onnx(stages, level_tensors(bundle, level), _input(bundle), level=level, name=tag)
        for j, model in enumerate(models):
            other = target.with_name(f"{tag}.stage_{j}.program.onnx")
            if j == k or not other.is_file():
                atomic_write_bytes(other, model)

    paths = [_built(bundle, f"{tag}.stage_{k}.program.onnx", lambda t, k=k: build(t, k)) for k in range(len(stages))]
    return paths, [(list(ins), list(outs)) for ins, _, outs in stages]
