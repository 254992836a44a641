"""Execution backends for a bundle's levels, and the per-level execution plan (Cappuccino, METHODS §5).

The adaptive methods save MACs; whether the MACs turn into time depends on how the level runs.
A backend turns one resident level into a function ``x -> logits``:

* ``eager``: the op-program interpreter (:func:`~nestflex.deploy.runtime.run_program`), NCHW;
* ``channels_last``: the same program with the input and every 4-D weight in channels-last
  memory order (Cappuccino's map-major layout: the same spatial position of consecutive maps
  is contiguous, so oneDNN's NHWC kernels vectorise over channels); the weights are converted
  in place, so resident memory does not grow;
* ``onnxruntime``: the level's ONNX file (shipped in every bundle) in an onnxruntime session with
  all graph optimisations; the session holds its own copy of the level's weights while the
  level is active, so resident memory is the paged weights plus the session's (reported by
  :meth:`~nestflex.deploy.runtime.CapacityRuntime.resident_bytes`).

An :class:`ExecutionPlan` names, per level, a backend and a thread count. :func:`synthesize`
measures every candidate on this machine (batch 1, median of repeats), keeps those whose logits
match the eager program within ``atol`` on sample inputs, and writes the fastest per level;
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from nestflex.deploy._registry import Registry
from nestflex.errors import NestflexError

__all__ = ["BackendError", "Backend", "register_backend", "list_backends", "get_backend", "ExecutionPlan",
           "LevelPlan", "plan_path", "load_plan", "write_plan", "writable_plan_path", "synthesize"]


class BackendError(NestflexError, ValueError):
    """An unknown backend, a bad plan, or a plan that cannot be written."""


Fn = Callable[[torch.Tensor], torch.Tensor]


class Backend:
    """How one level runs. Subclasses set ``name`` and ``package`` and implement :meth:`prepare`."""

    name: str = ""
    package: str | None = None  # the pip package it needs, for the fallback warning

    def available(self) -> bool:
        if self.package is None:
            return True
        import importlib.util

        return importlib.util.find_spec(self.package) is not None

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        """A function running the resident ``level`` of ``runtime`` (a CapacityRuntime)."""
        raise NotImplementedError


class EagerBackend(Backend):
    name = "eager"

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        return runtime._eager


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

    def prepare(self, runtime: Any, level: int, threads: int) -> Fn:
        import onnxruntime as ort

        bundle = runtime.bundle
        entry = next((o for o in bundle.spec.onnx if o.kind == "level" and o.extra.get("level") == level), None)
        if entry is None:
            raise BackendError(f"bundle {str(bundle.path)!r} has no ONNX file for level {level}. HINT: export it "
                               f"with onnx=True, or plan another backend for this level")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(bundle.file(entry.file)), opts, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        runtime._session_bytes = bundle.spec.files[entry.file].bytes

        def run(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(session.run(None, {name: x.detach().contiguous().numpy()})[0])

        return run


_BACKENDS: Registry[Backend] = Registry("execution backend", BackendError, accepts=lambda v: isinstance(v, Backend),
                                        callable_entries=False,
                                        register_hint="register your own with register_backend(backend)")
for _b in (EagerBackend(), ChannelsLastBackend(), OnnxRuntimeBackend()):
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
# the plan


@dataclass(frozen=True)
class LevelPlan:
    """One level's configuration and what it measured when it was chosen."""

    backend: str = "eager"
    threads: int = 1
    latency_ms: float | None = None
    eager_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "threads": self.threads, "latency_ms": self.latency_ms,
                "eager_ms": self.eager_ms}


