"""What a backend is (how one level or exit set runs), the backend registry, and the folder beside a
bundle where backends keep what they build for this device (tuned graphs, quantised levels).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy._registry import Registry
from nestflex.errors import NestflexError

__all__ = ["BackendError", "Backend", "LevelContext", "ExitsContext", "Prepared", "PreparedExits", "register_backend",
           "list_backends", "get_backend", "tuned_dir", "calibration_split"]


class BackendError(NestflexError, ValueError):
    """An unknown backend, a bad plan, or a plan that cannot be written."""


#: a prepared level: numpy input batch -> numpy logits
Fn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class LevelContext:
    """What a backend is given to prepare one level of the capacity backbone.

    Attributes:
        bundle: the loaded bundle.
        level: the level to run.
        threads: intra-op threads for it.
        tensors: the level's weights on demand (numpy, cut to the level's region), for a backend
            that runs on the runtime's own copy; one that builds its own (an onnxruntime session)
            never calls it, so the runtime keeps nothing paged for it.
    """

    bundle: Any
    level: int
    threads: int
    tensors: Callable[[], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class ExitsContext:
    """What a backend is given to prepare an exit set's stages and heads.

    Attributes:
        bundle: the loaded bundle.
        key: the set's key (``exits`` / ``flex_exits``).
        spec: the set's :class:`~nestflex.deploy.bundle.exit_records.ExitSet`.
        threads: intra-op threads.
        confidence: the confidence measure a fused graph bakes in.
        fallback: the fallback a fused graph bakes in.
        active: the early exits evaluated (ascending).
        backbone: the backbone program's nodes (the capacity program when shared).
        level: the level the backbone runs at (its largest when shared, 0 when own).
        backbone_tensors: the backbone's weights on demand (numpy).
        head_tensors: the heads' weights on demand (numpy).
        fused: whether a single frame may run as one fused early-exit graph (faster per frame,
            more memory: see :class:`~nestflex.deploy.runtime.progressive.ProgressiveRuntime`).
    """

    bundle: Any
    key: str
    spec: Any
    threads: int
    confidence: str
    fallback: str
    active: tuple[int, ...]
    backbone: Sequence[Any]
    level: int
    backbone_tensors: Callable[[], Mapping[str, np.ndarray]]
    head_tensors: Callable[[], Mapping[str, np.ndarray]]
    fused: bool = True


@dataclass
class Prepared:
    """A prepared level: ``fn`` (numpy in, numpy out) and the bytes it holds (its own weights' copy;
    0 when it runs on the runtime's paged tensors)."""

    fn: Fn
    bytes: int = 0


@dataclass
class PreparedExits:
    """A prepared exit set: per exit a stage (``fn(*arrays) -> tuple``) and per early exit a head
    (``fn(state tuple) -> logits``; the final head is the last stage's output), an optional one-call
    early exit for a single frame (``fused(x, thresholds) -> ExitResult``), and ``bytes()``: what
    it holds now (sessions opened on first use count once open)."""

    stages: list[Callable[..., tuple]]
    heads: list[Callable[[tuple], np.ndarray]]
    fused: Callable[..., Any] | None = None
    bytes: Callable[[], int] = lambda: 0


class Backend:
    """How one level or exit set runs. Subclasses set ``name`` and ``package`` and implement
    :meth:`prepare` (and :meth:`prepare_exits` for exit sets). A backend gets a small context and
    returns a prepared callable; it never reaches into a runtime."""

    name: str = ""
    package: str | None = None  # the pip package it needs, for the fallback warning
    precision: str = "float32"  # float32 backends must match the reference; others the accuracy budget
    own_weights: bool = False  # runs from its own copy of the weights (the runtime pages nothing for it)

    def available(self) -> bool:
        if self.package is None:
            return True
        import importlib.util

        return importlib.util.find_spec(self.package) is not None

    def prepare(self, ctx: LevelContext) -> Prepared:
        """The level ``ctx.level`` ready to run."""
        raise NotImplementedError

    def prepare_exits(self, ctx: ExitsContext) -> PreparedExits:
        """An exit set's stages and heads ready to run."""
        raise BackendError(f"execution backend {self.name!r} runs levels, not exit sets. HINT: plan "
                           f"`onnxruntime` (or `eager`) for exits (`nestflex tune` does)")


_BACKENDS: Registry[Backend] = Registry("execution backend", BackendError, accepts=lambda v: isinstance(v, Backend),
                                        callable_entries=False,
                                        register_hint="register your own with register_backend(backend)")


def register_backend(backend: Backend, *, overwrite: bool = False) -> Backend:
    """Add an execution backend (an instance with a ``name``).

    Args:
        backend: the :class:`Backend` instance, registered under its ``name``.
        overwrite: replace a backend already registered under that name.

    Returns:
        ``backend`` itself.

    Raises:
        BackendError: the name is taken (and ``overwrite`` is false) or not a non-empty string.
    """
    return _BACKENDS.register(backend.name, backend, overwrite=overwrite)


def list_backends(available_only: bool = False) -> list[str]:
    """Registered backend names, sorted.

    Args:
        available_only: list only the backends whose package is installed.
    """
    return [n for n in _BACKENDS.names() if not available_only or _BACKENDS.get(n).available()]


def get_backend(name: str | Backend) -> Backend:
    """A registered execution backend by name, or ``name`` itself if it is a :class:`Backend`.

    Args:
        name: a name from :func:`list_backends`, or a :class:`Backend` instance.

    Raises:
        BackendError: unknown name (the message lists the registered ones).
    """
    return _BACKENDS.get(name)


def tuned_dir(bundle: Any) -> Path:
    """Where files tuned for ``bundle`` on this device go: ``<bundle>.tuned/<manifest digest[:16]>/``
    (beside the bundle, like the plan; a re-exported bundle gets a new folder).

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).
    """
    from nestflex.deploy.bundle.loader import bundle_id

    p = Path(bundle.path)
    return p.with_name(p.name + ".tuned") / bundle_id(bundle)[:16]


def calibration_split(bundle: Any) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The bundle's samples as (calibration half, check half): int8 ranges are fitted on the first,
    accuracy is judged on the second, so the check is not in-sample.

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`) that ships samples.

    Returns:
        ``((x, y), (x, y))``: the first half of the samples and their labels, then the second.

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
