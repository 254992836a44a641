"""onnxruntime backends: float32, int8 (QDQ), mixed precision and channel-padded levels, and exit
sets as stage/head sessions or one fused early-exit graph.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from nestflex.deploy.backends.base import (Backend, ExitsContext, LevelContext, Prepared, PreparedExits, _built,
                                           tuned_dir)
from nestflex.deploy.backends.graphs import exit_graphs, level_graph
from nestflex.deploy.backends.fused_exits import FUSED_CONFIDENCES, fuse_exits, weights_file
from nestflex.deploy.backends.quantize import mixed_float_layers, pad_level, quantize_level
from nestflex.deploy.exits import ExitResult
from nestflex.deploy._memory import release_freed

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeProgramBackend", "OnnxRuntimeInt8Backend", "OnnxRuntimeMixedBackend",
           "OnnxRuntimePaddedBackend", "OnnxRuntimeInt8PaddedBackend", "OnnxRuntimeMixedPaddedBackend", "fused_exits_path"]

class OnnxRuntimeBackend(Backend):
    """The level's ONNX graph (the bundle's, or one written from its program:
    :func:`~nestflex.deploy.backends.graphs.level_graph`) in an onnxruntime session with every graph
    optimisation; exit sets as one session per stage and head, plus the fused one-call early exit
    for a single frame when it can be built (:mod:`nestflex.deploy.backends.fused_exits`)."""

    name = "onnxruntime"
    package = "onnxruntime"
    own_weights = True
    pad_to = 1  # >1: the level's widths zero-padded to this multiple (pad_level)
    program = False  # True: the graphs written from the bundle's program, never its shipped ones
    fuse = True  # serve single frames of an exit set with the fused early-exit graph when it can be built

    def model_path(self, bundle: Any, level: int) -> Path:
        """The ONNX file this backend runs for ``level``."""
        return level_graph(bundle, level, program=self.program)

    def prepare(self, ctx: LevelContext) -> Prepared:
        path = self.model_path(ctx.bundle, ctx.level)
        session = _session(path, ctx.threads, tuned_dir(ctx.bundle) / f"{path.stem}.optimized.onnx")
        name = session.get_inputs()[0].name

        def run(x: np.ndarray) -> np.ndarray:
            return session.run(None, {name: x})[0]

        return Prepared(run, path.stat().st_size)

    def prepare_exits(self, ctx: ExitsContext) -> PreparedExits:
        if self.precision != "float32" or self.pad_to > 1:
            return super().prepare_exits(ctx)
        bundle = ctx.bundle
        stage_files, head_files, taps = exit_graphs(bundle, ctx.key, program=self.program)
        tuned = tuned_dir(bundle)
        held = [0]

        def open_(path: Path, optimized_copy: bool = True, spin: bool = True) -> Any:
            # no optimised copy of the fused graph: onnxruntime (1.31) saves its If branches with
            # clashing names (its NCHWc `reorder` outputs), a file it then refuses to load
            session = _session(path, ctx.threads, tuned / f"{path.stem}.optimized.onnx" if optimized_copy else None,
                               spin)
            held[0] += path.stat().st_size  # counted once it is open
            if weights_file(path).is_file():  # the fused graph's weights, beside it
                held[0] += weights_file(path).stat().st_size
            return session

        # the sessions a batched call opens (every stage, the kept heads): once the last of them is open,
        # the heap pages their builds freed go back to the OS (release_freed), 3.5 MB over the default
        # recipe's two exit sets (issue 37). Once for the group, not after each session: a trim between
        # builds made the next build fault its pages in again, 90 ms more on the first batched calls.
        group = len(stage_files) + len(set(ctx.active))
        count = [0]
        count_lock = threading.Lock()

        def lazy(path: Path) -> Callable[[], Any]:
            """The file's session, opened on first use: with the fused graph serving single frames,
            the per-stage sessions (batches, single exits) cost memory only once used."""
            opened: list[Any] = []
            lock = threading.Lock()

            def get() -> Any:
                if not opened:
                    with lock:  # one session per file, even when two threads ask first
                        if not opened:
                            # a batch runs the stage and head sessions one after another: each one's
                            # idle threads spinning took the cores from the next one's. On the default
                            # recipe's bundle (2 threads a session, 2 cores) a batch of 8 through the
                            # 13 sessions of `exits` took 27.5 ms spinning, 2.4-2.8 without, on a
                            # quiet CPU (issue 37 probe, side by side)
                            opened.append(open_(path, spin=False))
                            with count_lock:
                                count[0] += 1
                                done = count[0] >= group
                            if done:  # the group's last (or a session beyond it: a head outside `active`)
                                release_freed()
                return opened[0]

            return get

        def stage(session: Callable[[], Any]) -> Callable:
            def run(*values: np.ndarray) -> tuple[np.ndarray, ...]:
                s = session()
                return tuple(s.run(None, {i.name: v for i, v in zip(s.get_inputs(), values)}))

            return run

        def head(session: Callable[[], Any], tap: int) -> Callable:
            def run(state: tuple[np.ndarray, ...]) -> np.ndarray:
                s = session()
                return s.run(None, {s.get_inputs()[0].name: state[tap]})[0]

            return run

        fused = None
        if self.fuse and ctx.fused and ctx.confidence in FUSED_CONFIDENCES:
            try:
                path = fused_exits_path(bundle, ctx.key, ctx.confidence, ctx.fallback, stage_files, head_files, taps,
                                        ctx.active)
                fused = _fused_call(open_(path, optimized_copy=False))
            except ModuleNotFoundError as e:  # the graph is built with `onnx` (nestflex[tune]); `nestflex tune` builds it
                warnings.warn(f"{ctx.key} of {str(bundle.path)!r}: no fused early-exit graph ({e.name} is not "
                              f"installed); single frames run stage by stage. HINT: run `nestflex tune` where "
                              f"nestflex[tune] is installed, it keeps the graph beside the bundle", stacklevel=4)
            except Exception as e:  # an optimisation, not a requirement: the stages still run one by one
                warnings.warn(f"{ctx.key} of {str(bundle.path)!r}: the fused early-exit graph could not "
                              f"be built ({type(e).__name__}: {str(e)[:200]}); single frames run stage by stage",
                              stacklevel=4)
        stages = [stage(lazy(p)) for p in stage_files]
        heads = [head(lazy(p), t) for p, t in zip(head_files, taps)]
        return PreparedExits(stages, heads + [lambda state: state[0]], fused, lambda: held[0])


class OnnxRuntimeProgramBackend(OnnxRuntimeBackend):
    """``onnxruntime`` on the graphs written from the bundle's op program
    (:mod:`nestflex.deploy.onnxgraph`) even when the bundle ships its own, exit sets stage by stage
    (no fused graph): the program's float32 reference where torch is not installed, which
    ``nestflex tune`` checks every candidate against (:func:`nestflex.deploy.tune.reference_backend`).
    Needs numpy and onnxruntime only."""

    name = "onnxruntime_program"
    program = True
    fuse = False


def _fused_call(session: Any) -> Callable[[np.ndarray, Sequence[float]], Any]:
    """``fn(x (1, ...), thresholds) -> ExitResult`` over a fused early-exit session."""

    def run(x: np.ndarray, thresholds: Sequence[float]) -> ExitResult:
        thr = np.asarray(thresholds if thresholds else [1.0], dtype=np.float32)
        logits, index, answer, conf = session.run(None, {"input": x, "thresholds": thr})
        return ExitResult(logits, index, answer, conf.astype(np.float32, copy=False))

    return run


def fused_exits_path(bundle: Any, key: str, confidence: str, fallback: str, stages: Sequence[Path],
                     heads: Sequence[Path], taps: Sequence[int], active: Sequence[int] | None = None) -> Path:
    """The fused early-exit graph of exit set ``key`` (:mod:`nestflex.deploy.backends.fused_exits`) over the
    early exits ``active`` (default all): from the folder beside the bundle, or built now (a
    fraction of a second) and kept there; the temp folder when the bundle's folder cannot be written."""
    active = None if active is None else sorted(set(active))
    kept = "" if active is None or active == list(range(len(heads))) else "-a" + ".".join(str(k) for k in active)
    # the version tag changes whenever the file's form does, so a file a device kept from an older
    # nestflex is rebuilt, not reused (v3: the weights in a file beside the graph)
    return _built(bundle, f"{key}.fused-v3-{confidence}-{fallback}{kept}.onnx",
                  lambda target: fuse_exits(stages, heads, taps, bundle.spec.num_classes, confidence, fallback, target,
                                            active))


