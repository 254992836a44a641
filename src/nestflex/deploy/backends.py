"""Execution backends for a bundle's levels, and the per-level execution plan (Cappuccino, METHODS §5).

The adaptive methods save MACs; whether the MACs turn into time depends on how the level runs.
A backend turns one resident level into a function ``x -> logits``:

* ``eager``: the op-program interpreter (:func:`~nestflex.deploy.runtime.run_program`), NCHW;
* ``channels_last``: the same program with the input and every 4-D weight in channels-last
  memory order (Cappuccino's map-major layout: the same spatial position of consecutive maps
  is contiguous, so oneDNN's NHWC kernels vectorise over channels); the weights are converted
  in place, so resident memory does not grow;
* ``onnxruntime``: the level's ONNX file (shipped in every bundle) in an onnxruntime session with
  all graph optimisations; the session holds its own copy of the level's weights, so the
  runtime releases its paged tensors while the level runs there (resident memory is the
  session's, :meth:`~nestflex.deploy.runtime.CapacityRuntime.resident_bytes`; an eager use such
  as a split pages them in again); the optimised graph is saved beside the bundle the first
  time, so later level switches skip the graph optimiser;
* ``onnxruntime_int8``: the level's graph statically quantised (QDQ), calibrated on half the
  bundle's labelled samples; ``onnxruntime_mixed``: the same, with the layers the bundle's
  per-layer precision plan keeps in float, and those whose int8 kernel is slower than float32 on
  this device (:func:`slow_int8_layers`), left in float32;
* ``onnxruntime_pad8``, ``onnxruntime_int8_pad8``, ``onnxruntime_mixed_pad8``: the same on the
  level with its widths zero-padded to a multiple of 8 (:mod:`nestflex.deploy.padding`: same
  logits, onnxruntime's blocked kernels instead of the odd-width fallbacks).

An :class:`ExecutionPlan` names, per level, a backend and a thread count, and per exit set
(:class:`ExitsPlan`) one backend and thread count for its stages and heads (``eager`` or
``onnxruntime``, on the stage and head graphs the bundle ships: a sample's path crosses them in
order, so they share the cores the way one model does). :func:`synthesize`
measures every candidate on this machine (batch 1, median of repeats), keeps the float32 ones whose
logits match the eager program within ``atol`` and the int8/mixed ones within an accuracy budget
on the other half of the samples, and writes the fastest per level;
``nestflex tune BUNDLE`` runs it and stores the plan *beside* the bundle
(``bundle.nfx.plan.json``), never inside it: the bundle's checksummed files stay as exported.
``bundle.capacity()`` picks the plan up, so the engine's level switches switch configuration too.

A backend whose package is missing falls back to ``eager`` with a warning that names the package.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from nestflex.deploy._registry import Registry
from nestflex.deploy.fused_exits import FUSED_CONFIDENCES, fuse_exits
from nestflex.deploy.padding import pad_channels
from nestflex.errors import NestflexError

__all__ = ["BackendError", "Backend", "register_backend", "list_backends", "get_backend", "ExecutionPlan",
           "LevelPlan", "ExitsPlan", "plan_path", "load_plan", "write_plan", "writable_plan_path", "synthesize", "quantize_level",
           "calibration_split", "tuned_dir", "float_layers"]


class BackendError(NestflexError, ValueError):
    """An unknown backend, a bad plan, or a plan that cannot be written."""


Fn = Callable[[torch.Tensor], torch.Tensor]


class Backend:
    """How one level runs. Subclasses set ``name`` and ``package`` and implement :meth:`prepare`."""

    name: str = ""
    package: str | None = None  # the pip package it needs, for the fallback warning
    precision: str = "float32"  # float32 backends must match the eager program; others the accuracy budget
    own_weights: bool = False  # runs from its own copy of the weights (the runtime's paged tensors are released)

    def available(self) -> bool:
        if self.package is None:
            return True
        import importlib.util

        return importlib.util.find_spec(self.package) is not None

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        """A function running the resident ``level`` of ``runtime`` (a CapacityRuntime)."""
        raise NotImplementedError

    def prepare_exits(self, runtime: Any, threads: int) -> tuple[list[Callable], list[Callable]]:
        """An exit set's stage and head functions (``runtime``: a
        :class:`~nestflex.deploy.runtime.ProgressiveRuntime`), in the eager ones' conventions: a
        stage maps its input tensors to a tuple, a head maps that tuple to logits, the final head
        is the last stage's logits."""
        raise BackendError(f"execution backend {self.name!r} runs levels, not exit sets. HINT: plan `eager` or "
                           f"`onnxruntime` for exits (`nestflex tune` does)")


class EagerBackend(Backend):
    name = "eager"

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        return runtime._eager

    def prepare_exits(self, runtime: Any, threads: int) -> tuple[list[Callable], list[Callable]]:
        return list(runtime._eager_stages), list(runtime._eager_heads)