@dataclass(frozen=True)
class ExecutionPlan:
    """Per level, the backend and threads to run it with.

    Attributes:
        levels: one :class:`LevelPlan` per level of the bundle.
        bundle: the manifest sha256 it was tuned for (a plan for another bundle is refused).
        machine: where it was measured (free-form).
        candidates: every measured configuration (for the record).
    """

    levels: tuple[LevelPlan, ...]
    bundle: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    candidates: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"format": "nestflex-execution-plan", "version": 1, "bundle": self.bundle, "machine": self.machine,
                "levels": [lp.to_json() for lp in self.levels], "candidates": list(self.candidates)}

    @classmethod
    def from_json(cls, data: Any, where: str = "plan") -> ExecutionPlan:
        if not isinstance(data, Mapping) or data.get("format") != "nestflex-execution-plan":
            raise BackendError(f"{where} is not a nestflex execution plan. HINT: write one with `nestflex tune BUNDLE`")
        rows = data.get("levels")
        if not isinstance(rows, list) or not rows:
            raise BackendError(f"{where}: `levels` must be a non-empty list, got {rows!r:.80}")
        levels = []
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping) or not isinstance(r.get("backend"), str):
                raise BackendError(f"{where}: levels[{i}] must be an object with a `backend` name, got {r!r:.80}")
            t = r.get("threads", 1)
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 1024:
                raise BackendError(f"{where}: levels[{i}].threads must be an int in [1, 1024], got {t!r}")
            levels.append(LevelPlan(r["backend"], t, r.get("latency_ms"), r.get("eager_ms")))
        return cls(tuple(levels), str(data.get("bundle", "")), dict(data.get("machine") or {}),
                   tuple(data.get("candidates") or ()))


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


def resolve(plan_level: LevelPlan) -> tuple[Backend, int]:
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
               log: Callable[[str], None] | None = None) -> ExecutionPlan:
    """Measure every backend x threads for every level on this machine; keep the fastest that agrees.

    Args:
        bundle: a loaded bundle.
        backends: names to try (default: every installed one).
        threads: thread counts (default 1..cores).
        repeats: timed calls per configuration (median; batch 1).
        atol: a configuration counts only if its logits match the eager program's within ``atol`` on ``samples``.
        samples: inputs for the agreement check (default: 8 seeded normal batches of one).

    Returns:
        the :class:`ExecutionPlan` (eager at 1 thread is always a candidate, so every level gets one).
    """
    from nestflex._machine import machine
    from nestflex.deploy.runtime import CapacityRuntime
    from nestflex.deploy.timing import median_ms
    from nestflex.deploy.wire import bundle_id

    names = list(backends) if backends is not None else list_backends(available_only=True)
    counts = list(threads) if threads is not None else list(range(1, (os.cpu_count() or 1) + 1))
    if "eager" not in names:
        names.insert(0, "eager")
    shape = tuple(bundle.spec.input.shape)
    x1 = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))
    check = samples if samples is not None else torch.randn(8, *shape, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    candidates, levels = [], []
    try:
        for level in range(bundle.num_levels):
            rt = CapacityRuntime(bundle, level)
            torch.set_num_threads(1)
            ref = torch.cat([rt._eager(check[i:i + 1]) for i in range(check.shape[0])])
            best = None
            eager_ms = None
            for name in names:
                backend = get_backend(name)
                if not backend.available():
                    continue
                for t in counts:
                    torch.set_num_threads(t)
                    rt = CapacityRuntime(bundle, level)  # fresh: a backend may convert weights in place
                    try:
                        fn = backend.prepare(rt, level, t)
                        out = torch.cat([fn(check[i:i + 1]) for i in range(check.shape[0])])
                        err = float((out - ref).abs().max())
                        ms = median_ms(lambda: fn(x1), repeats, warmup=3)
                    except Exception as e:  # a backend that cannot run this level is not a candidate
                        candidates.append({"level": level, "backend": name, "threads": t, "error": f"{e}"[:200]})
                        continue
                    ok = err <= atol and math.isfinite(err)
                    candidates.append({"level": level, "backend": name, "threads": t, "latency_ms": round(ms, 4),
                                       "max_abs_diff": err, "agrees": ok})
                    if name == "eager" and t == 1:
                        eager_ms = ms
                    if ok and (best is None or ms < best[2]):
                        best = (name, t, ms)
                    if log is not None:
                        log(f"level {level}: {name:14s} threads {t}: {ms:8.3f} ms  max|diff| {err:.2e}")
            levels.append(LevelPlan(best[0], best[1], round(best[2], 4), None if eager_ms is None else round(eager_ms, 4)))
    finally:
        torch.set_num_threads(before)
    return ExecutionPlan(tuple(levels), bundle_id(bundle), machine(), tuple(candidates))


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
