"""Execution backends for a bundle's levels, and the per-level execution plan (Cappuccino, METHODS §5).

The adaptive methods save MACs; whether the MACs turn into time depends on how the level runs.
A backend turns one resident level into a function ``x -> logits``:

* ``eager``: the op-program interpreter (:func:`~nestflex.deploy.backends.eager.run_program`), NCHW;
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
* ``onnxruntime_program``: the same on the graph written from the bundle's op program even when the
  bundle ships one (exit sets stage by stage): the torch-free float32 reference of the synthesis;
* ``onnxruntime_int8``: the level's graph statically quantised (QDQ), calibrated on half the
  bundle's labelled samples; ``onnxruntime_mixed``: the same, with the layers the bundle's
  per-layer precision plan keeps in float, and those whose int8 kernel is slower than float32 on
  this device (:func:`slow_int8_layers`), left in float32;
* ``onnxruntime_pad8``, ``onnxruntime_int8_pad8``, ``onnxruntime_mixed_pad8``: the same on the
  level with its widths zero-padded to a multiple of 8 (:mod:`nestflex.deploy.backends.padding`: same
  logits, onnxruntime's blocked kernels instead of the odd-width fallbacks).

An :class:`ExecutionPlan` names, per level, a backend and a thread count, and per exit set
(:class:`ExitsPlan`) one backend and thread count for its stages and heads (``eager`` or
``onnxruntime``, on the stage and head graphs the bundle ships: a sample's path crosses them in
order, so they share the cores the way one model does). :func:`synthesize`
measures every candidate on this machine (batch 1, median of repeats), keeps the float32 ones whose
logits match the program's reference (``eager`` where torch is installed, else
``onnxruntime_program``) within ``atol`` and the int8/mixed ones within an accuracy budget
on the other half of the samples, and writes the fastest per level;
``nestflex tune BUNDLE`` runs it and stores the plan *beside* the bundle
(``bundle.nfx.plan.json``), never inside it: the bundle's checksummed files stay as exported.
``CapacityRuntime(bundle)`` picks the plan up, so the engine's level switches switch configuration too.

A backend whose package is missing falls back to ``onnxruntime`` (or ``eager`` when that is the one
missing) with a warning that names the package. The graph-editing backends (int8, mixed, padded)
and the fused early-exit graph need the ``onnx`` package (``nestflex[tune]``) to *build* their
graphs; what they build is kept beside the bundle and runs on onnxruntime alone.

Modules: :mod:`.base` (what a backend is, the registry, the tuned folder), :mod:`.eager` (torch,
optional), :mod:`.onnxruntime`, :mod:`.quantize` (int8, mixed, padded graphs), :mod:`.plan` (the
execution plan on disk), :mod:`.padding`, :mod:`.fused_exits`, :mod:`.op_profile`; the synthesis
that writes plans is :mod:`nestflex.deploy.tune`.
"""

from nestflex.deploy.backends.base import (
    _BACKENDS,
    Backend,
    BackendError,
    calibration_split,
    get_backend,
    list_backends,
    register_backend,
    tuned_dir,
)
from nestflex.deploy.backends.eager import ChannelsLastBackend, EagerBackend
from nestflex.deploy.backends.onnxruntime import (
    OnnxRuntimeBackend,
    OnnxRuntimeInt8Backend,
    OnnxRuntimeInt8PaddedBackend,
    OnnxRuntimeMixedBackend,
    OnnxRuntimeMixedPaddedBackend,
    OnnxRuntimePaddedBackend,
    OnnxRuntimeProgramBackend,
)
from nestflex.deploy.backends.plan import (
    ExecutionPlan,
    ExitsPlan,
    LevelPlan,
    load_plan,
    plan_path,
    resolve,
    writable_plan_path,
    write_plan,
)
from nestflex.deploy.backends.quantize import float_layers, quantize_level

for _b in (EagerBackend(), ChannelsLastBackend(), OnnxRuntimeBackend(), OnnxRuntimeProgramBackend(), OnnxRuntimeInt8Backend(),
           OnnxRuntimeMixedBackend(), OnnxRuntimePaddedBackend(), OnnxRuntimeInt8PaddedBackend(),
           OnnxRuntimeMixedPaddedBackend()):
    _BACKENDS.register(_b.name, _b)

__all__ = ["BackendError", "Backend", "register_backend", "list_backends", "get_backend", "ExecutionPlan",
           "LevelPlan", "ExitsPlan", "plan_path", "load_plan", "write_plan", "writable_plan_path", "resolve",
           "quantize_level", "calibration_split", "tuned_dir", "float_layers"]