class ChannelsLastBackend(Backend):
    name = "channels_last"

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        tensors = runtime._store.tensors
        for k, t in tensors.items():  # in place: the same bytes, another order
            if t.dim() == 4:
                tensors[k] = t.contiguous(memory_format=torch.channels_last)

        def run(x: torch.Tensor) -> torch.Tensor:
            return runtime._eager(x.contiguous(memory_format=torch.channels_last))

        return run


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    package = "onnxruntime"
    own_weights = True
    pad_to = 1  # >1: the level's widths zero-padded to this multiple (pad_level)

    def model_path(self, bundle: Any, level: int) -> Path:
        """The ONNX file this backend runs for ``level``: the one the bundle ships."""
        entry = next((o for o in bundle.spec.onnx if o.kind == "level" and o.extra.get("level") == level), None)
        if entry is None:
            raise BackendError(f"bundle {str(bundle.path)!r} has no ONNX file for level {level}. HINT: export it "
                               f"with onnx=True, or plan another backend for this level")
        return bundle.file(entry.file)

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
    """The fused early-exit graph of exit set ``key`` (:mod:`nestflex.deploy.fused_exits`) over the
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
    (:mod:`nestflex.deploy.padding`): the same logits, more MACs, onnxruntime's blocked kernels
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


def float_layers(bundle: Any) -> tuple[str, ...]:
    """The layers the bundle's precision plan does not assign to int8 (float32, bfloat16: onnxruntime
    runs both as float32 here).

    Raises:
        BackendError: the bundle has no per-layer precision plan.
    """
    plan = bundle.spec.precision
    if plan is None or not plan.assignment:
        raise BackendError(f"bundle {str(bundle.path)!r} has no per-layer precision plan for onnxruntime_mixed. "
                           f"HINT: export it with a precision profile (precision_profile=, the recipe's profile "
                           f"stage), or plan onnxruntime_int8")
    return tuple(sorted(name for name, p in plan.assignment.items() if p != "int8"))


def mixed_float_layers(bundle: Any) -> tuple[str, ...]:
    """The layers a mixed plan keeps in float: the precision plan's (:func:`float_layers`) and this
    device's slow int8 ones (:func:`slow_int8_layers`)."""
    return tuple(sorted(set(float_layers(bundle)) | set(slow_int8_layers(bundle))))


#: an int8 layer counts as slow when its kernel takes this many times its float32 one (the margin
#: pays for the Quantize / Dequantize a float layer between int8 ones adds, and for noise)
SLOW_INT8_MARGIN = 1.3


def slow_int8_layers(bundle: Any, runs: int = 200) -> tuple[str, ...]:
    """The layers whose int8 kernel is slower than their float32 one on this device.

    Measured once per device on the largest level at one thread, with onnxruntime's profiler
    (:mod:`nestflex.deploy.op_profile`): the k-th Conv/Gemm to run in the float32 graph against
    the k-th in the int8 one (one topology, both in onnxruntime's execution order); a layer is
    slow when its int8 kernel takes more than :data:`SLOW_INT8_MARGIN` times its float32 kernel.
    Layers are named by their ONNX node scope (``/features/conv1/``, :func:`~nestflex.deploy.
    op_profile.layer_names`), which the quantiser's exclusion matches exactly. On the default
    recipe's bundle that is the first convolution, which reads the 3-channel image: int8 kernels
    gain nothing on 3 input channels and pay for their layout (docs/synthesis.md). Kept in
    ``BUNDLE.tuned/<digest>/`` as ``int8_slow_layers.json``, so a level switch reads the file
    instead of measuring; graphs whose layers cannot be paired give none, with a warning, and
    are measured again next time. The padded backends use the same list: the largest level's
    widths are usually multiples of 8 already, so padding leaves its kernels as they are.
    """
    import numpy as np

    from nestflex._io import write_json
    from nestflex.deploy.op_profile import CONV_OPS, layer_names, operator_times

    def build(target: Path) -> None:
        top = bundle.num_levels - 1
        fp32 = OnnxRuntimeBackend().model_path(bundle, top)
        x = np.random.default_rng(0).standard_normal((1, *bundle.spec.input.shape)).astype(np.float32)
        names = layer_names(fp32)
        t32 = [o["us"] for o in operator_times(fp32, x, runs) if o["op"] in CONV_OPS]
        t8 = [o["us"] for o in operator_times(quantize_level(bundle, top), x, runs) if o["op"] in CONV_OPS]
        if not len(names) == len(t32) == len(t8):  # cannot pair the layers: none slow, measure again next time
            warnings.warn(f"{str(bundle.path)!r}: the float32 and int8 graphs of level {top} run {len(t32)} and "
                          f"{len(t8)} Conv/Gemm operators for {len(names)} layers, so their kernels cannot be "
                          f"paired; the mixed plan keeps only the precision plan's layers in float", stacklevel=4)
            return
        slow = [n for n, a, b in zip(names, t32, t8) if b > SLOW_INT8_MARGIN * a]
        write_json(target, {"layers": slow, "margin": SLOW_INT8_MARGIN, "level": top, "threads": 1,
                            "float32_us": t32, "int8_us": t8, "names": names})

    path = _built(bundle, "int8_slow_layers.json", build)
    if not path.is_file():
        return ()
    try:
        layers = json.loads(path.read_text(encoding="utf-8")).get("layers")
    except (OSError, ValueError):
        layers = None
    if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
        path.unlink(missing_ok=True)  # damaged: measure again next time, run all-int8-but-the-plan now
        return ()
    return tuple(layers)


_BACKENDS: Registry[Backend] = Registry("execution backend", BackendError, accepts=lambda v: isinstance(v, Backend),
                                        callable_entries=False,
                                        register_hint="register your own with register_backend(backend)")
for _b in (EagerBackend(), ChannelsLastBackend(), OnnxRuntimeBackend(), OnnxRuntimeInt8Backend(),
           OnnxRuntimeMixedBackend(), OnnxRuntimePaddedBackend(), OnnxRuntimeInt8PaddedBackend(),
           OnnxRuntimeMixedPaddedBackend()):
    _BACKENDS.register(_b.name, _b)


def register_backend(backend: Backend, *, overwrite: bool = False) -> Backend:
    """Add an execution backend (an instance with a ``name``)."""
    return _BACKENDS.register(backend.name, backend, overwrite=overwrite)


def list_backends(available_only: bool = False) -> list[str]:
    """Registered backend names (only those whose package is installed with ``available_only``)."""
    return [n for n in _BACKENDS.names() if not available_only or _BACKENDS.get(n).available()]