def _session(path: Path, threads: int, cache: Path | None, spin: bool = True) -> Any:
    """An onnxruntime session for ``path`` with all graph optimisations.

    The optimised graph is saved to ``cache`` the first time and opened with optimisations off
    afterwards: building a session is most of a level switch's time, and the graph optimiser is
    most of that. The saved graph may use this CPU's kernels (onnxruntime's NCHWc layouts), which
    is why it lives in the device's tuned folder beside the bundle, never in the bundle.
    ``cache=None``: optimise every time, save nothing. ``spin=False``: the session's intra-op
    threads sleep when idle instead of spinning (for sessions run one after another, see
    :meth:`OnnxRuntimeBackend.prepare_exits`).
    """
    import onnxruntime as ort

    def options(level: Any) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = level
        opts.log_severity_level = 3  # its notes on the graphs it optimises (If branches' names) are not for users
        # no memory arena: each run allocates its tensors from the heap. The arena kept its largest run's
        # tensors per session, 15 MB over the default recipe's levels and exit sets, and the latency was
        # the same within 1% at batch 1 and 8 (docs/deploy.md: memory)
        opts.enable_cpu_mem_arena = False
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts

    providers = ["CPUExecutionProvider"]
    if cache is None:
        session = ort.InferenceSession(str(path), options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL), providers=providers)
        release_freed()  # the optimiser's copies of the graph, freed but still resident
        return session
    if cache.is_file():
        try:
            return ort.InferenceSession(str(cache), options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL), providers=providers)
        except Exception:  # a damaged or foreign cache file: rebuild it from the bundle's graph
            pass
    opts = options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)  # quiet: that the saved graph is for this CPU is the point
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        opts.optimized_model_filepath = str(tmp)
    except OSError:  # a folder that cannot be written: no cache, same session
        tmp = None
    session = ort.InferenceSession(str(path), opts, providers=providers)
    if tmp is not None and tmp.is_file():
        os.replace(tmp, cache)
    release_freed()
    return session


