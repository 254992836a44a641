"""What a backend is (how one level or exit set runs), the backend registry, and the folder beside a
bundle where backends keep what they build for this device (tuned graphs, quantised levels).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from nestflex.deploy._registry import Registry
from nestflex.errors import NestflexError

__all__ = ["BackendError", "Backend", "register_backend", "list_backends", "get_backend", "tuned_dir", "calibration_split", "level_onnx"]

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


_BACKENDS: Registry[Backend] = Registry("execution backend", BackendError, accepts=lambda v: isinstance(v, Backend),
                                        callable_entries=False,
                                        register_hint="register your own with register_backend(backend)")


def register_backend(backend: Backend, *, overwrite: bool = False) -> Backend:
    """Add an execution backend (an instance with a ``name``)."""
    return _BACKENDS.register(backend.name, backend, overwrite=overwrite)


def list_backends(available_only: bool = False) -> list[str]:
    """Registered backend names (only those whose package is installed with ``available_only``)."""
    return [n for n in _BACKENDS.names() if not available_only or _BACKENDS.get(n).available()]


def get_backend(name: str | Backend) -> Backend:
    return _BACKENDS.get(name)


def tuned_dir(bundle: Any) -> Path:
    """Where files tuned for ``bundle`` on this device go: ``<bundle>.tuned/<manifest digest[:16]>/``
    (beside the bundle, like the plan; a re-exported bundle gets a new folder)."""
    from nestflex.deploy.bundle.loader import bundle_id

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


def level_onnx(bundle: Any, level: int) -> Path:
    """The ONNX file the bundle ships for ``level``.

    Raises:
        BackendError: the bundle has none for that level.
    """
    entry = next((o for o in bundle.spec.onnx if o.kind == "level" and o.extra.get("level") == level), None)
    if entry is None:
        raise BackendError(f"bundle {str(bundle.path)!r} has no ONNX file for level {level}. HINT: export it "
                           f"with onnx=True, or plan another backend for this level")
    return bundle.file(entry.file)