def get_backend(name: str | Backend) -> Backend:
    return _BACKENDS.get(name)


# --------------------------------------------------------------------------------------------
# int8: quantised level graphs, cached beside the bundle


def tuned_dir(bundle: Any) -> Path:
    """Where files tuned for ``bundle`` on this device go: ``<bundle>.tuned/<manifest digest[:16]>/``
    (beside the bundle, like the plan; a re-exported bundle gets a new folder)."""
    from nestflex.deploy.wire import bundle_id

    p = Path(bundle.path)
    return p.with_name(p.name + ".tuned") / bundle_id(bundle)[:16]


def calibration_split(bundle: Any) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The bundle's samples as (calibration half, check half): int8 ranges are fitted on the first,
    accuracy is judged on the second, so the check is not in-sample.

    Raises:
        BackendError: the bundle ships no samples (or fewer than 2).
    """
    got = bundle.samples()
    if got is None or got[0].shape[0] < 2:
        raise BackendError(f"bundle {str(bundle.path)!r} ships no samples to calibrate int8 on. HINT: re-export it "
                           f"with samples (BundleExporter(samples=512), export_bundle(samples=(x, y)))")
    x, y = got
    half = x.shape[0] // 2
    return (x[:half], y[:half]), (x[half:], y[half:])


def _built(bundle: Any, name: str, build: Callable[[Path], Any]) -> Path:
    """The file ``name`` in the bundle's tuned folder: from there, or written now by ``build(target)``
    (which writes atomically); the temp folder when the bundle's folder cannot be written."""
    import tempfile

    target = tuned_dir(bundle) / name
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK):
            raise PermissionError(str(target.parent))
    except OSError:
        target = Path(tempfile.gettempdir()) / "nestflex-tuned" / tuned_dir(bundle).name / name
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    build(target)
    return target


def quantize_level(bundle: Any, level: int, keep_float: Sequence[str] = (), pad_to: int = 1) -> Path:
    """The int8 (QDQ) graph of ``level``: from the cache beside the bundle, or built now and cached.

    ``keep_float``: layer names (``features.conv1``) whose operators stay float32 (a mixed plan).
    ``pad_to``: quantise the level with its widths zero-padded to this multiple (:func:`pad_level`).
    Building takes well under a second for the recipe's levels; a bundle folder that cannot be
    written beside gets a cache in the temp folder instead.
    """
    import hashlib
    import shutil
    import tempfile

    tag = "int8" if not keep_float else "mixed-" + hashlib.sha256("\n".join(keep_float).encode()).hexdigest()[:8]

    def build(target: Path) -> None:
        src = OnnxRuntimeBackend().model_path(bundle, level) if pad_to == 1 else pad_level(bundle, level, pad_to)
        work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".int8-"))
        try:
            _quantize(src, work / "model.onnx", calibration_split(bundle)[0][0], work, keep_float)
            os.replace(work / "model.onnx", target)  # atomic: a reader sees the whole file or none
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return _built(bundle, f"level_{level}{'' if pad_to == 1 else f'.pad{pad_to}'}.{tag}.onnx", build)


def pad_level(bundle: Any, level: int, multiple: int) -> Path:
    """The level's ONNX graph with its widths zero-padded to ``multiple`` (:mod:`nestflex.deploy.padding`),
    cached beside the bundle.

    Raises:
        PaddingError: the graph has an operator the padding does not support.
    """
    src = OnnxRuntimeBackend().model_path(bundle, level)
    return _built(bundle, f"level_{level}.pad{multiple}.onnx", lambda target: pad_channels(src, target, multiple))


def _quantize(src: Path, dst: Path, inputs: torch.Tensor, work: Path, keep_float: Sequence[str] = ()) -> None:
    import logging

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = work / "pre.onnx"
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantiser logs per-tensor notes at WARNING on the root logger
    try:
        quant_pre_process(str(src), str(pre))
        name = ort.InferenceSession(str(pre), providers=["CPUExecutionProvider"]).get_inputs()[0].name
        exclude = _nodes_of(onnx.load(str(pre)), keep_float, src) if keep_float else []
        batches = [{name: inputs[i:i + 1].numpy()} for i in range(inputs.shape[0])]

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(batches)

            def get_next(self):
                return next(self.it, None)

        # U8S8 QDQ, per-channel weights: onnxruntime's recommended CPU format (VNNI-friendly)
        quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=exclude)
    finally:
        logging.getLogger().setLevel(quiet)


def _nodes_of(model: Any, layers: Sequence[str], src: Path) -> list[str]:
    """The ONNX nodes of nestflex layer names: torch's exporter names a module's operators
    ``/features/conv1/Conv`` for the layer ``features.conv1``. A name that starts with ``/`` is a
    node-name scope already (:func:`slow_int8_layers` gives those)."""
    nodes = [n.name for n in model.graph.node]
    out, missing = [], []
    for layer in layers:
        prefix = layer if layer.startswith("/") else "/" + layer.replace(".", "/") + "/"
        hits = [n for n in nodes if n.startswith(prefix)]
        out += hits
        if not hits:
            missing.append(layer)
    if missing and len(missing) == len(layers):
        raise BackendError(f"none of the float layers of the precision plan ({', '.join(missing[:4])}) name an "
                           f"operator of {src.name} (its nodes look like {nodes[0] if nodes else 'nothing'!r}). "
                           f"HINT: plan onnxruntime_int8 for this bundle")
    return out


# --------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class LevelPlan:
    """One level's configuration and what it measured when it was chosen."""

    backend: str = "eager"
    threads: int = 1
    latency_ms: float | None = None
    eager_ms: float | None = None
    accuracy: float | None = None  # on the bundle's check samples, when it ships them

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "threads": self.threads, "latency_ms": self.latency_ms,
                "eager_ms": self.eager_ms, "accuracy": self.accuracy}


