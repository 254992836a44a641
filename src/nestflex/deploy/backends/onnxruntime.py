"""onnxruntime backends: float32, int8 (QDQ), mixed precision and channel-padded levels, and exit
sets as stage/head sessions or one fused early-exit graph.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from nestflex.deploy.backends.base import Backend, BackendError, Fn, _built, level_onnx, tuned_dir
from nestflex.deploy.backends.fused_exits import FUSED_CONFIDENCES, fuse_exits
from nestflex.deploy.backends.quantize import mixed_float_layers, pad_level, quantize_level

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeInt8Backend", "OnnxRuntimeMixedBackend", "OnnxRuntimePaddedBackend", "OnnxRuntimeInt8PaddedBackend", "OnnxRuntimeMixedPaddedBackend", "fused_exits_path"]

class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    package = "onnxruntime"
    own_weights = True
    pad_to = 1  # >1: the level's widths zero-padded to this multiple (pad_level)

    def model_path(self, bundle: Any, level: int) -> Path:
        """The ONNX file this backend runs for ``level``: the one the bundle ships."""
        return level_onnx(bundle, level)

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        path = self.model_path(runtime.bundle, level)
        session = _session(path, threads, tuned_dir(runtime.bundle) / f"{path.stem}.optimized.onnx")
        name = session.get_inputs()[0].name
        runtime._session_bytes = path.stat().st_size

        def run(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(session.run(None, {name: x.detach().contiguous().numpy()})[0])

        return run


    def prepare_exits(self, runtime: Any, threads: int) -> tuple[list[Callable], list[Callable]]:
        if self.precision != "float32" or self.pad_to > 1:
            return super().prepare_exits(runtime, threads)
        bundle, kind = runtime.bundle, runtime.spec.kind
        files = {(o.kind, o.extra.get("stage", o.extra.get("exit"))): o for o in bundle.spec.onnx
                 if o.kind in ("stage", "exit") and o.exit_set == kind}
        n = runtime.num_exits
        missing = [f"{k} {i}" for k, count in (("stage", n), ("exit", n - 1)) for i in range(count) if (k, i) not in files]
        if missing:
            raise BackendError(f"bundle {str(bundle.path)!r} has no ONNX file for {kind} exits' {', '.join(missing)}. "
                               f"HINT: re-export it with onnx=True, or plan `eager` for its exits")
        tuned = tuned_dir(bundle)
        runtime._session_bytes = 0
        taps = [int(files[("stage", k)].extra.get("tap_output") or 0) for k in range(n - 1)]

        def open_(path: Path, optimized_copy: bool = True) -> Any:
            # no optimised copy of the fused graph: onnxruntime (1.31) saves its If branches with
            # clashing names (its NCHWc `reorder` outputs), a file it then refuses to load
            session = _session(path, threads, tuned / f"{path.stem}.optimized.onnx" if optimized_copy else None)
            runtime._session_bytes += path.stat().st_size  # counted once it is open
            return session

        def lazy(entry: Any) -> Callable[[], Any]:
            """The entry's session, opened on first use: with the fused graph serving single
            frames, the per-stage sessions (batches, single exits) cost memory only once used."""
            import threading

            opened: list[Any] = []
            lock = threading.Lock()

            def get() -> Any:
                if not opened:
                    with lock:  # one session per entry, even when two threads ask first
                        if not opened:
                            opened.append(open_(bundle.file(entry.file)))
                return opened[0]

            return get

        def stage(session: Callable[[], Any]) -> Callable:
            def run(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
                s = session()
                feed = {i.name: v.detach().contiguous().numpy() for i, v in zip(s.get_inputs(), values)}
                return tuple(torch.from_numpy(o) for o in s.run(None, feed))

            return run

        def head(session: Callable[[], Any], tap: int) -> Callable:
            def run(state: tuple[torch.Tensor, ...]) -> torch.Tensor:
                s = session()
                return torch.from_numpy(s.run(None, {s.get_inputs()[0].name: state[tap].detach().contiguous().numpy()})[0])

            return run

        runtime._fused = None
        if runtime.confidence in FUSED_CONFIDENCES:
            try:
                path = fused_exits_path(bundle, runtime.exit_set, runtime.confidence, runtime.fallback,
                                        [bundle.file(files[("stage", k)].file) for k in range(n)],
                                        [bundle.file(files[("exit", k)].file) for k in range(n - 1)], taps,
                                        runtime.active)
                runtime._fused = _fused_call(open_(path, optimized_copy=False))
            except Exception as e:  # an optimisation, not a requirement: the stages still run one by one
                warnings.warn(f"{runtime.exit_set} of {str(bundle.path)!r}: the fused early-exit graph could not "
                              f"be built ({type(e).__name__}: {str(e)[:200]}); single frames run stage by stage",
                              stacklevel=3)
        stages = [stage(lazy(files[("stage", k)])) for k in range(n)]
        heads = [head(lazy(files[("exit", k)]), taps[k]) for k in range(n - 1)]
        return stages, heads + [lambda state: state[0]]


def _fused_call(session: Any) -> Callable[[torch.Tensor, Sequence[float]], Any]:
    """``fn(x (1, ...), thresholds) -> ExitResult`` over a fused early-exit session."""
    import numpy as np

    from nestflex.deploy.exits import ExitResult

    def run(x: torch.Tensor, thresholds: Sequence[float]) -> ExitResult:
        thr = np.asarray(thresholds if thresholds else [1.0], dtype=np.float32)
        logits, index, answer, conf = session.run(None, {"input": x.detach().contiguous().numpy(), "thresholds": thr})
        return ExitResult(torch.from_numpy(logits), torch.from_numpy(index), torch.from_numpy(answer),
                          torch.from_numpy(conf).to(torch.get_default_dtype()))

    return run


def fused_exits_path(bundle: Any, key: str, confidence: str, fallback: str, stages: Sequence[Path],
                     heads: Sequence[Path], taps: Sequence[int], active: Sequence[int] | None = None) -> Path:
    """The fused early-exit graph of exit set ``key`` (:mod:`nestflex.deploy.backends.fused_exits`) over the
    early exits ``active`` (default all): from the folder beside the bundle, or built now (a
    fraction of a second) and kept there; the temp folder when the bundle's folder cannot be written."""
    active = None if active is None else sorted(set(active))
    kept = "" if active is None or active == list(range(len(heads))) else "-a" + ".".join(str(k) for k in active)
    return _built(bundle, f"{key}.fused-{confidence}-{fallback}{kept}.onnx",
                  lambda target: fuse_exits(stages, heads, taps, bundle.spec.num_classes, confidence, fallback, target,
                                            active))


def _session(path: Path, threads: int, cache: Path | None) -> Any:
    """An onnxruntime session for ``path`` with all graph optimisations.

    The optimised graph is saved to ``cache`` the first time and opened with optimisations off
    afterwards: building a session is most of a level switch's time, and the graph optimiser is
    most of that. The saved graph may use this CPU's kernels (onnxruntime's NCHWc layouts), which
    is why it lives in the device's tuned folder beside the bundle, never in the bundle.
    ``cache=None``: optimise every time, save nothing.
    """
    import onnxruntime as ort

    def options(level: Any) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = level
        opts.log_severity_level = 3  # its notes on the graphs it optimises (If branches' names) are not for users
        return opts

    providers = ["CPUExecutionProvider"]
    if cache is None:
        return ort.InferenceSession(str(path), options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL), providers=providers)
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