class OnnxRuntimeInt8Backend(OnnxRuntimeBackend):
    """The level's ONNX graph statically quantised to int8 (onnxruntime QDQ: per-channel int8 weights,
    uint8 activations, MinMax ranges calibrated on the first half of the bundle's samples).

    Why onnxruntime QDQ and not torch's pt2e/fx: the deploy side already runs onnxruntime, the
    bundle already ships each level's graph, QDQ keeps the quantised graph a plain ONNX file, and
    deployment needs no torch compiler stack (the speed-up is measured in docs/synthesis.md). The
    quantised files are built once per bundle and level and cached beside the bundle
    (:func:`quantize_level`), so a level switch only opens a session.
    """

    name = "onnxruntime_int8"
    precision = "int8"

    def model_path(self, bundle: Any, level: int) -> Path:
        return quantize_level(bundle, level)


class OnnxRuntimeMixedBackend(OnnxRuntimeInt8Backend):
    """int8 except the layers the bundle's per-layer precision plan keeps in float (the landed
    precision profiler's assignment, ``manifest["precision"]``: accuracy) and the layers whose
    int8 kernel is slower than their float32 one on this device (:func:`slow_int8_layers`: time):
    Cappuccino's per-layer precision, int8 where it is both accurate enough and faster."""

    name = "onnxruntime_mixed"
    precision = "mixed"

    def model_path(self, bundle: Any, level: int) -> Path:
        return quantize_level(bundle, level, keep_float=mixed_float_layers(bundle))


class OnnxRuntimePaddedBackend(OnnxRuntimeBackend):
    """``onnxruntime`` on the level with its widths zero-padded to a multiple of 8
    (:mod:`nestflex.deploy.backends.padding`): the same logits, more MACs, onnxruntime's blocked kernels
    instead of the odd-width fallbacks. A level whose graph the padding does not support is not a
    candidate."""

    name = "onnxruntime_pad8"
    pad_to = 8

    def model_path(self, bundle: Any, level: int) -> Path:
        return pad_level(bundle, level, self.pad_to)


class OnnxRuntimeInt8PaddedBackend(OnnxRuntimeInt8Backend):
    """``onnxruntime_int8`` on the padded level (see :class:`OnnxRuntimePaddedBackend`)."""

    name = "onnxruntime_int8_pad8"
    pad_to = 8

    def model_path(self, bundle: Any, level: int) -> Path:
        return quantize_level(bundle, level, pad_to=self.pad_to)


class OnnxRuntimeMixedPaddedBackend(OnnxRuntimeMixedBackend):
    """``onnxruntime_mixed`` on the padded level (see :class:`OnnxRuntimePaddedBackend`)."""

    name = "onnxruntime_mixed_pad8"
    pad_to = 8

    def model_path(self, bundle: Any, level: int) -> Path:
        return quantize_level(bundle, level, keep_float=mixed_float_layers(bundle), pad_to=self.pad_to)