@dataclass(frozen=True)
class ExitsPlan:
    """One exit set's configuration (its stages and heads) and what it measured.

    ``latency_ms`` / ``eager_ms``: per exit, what one frame that leaves there costs (the early-exit
    call: the stages up to it, every head on the way and the policy), with this configuration /
    eager at 1 thread, every early exit evaluated.

    ``active``: the early exits the runtime evaluates (``None``: all). A head costs time whatever
    its MACs; one that few samples leave at costs every later sample more than it saves, so the
    synthesis keeps the subset with the least measured mean latency
    (:func:`choose_active_exits`); a dropped exit's samples go on to the next kept one.
    ``mean_ms``: the mean latency per frame it measured with ``active``, against ``all_mean_ms``
    with every exit (both on the samples the choice was made on)."""

    backend: str = "eager"
    threads: int = 1
    latency_ms: tuple[float, ...] = ()
    eager_ms: tuple[float, ...] = ()
    active: tuple[int, ...] | None = None
    mean_ms: float | None = None
    all_mean_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "threads": self.threads, "latency_ms": list(self.latency_ms),
                "eager_ms": list(self.eager_ms), "active": None if self.active is None else list(self.active),
                "mean_ms": self.mean_ms, "all_mean_ms": self.all_mean_ms}


@dataclass(frozen=True)
class ExecutionPlan:
    """Per level, the backend and threads to run it with.

    Attributes:
        levels: one :class:`LevelPlan` per level of the bundle.
        bundle: the manifest sha256 it was tuned for (a plan for another bundle is refused).
        machine: where it was measured (free-form).
        candidates: every measured configuration (for the record); an exit set's rows have
            ``level`` None, its key in ``exit_set`` and a latency per exit.
        budget_points: the accuracy a reduced-precision level could lose (``None``: no labelled
            samples, so only float32 configurations were candidates).
        check_samples: how many samples the accuracy was judged on.
        exits: per exit set of the bundle (``exits``, ``flex_exits``), its :class:`ExitsPlan`; a
            set not named runs eager.
        batches: per batch size above 1 that was timed, one :class:`LevelPlan` per level (its
            ``latency_ms`` per call at that batch): the choice for a runtime made for that batch
            (:meth:`for_batch`); ``levels`` are batch 1's.
    """

    levels: tuple[LevelPlan, ...]
    bundle: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    candidates: tuple[dict[str, Any], ...] = ()
    budget_points: float | None = None
    check_samples: int = 0
    exits: Mapping[str, ExitsPlan] = field(default_factory=dict)
    batches: Mapping[int, tuple[LevelPlan, ...]] = field(default_factory=dict)

    def for_batch(self, batch: int) -> tuple[LevelPlan, ...]:
        """The levels' configurations for batches of ``batch``: those of the largest timed batch
        size not above it (batch 1's ``levels`` when none is)."""
        fits = [b for b in self.batches if b <= batch]
        return self.batches[max(fits)] if fits else self.levels

    def to_json(self) -> dict[str, Any]:
        return {"format": "nestflex-execution-plan", "version": 1, "bundle": self.bundle, "machine": self.machine,
                "budget_points": self.budget_points, "check_samples": self.check_samples,
                "levels": [lp.to_json() for lp in self.levels],
                "exits": {k: e.to_json() for k, e in self.exits.items()},
                "batches": {str(b): [lp.to_json() for lp in lps] for b, lps in sorted(self.batches.items())},
                "candidates": list(self.candidates)}

    @classmethod
    def from_json(cls, data: Any, where: str = "plan") -> ExecutionPlan:
        if not isinstance(data, Mapping) or data.get("format") != "nestflex-execution-plan":
            raise BackendError(f"{where} is not a nestflex execution plan. HINT: write one with `nestflex tune BUNDLE`")
        rows = data.get("levels")
        if not isinstance(rows, list) or not rows:
            raise BackendError(f"{where}: `levels` must be a non-empty list, got {rows!r:.80}")
        levels = []
        for i, r in enumerate(rows):
            backend, t = _backend_and_threads(r, f"{where}: levels[{i}]")
            levels.append(LevelPlan(backend, t, r.get("latency_ms"), r.get("eager_ms"), r.get("accuracy")))
        exits = {}
        raw = data.get("exits") or {}  # plans written before exits were planned have none
        if not isinstance(raw, Mapping):
            raise BackendError(f"{where}: `exits` must be an object (exit set -> configuration), got {raw!r:.80}")
        for key, r in raw.items():
            if key not in ("exits", "flex_exits"):
                raise BackendError(f"{where}: `exits` names exit set {key!r}; the sets are `exits` and `flex_exits`. "
                                   f"HINT: re-run `nestflex tune BUNDLE`")
            backend, t = _backend_and_threads(r, f"{where}: exits.{key}")
            times = [r.get(k) or [] for k in ("latency_ms", "eager_ms")]
            if any(not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                      for x in v) for v in times):
                raise BackendError(f"{where}: exits.{key}.latency_ms and eager_ms must be lists of numbers, got "
                                   f"{times!r:.80}. HINT: re-run `nestflex tune BUNDLE`")
            active = r.get("active")
            if active is not None and (not isinstance(active, list) or not all(
                    isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in active)):
                raise BackendError(f"{where}: exits.{key}.active must be null or a list of early-exit indices, got "
                                   f"{active!r:.80}. HINT: re-run `nestflex tune BUNDLE`")
            means = [r.get(k) for k in ("mean_ms", "all_mean_ms")]
            means = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in means]
            exits[key] = ExitsPlan(backend, t, tuple(times[0]), tuple(times[1]),
                                   None if active is None else tuple(active), *means)
        batches = {}
        raw = data.get("batches") or {}
        if not isinstance(raw, Mapping):
            raise BackendError(f"{where}: `batches` must be an object (batch size -> levels), got {raw!r:.80}")
        for b, lps in raw.items():
            size = int(b) if isinstance(b, str) and b.isdigit() else None
            if size is None or size < 2 or not isinstance(lps, list) or len(lps) != len(levels):
                raise BackendError(f"{where}: `batches` maps a batch size >= 2 to {len(levels)} level entries, got "
                                   f"{b!r}: {lps!r:.60}. HINT: re-run `nestflex tune BUNDLE --batches ...`")
            batches[size] = tuple(LevelPlan(*_backend_and_threads(r, f"{where}: batches.{b}[{i}]"),
                                            r.get("latency_ms"), r.get("eager_ms"), r.get("accuracy"))
                                  for i, r in enumerate(lps))
        budget, checked = data.get("budget_points"), data.get("check_samples", 0)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not 0 <= budget <= 100):
            raise BackendError(f"{where}: `budget_points` must be null or a number of points in [0, 100], got "
                               f"{budget!r:.80}. HINT: re-run `nestflex tune BUNDLE --budget POINTS`")
        if checked is None:
            checked = 0
        if isinstance(checked, bool) or not isinstance(checked, int) or checked < 0:
            raise BackendError(f"{where}: `check_samples` must be an int >= 0, got {checked!r:.80}. "
                               f"HINT: re-run `nestflex tune BUNDLE`")
        return cls(tuple(levels), str(data.get("bundle", "")), dict(data.get("machine") or {}),
                   tuple(data.get("candidates") or ()), None if budget is None else float(budget), checked, exits,
                   batches)


def _backend_and_threads(r: Any, where: str) -> tuple[str, int]:
    if not isinstance(r, Mapping) or not isinstance(r.get("backend"), str):
        raise BackendError(f"{where} must be an object with a `backend` name, got {r!r:.80}")
    t = r.get("threads", 1)
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 1024:
        raise BackendError(f"{where}.threads must be an int in [1, 1024], got {t!r}")
    return r["backend"], t


def plan_path(bundle: Any) -> Path:
    """Where a bundle's plan lives: beside it, ``<bundle dir>.plan.json``."""
    p = Path(bundle.path)
    return p.with_name(p.name + ".plan.json")


def load_plan(bundle: Any) -> ExecutionPlan | None:
    """The plan beside ``bundle``, or ``None`` when there is none or it was tuned for another bundle
    (with a warning: the bundle was re-exported since)."""
    from nestflex.deploy.wire import bundle_id

    path = plan_path(bundle)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8")[: 16 * 2**20])
    except (OSError, ValueError) as e:
        raise BackendError(f"execution plan {str(path)!r} cannot be read ({type(e).__name__}: {e}). HINT: delete "
                           f"it or run `nestflex tune` again") from None
    plan = ExecutionPlan.from_json(data, repr(str(path)))
    if plan.bundle != bundle_id(bundle):
        warnings.warn(f"execution plan {str(path)!r} was tuned for another bundle; running eager. HINT: run "
                      f"`nestflex tune {bundle.path}` again", stacklevel=2)
        return None
    if len(plan.levels) != bundle.num_levels:
        raise BackendError(f"execution plan {str(path)!r} has {len(plan.levels)} levels, the bundle "
                           f"{bundle.num_levels}. HINT: run `nestflex tune` again")
    return plan


def resolve(plan_level: LevelPlan | ExitsPlan) -> tuple[Backend, int]:
    """The backend to use for a plan entry: itself, or eager (with a warning) when its package is missing."""
    backend = get_backend(plan_level.backend)
    if not backend.available():
        warnings.warn(f"execution backend {backend.name!r} needs the package {backend.package!r}, which is not "
                      f"installed; running eager. HINT: pip install {backend.package}", stacklevel=3)
        return get_backend("eager"), plan_level.threads
    return backend, plan_level.threads


# --------------------------------------------------------------------------------------------
# synthesis


def synthesize(bundle: Any, *, backends: Sequence[str] | None = None, threads: Sequence[int] | None = None,
               repeats: int = 30, atol: float = 1e-4, samples: torch.Tensor | None = None,
               budget_points: float = 1.0, batches: Sequence[int] = (1,),
               log: Callable[[str], None] | None = None) -> ExecutionPlan:
    """Measure every backend x threads for every level on this machine; keep the fastest that passes.

    A float32 backend passes when its logits match the eager program's within ``atol``; a reduced
    precision one (``onnxruntime_int8``) when its top-1 accuracy on the check half of the bundle's
    samples (:func:`calibration_split`; int8 ranges come from the other half) is at most
    ``budget_points`` below the eager program's on the same samples.

    Args:
        bundle: a loaded bundle.
        backends: names to try (default: every installed one).
        threads: thread counts (default 1..cores).
        repeats: timed calls per configuration (median; batch 1).
        atol: a float32 configuration counts only if its logits match the eager program's within ``atol``.
        samples: inputs for the agreement check (default: 8 of the bundle's check samples, else 8
            seeded normal batches of one).
        budget_points: accuracy (points) a reduced-precision configuration may lose.
        batches: batch sizes to time every configuration at; batch 1 (always timed) gives the
            plan's levels, each larger one its own choice per level (:attr:`ExecutionPlan.batches`:
            what a runtime made for that batch size runs).

    Returns:
        the :class:`ExecutionPlan` (eager at 1 thread is always a candidate, so every level gets one).
    """
    from nestflex._machine import machine
    from nestflex.deploy.runtime import CapacityRuntime
    from nestflex.deploy.timing import median_ms
    from nestflex.deploy.wire import bundle_id

    sizes = sorted({1, *batches})
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise BackendError(f"`batches` must be ints >= 1, got {list(batches)!r}")
    names = list(backends) if backends is not None else list_backends(available_only=True)
    counts = list(threads) if threads is not None else list(range(1, (os.cpu_count() or 1) + 1))
    if "eager" not in names:
        names.insert(0, "eager")
    shape = tuple(bundle.spec.input.shape)
    labelled = calibration_split(bundle)[1] if bundle.spec.samples is not None else None
    x1 = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))
    xb = {b: torch.randn(b, *shape, generator=torch.Generator().manual_seed(b)) for b in sizes[1:]}
    check = samples if samples is not None else (
        labelled[0][:8] if labelled is not None else torch.randn(8, *shape, generator=torch.Generator().manual_seed(1)))
    before = torch.get_num_threads()
    candidates, levels = [], []
    by_batch: dict[int, list[LevelPlan]] = {b: [] for b in sizes[1:]}
    try:
        for level in range(bundle.num_levels):
            rt = CapacityRuntime(bundle, level)
            torch.set_num_threads(1)
            ref = torch.cat([rt._eager(check[i:i + 1]) for i in range(check.shape[0])])
            ref_acc = None if labelled is None else _accuracy(rt._eager, *labelled)
            best = None
            eager_ms = None
            best_b: dict[int, tuple] = {}  # batch -> (backend, threads, ms per call, accuracy)
            eager_b: dict[int, float] = {}
            for name in names:
                backend = get_backend(name)
                if not backend.available():
                    continue
                exact = backend.precision == "float32"
                for t in counts:
                    torch.set_num_threads(t)
                    rt = CapacityRuntime(bundle, level)  # fresh: a backend may convert weights in place
                    try:
                        fn = backend.prepare(rt, level, t)
                        out = torch.cat([fn(check[i:i + 1]) for i in range(check.shape[0])])
                        err = float((out - ref).abs().max())
                        acc = None if exact or labelled is None else _accuracy(fn, *labelled)
                        ms = median_ms(lambda: fn(x1), repeats, warmup=3)
                        ms_b = {b: median_ms(lambda v=v: fn(v), repeats, warmup=2) for b, v in xb.items()}
                    except Exception as e:  # a backend that cannot run this level is not a candidate
                        candidates.append({"level": level, "backend": name, "threads": t, "error": f"{e}"[:200]})
                        continue
                    if exact:
                        ok = err <= atol and math.isfinite(err)
                    else:  # no labelled samples: nothing to judge the accuracy on, so not a candidate
                        ok = acc is not None and acc >= ref_acc - budget_points / 100
                    row = {"level": level, "backend": name, "threads": t, "latency_ms": round(ms, 4),
                           "max_abs_diff": err, "agrees": ok}
                    if acc is not None:
                        row.update(accuracy=round(acc, 6), eager_accuracy=round(ref_acc, 6))
                    if ms_b:
                        row["batch_ms"] = {str(b): round(v, 4) for b, v in ms_b.items()}
                    candidates.append(row)
                    if name == "eager" and t == 1:
                        eager_ms = ms
                        eager_b = ms_b
                    if ok and (best is None or ms < best[2]):
                        best = (name, t, ms, ref_acc if exact else acc)
                    for b, v in ms_b.items():
                        if ok and (b not in best_b or v < best_b[b][2]):
                            best_b[b] = (name, t, v, ref_acc if exact else acc)
                    if log is not None:
                        log(f"level {level}: {name:16s} threads {t}: {ms:8.3f} ms  max|diff| {err:.2e}"
                            + ("" if acc is None else f"  accuracy {acc:.4f} (eager {ref_acc:.4f})"))
            levels.append(LevelPlan(best[0], best[1], round(best[2], 4), None if eager_ms is None else round(eager_ms, 4),
                                    None if best[3] is None else round(best[3], 6)))
            for b, (name, t, v, acc) in best_b.items():
                by_batch[b].append(LevelPlan(name, t, round(v, 4), None if b not in eager_b else round(eager_b[b], 4),
                                             None if acc is None else round(acc, 6)))
        exits = {key: _synthesize_exits(bundle, key, names, counts, repeats, atol, check, x1, candidates, log,
                                        budget_points)
                 for key in bundle.exit_sets}
    finally:
        torch.set_num_threads(before)
    return ExecutionPlan(tuple(levels), bundle_id(bundle), machine(), tuple(candidates),
                         budget_points=budget_points if labelled is not None else None,
                         check_samples=0 if labelled is None else int(labelled[0].shape[0]), exits=exits,
                         batches={b: tuple(lps) for b, lps in by_batch.items()})


def _synthesize_exits(bundle: Any, key: str, names: Sequence[str], counts: Sequence[int], repeats: int, atol: float,
                      check: torch.Tensor, x1: torch.Tensor, candidates: list, log: Callable[[str], None] | None,
                      budget_points: float = 1.0) -> ExitsPlan:
    """One exit set: every backend that runs exit sets x threads; a configuration passes when every
    exit's logits, and every check sample's early-exit answer, match the eager program's within
    ``atol``; the one with the least mean latency per frame on the calibration half of the
    bundle's samples wins (without samples: the fastest full path, a frame that reaches the last
    exit). Then the exits worth their time in it (:func:`choose_active_exits`), with samples."""
    from nestflex.deploy.runtime import ProgressiveRuntime
    from nestflex.deploy.timing import median_ms

    def outputs(rt: ProgressiveRuntime) -> list[torch.Tensor]:
        return [torch.cat(z) for z in zip(*(rt.all_exits(check[i:i + 1]) for i in range(check.shape[0])))]

    def answers(rt: ProgressiveRuntime) -> list[Any]:
        return [rt(check[i:i + 1]) for i in range(check.shape[0])]

    def path_ms(rt: ProgressiveRuntime) -> list[float]:
        """Per exit, one frame's early-exit call when it leaves there (the other thresholds at 1)."""
        early = rt.num_exits - 1
        forced = [[0.0 if j == k else 1.0 for j in range(early)] for k in range(rt.num_exits)]
        return [median_ms(lambda t=t: rt(x1, thresholds=t), repeats, warmup=3) for t in forced]

    def answer_err(got: list[Any], want: list[Any]) -> float:
        return max((float((a.logits - b.logits).abs().max()) if a.exit_index.tolist() == b.exit_index.tolist()
                    else math.inf for a, b in zip(got, want)), default=0.0)

    torch.set_num_threads(1)
    eager = ProgressiveRuntime(bundle, None, key)
    ref, ref_answers, eager_ms = outputs(eager), answers(eager), path_ms(eager)
    passing: dict[tuple[str, int], tuple[Any, list[float], dict]] = {}
    frames = calibration_split(bundle)[0][0][:64] if bundle.spec.samples is not None else None
    for name in names:
        backend = get_backend(name)
        if not backend.available() or backend.precision != "float32":
            continue
        for t in counts:
            torch.set_num_threads(t)
            try:
                rt = ProgressiveRuntime(bundle, None, key, ExecutionPlan((), exits={key: ExitsPlan(name, t)}))
                err = max(max(float((a - b).abs().max()) for a, b in zip(outputs(rt), ref)),
                          answer_err(answers(rt), ref_answers))  # the one-frame path (fused) too
                ms = path_ms(rt)
            except Exception as e:  # a backend that does not run exit sets (or this one) is not a candidate
                if "runs levels, not exit sets" not in str(e):
                    candidates.append({"level": None, "exit_set": key, "backend": name, "threads": t,
                                       "error": f"{e}"[:200]})
                continue
            ok = err <= atol and math.isfinite(err)
            row = {"level": None, "exit_set": key, "backend": name, "threads": t,
                   "latency_ms": [round(v, 4) for v in ms], "max_abs_diff": err, "agrees": ok}
            candidates.append(row)
            if ok:
                passing[(name, t)] = (rt, ms, row)
            if log is not None:
                log(f"{key}: {name:16s} threads {t}: every exit {ms[-1]:8.3f} ms, first {ms[0]:.3f} ms  "
                    f"max|diff| {err:.2e}")
    if passing and frames is not None:
        # what the choice is made on: the mean frame on the calibration half's exit distribution
        # (the full path alone favours the backbone's speed over the exits'), every candidate in
        # the same passes
        means = _mean_frame_ms({c: v[0] for c, v in passing.items()}, frames, 3,
                               threads={c: c[1] for c in passing})
        for c, v in passing.items():
            v[2]["mean_frame_ms"] = round(means[c], 4)
        score = means
    else:
        score = {c: v[1][-1] for c, v in passing.items()}
    if passing:
        name, t = min(passing, key=score.get)
        ms = passing[(name, t)][1]
        if log is not None and frames is not None:
            log(f"{key}: {name} threads {t}: the least mean frame, {score[(name, t)]:.3f} ms")
    else:
        name, t, ms = "eager", 1, eager_ms
    entry = ExitsPlan(name, t, tuple(round(v, 4) for v in ms), tuple(round(v, 4) for v in eager_ms))
    if bundle.spec.samples is None:  # no samples: no exit distribution to choose the exits on
        return entry
    torch.set_num_threads(t)
    return choose_active_exits(bundle, key, entry, budget_points=budget_points, log=log)


def _mean_frame_ms(runtimes: Mapping[Any, Any], x: torch.Tensor, repeats: int,
                   threads: Mapping[Any, int] | None = None) -> dict[Any, float]:
    """Per runtime, the mean over the frames of ``x`` of each frame's median early-exit call (ms).
    Each repeat is one pass over the frames per runtime, the runtimes in turn: a slow spell of the
    machine hits them alike, and one session's spinning thread pool (onnxruntime's, after a run)
    slows only the first frames of the next pass, not every frame as frame-by-frame turns would.
    ``threads``: torch's thread count to set before a runtime's pass (eager runs on torch's)."""
    import statistics
    import time

    times = {k: [[] for _ in range(x.shape[0])] for k in runtimes}
    frames = [x[i:i + 1] for i in range(x.shape[0])]
    for _ in range(repeats):
        for k, rt in runtimes.items():
            if threads is not None and k in threads:
                torch.set_num_threads(threads[k])
            rt(frames[0])  # warm: the first call of a pass also pays for the previous runtime's pool
            for i, xi in enumerate(frames):
                t0 = time.perf_counter()
                rt(xi)
                times[k][i].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.mean(statistics.median(v) for v in per) for k, per in times.items()}


def choose_active_exits(bundle: Any, key: str, entry: ExitsPlan, *, budget_points: float = 1.0, frames: int = 64,
                        repeats: int = 3, min_gain: float = 0.02, log: Callable[[str], None] | None = None
                        ) -> ExitsPlan:
    """The early exits worth their time, in ``entry``'s configuration (FlexDNN's exit insertion
    plan, measured in time instead of MACs).

    Every evaluated head costs the samples that pass it a call's worth of small operators, however
    few MACs it has; an exit few samples leave at can cost more than it saves. Backward
    elimination, measured: starting from every exit, drop the exit whose removal lowers the mean
    latency per frame most (on ``frames`` of the calibration half of the bundle's samples, the
    distribution the policy will see), while that lowers it by more than ``min_gain`` and the
    policy's top-1 accuracy on the check half stays within ``budget_points`` of every exit's.
    The result is kept only if, measured again beside every exit, it is faster.

    Returns:
        ``entry`` with ``active`` (``None`` when every exit stays), ``mean_ms`` and ``all_mean_ms``.
    """
    from nestflex.deploy.engine import operating_points
    from nestflex.deploy.exits import apply_policy
    from nestflex.deploy.runtime import ProgressiveRuntime

    (xc, _), (xk, yk) = calibration_split(bundle)
    xc = xc[:frames]
    entry = replace(entry, active=None)  # the search starts from every exit, whatever the entry kept
    plan = ExecutionPlan((), exits={key: entry})
    full = ProgressiveRuntime(bundle, None, key, plan)
    with torch.no_grad():
        logits = full.all_exits(xk)  # every exit's logits, once
    early = full.num_exits - 1
    # the accuracy is judged at the set's thresholds and at every operating point the engine may
    # run (its calibrated threshold sweep), so no point it picks loses more than the budget
    try:
        settings = [list(p.thresholds) for p in operating_points(bundle, key)[0]]
    except Exception:  # an exit set without a usable calibration: its own thresholds only
        settings = []
    settings = [list(full.thresholds)] + [t for t in settings if t != list(full.thresholds)]

    def accuracy(active: Sequence[int], thr: Sequence[float]) -> float:
        ends = [*active, early]
        got = apply_policy([logits[k] for k in ends], [thr[k] for k in active], full.confidence, full.fallback)
        return float((got.logits.argmax(-1) == yk).float().mean())

    floors = [accuracy(range(early), t) - budget_points / 100 for t in settings]

    def within_budget(active: Sequence[int]) -> bool:
        return all(accuracy(active, t) >= f for t, f in zip(settings, floors))

    runtimes: dict[tuple[int, ...], Any] = {tuple(range(early)): full}

    def runtime(active: tuple[int, ...]) -> Any:
        if active not in runtimes:
            runtimes[active] = ProgressiveRuntime(bundle, None, key, plan, active=active)
        return runtimes[active]

    before = _fused_files(bundle, key)
    current = tuple(range(early))
    first = None
    while current:
        options = [tuple(k for k in current if k != drop) for drop in current]
        options = [a for a in options if within_budget(a)]
        if not options:
            break
        # the kept set is timed again beside its options, in the same passes: a minimum over
        # noisy options compared with an older measurement would favour dropping
        got = _mean_frame_ms({a: runtime(a) for a in [current, *options]}, xc, repeats)
        first = got[tuple(range(early))] if first is None else first
        best = min(options, key=got.get)
        if log is not None:
            log(f"{key}: exits {list(best)}: {got[best]:.3f} ms per frame (kept {list(current)}: {got[current]:.3f} ms)")
        if got[best] > got[current] * (1 - min_gain):
            break
        current = best
    kept = current if len(current) < early else None
    if kept is not None:
        final = _mean_frame_ms({"all": full, "kept": runtime(current)}, xc, repeats)  # again, side by side
        if final["kept"] >= final["all"]:
            kept = None
        mean, every = final["kept" if kept is not None else "all"], final["all"]
    else:
        mean = every = first if first is not None else _mean_frame_ms({0: full}, xc, repeats)[0]
    _drop_fused(bundle, key, created_since=before, keep=kept)
    return replace(entry, active=kept, mean_ms=round(mean, 4), all_mean_ms=round(every, 4))


def _fused_files(bundle: Any, key: str) -> set[Path]:
    """The fused graphs of exit subsets of ``key`` there are now (beside the bundle, or in the temp folder)."""
    import tempfile

    out: set[Path] = set()
    for folder in (tuned_dir(bundle), Path(tempfile.gettempdir()) / "nestflex-tuned" / tuned_dir(bundle).name):
        if folder.is_dir():
            out |= set(folder.glob(f"{key}.fused-*-a*.onnx"))
    return out


def _drop_fused(bundle: Any, key: str, created_since: set[Path], keep: Sequence[int] | None) -> None:
    """Delete the fused graphs of exit subsets the search built for ``key`` (files that were not
    there before it: another runtime's are left alone) except the one it keeps."""
    keep_tag = None if keep is None else "-a" + ".".join(str(k) for k in keep)
    for f in _fused_files(bundle, key) - created_since:
        if keep_tag is None or not f.name.endswith(f"{keep_tag}.onnx"):
            f.unlink(missing_ok=True)


def _accuracy(fn: Fn, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """Top-1 accuracy of ``fn`` on ``(x, y)``, in batches."""
    with torch.inference_mode():
        hits = sum(int((fn(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, x.shape[0], batch))
    return hits / x.shape[0]


def writable_plan_path(bundle: Any, path: str | os.PathLike | None = None) -> Path:
    """Where the plan goes (beside ``bundle`` unless ``path``), checked writable before any measuring.

    Raises:
        BackendError: the folder does not exist or is not writable (the bundle's own files are never touched).
    """
    path = plan_path(bundle) if path is None else Path(path)
    if not path.parent.is_dir():
        raise BackendError(f"cannot write the execution plan to {str(path)!r}: folder {str(path.parent)!r} does not "
                           f"exist. HINT: create it, or pass another --out")
    if not os.access(path.parent, os.W_OK):
        raise BackendError(f"cannot write the execution plan beside the bundle: folder {str(path.parent)!r} is not "
                           f"writable. HINT: copy the bundle somewhere writable, or pass --out PATH")
    return path


def write_plan(bundle: Any, plan: ExecutionPlan, path: str | os.PathLike | None = None) -> Path:
    """Store ``plan`` beside ``bundle`` (or at ``path``), atomically. Raises :class:`BackendError` (see
    :func:`writable_plan_path`)."""
    from nestflex._io import write_json

    return write_json(writable_plan_path(bundle, path), plan.to_json())
