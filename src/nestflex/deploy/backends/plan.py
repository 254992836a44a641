"""The execution plan (Cappuccino, METHODS §5): per level and batch size a backend and a thread
count, per exit set one for its stages and heads; stored beside the bundle, read back checked.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from nestflex.deploy.backends.base import Backend, BackendError, get_backend

__all__ = ["LevelPlan", "ExitsPlan", "ExecutionPlan", "plan_path", "load_plan", "resolve", "writable_plan_path",
           "write_plan"]

#: what a plan entry runs when it names no backend: the base install's
_DEFAULT = "onnxruntime"


@dataclass(frozen=True)
class LevelPlan:
    """One level's configuration and what it measured when it was chosen.

    Attributes:
        backend: name of the execution backend (:func:`list_backends`).
        threads: intra-op threads, in [1, 1024].
        latency_ms: measured time per call with this configuration, in ms (``None``: not
            measured).
        eager_ms: the reference configuration's time in ms (:attr:`ExecutionPlan.reference` at
            one thread; the name is the plan format's, from when the reference was always
            ``eager``).
        accuracy: accuracy on the bundle's check samples, when it ships them, in [0, 1].
    """

    backend: str = _DEFAULT
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

    A head costs time whatever its MACs; one that few samples leave at costs every later sample
    more than it saves, so the synthesis keeps the subset of early exits with the least measured
    mean latency (:func:`~nestflex.deploy.tune.choose_active_exits`); a dropped exit's samples
    go on to the next kept one.

    Attributes:
        backend: name of the execution backend (:func:`list_backends`).
        threads: intra-op threads, in [1, 1024].
        latency_ms: per exit, what one frame that leaves there costs in ms (the early-exit call:
            the stages up to it, every head on the way and the policy) with this
            configuration, every early exit evaluated.
        eager_ms: the same with the reference (:attr:`ExecutionPlan.reference`) at 1 thread.
        active: the early exits the runtime evaluates (``None``: all).
        mean_ms: the mean latency per frame in ms measured with ``active`` (on the samples the
            choice was made on).
        all_mean_ms: the same with every exit evaluated.
    """

    backend: str = _DEFAULT
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
            set not named runs on ``onnxruntime`` at one thread.
        batches: per batch size above 1 that was timed, one :class:`LevelPlan` per level (its
            ``latency_ms`` per call at that batch): the choice for a runtime made for that batch
            (:meth:`for_batch`); ``levels`` are batch 1's.
        reference: the float32 backend every candidate was checked against and whose one-thread
            times are the plan's ``eager_ms`` (``eager`` where torch is installed, else
            ``onnxruntime_program``: :func:`nestflex.deploy.tune.reference_backend`).
    """

    levels: tuple[LevelPlan, ...]
    bundle: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    candidates: tuple[dict[str, Any], ...] = ()
    budget_points: float | None = None
    check_samples: int = 0
    exits: Mapping[str, ExitsPlan] = field(default_factory=dict)
    batches: Mapping[int, tuple[LevelPlan, ...]] = field(default_factory=dict)
    reference: str = "eager"

    def for_batch(self, batch: int) -> tuple[LevelPlan, ...]:
        """The levels' configurations for batches of ``batch``: those of the largest timed batch
        size not above it (batch 1's ``levels`` when none is)."""
        fits = [b for b in self.batches if b <= batch]
        return self.batches[max(fits)] if fits else self.levels

    def out_of_order(self, batch: int = 1) -> list[tuple[int, int]]:
        """The levels that are not faster than a larger level in this plan, at ``batch``.

        A smaller level exists to save time; one whose planned time is not below a larger level's
        (the overhead-bound regime: operators no level sheds, or a backend that suits one width
        and not another) gains a scheduler nothing but memory. ``nestflex tune`` prints them.

        Args:
            batch: the batch size whose configurations are compared (:meth:`for_batch`).

        Returns:
            ``(level, larger)`` pairs: ``larger`` is the fastest of the larger levels, and it
            runs in no more time than ``level``. Empty when the levels are strictly ordered in time
            (or a level has no measured time).

        Examples:
            >>> lp = lambda ms: LevelPlan("onnxruntime", 1, ms)
            >>> ExecutionPlan((lp(1.24), lp(1.57), lp(1.17), lp(1.9))).out_of_order()
            [(0, 2), (1, 2)]
        """
        times = [lp.latency_ms for lp in self.for_batch(batch)]
        if any(ms is None for ms in times):
            return []
        out = []
        for k in range(len(times) - 1):
            larger = min(range(k + 1, len(times)), key=lambda j: (times[j], j))
            if times[larger] <= times[k]:
                out.append((k, larger))
        return out

    def with_threads(self, threads: int, exit_sets: Iterable[str] = ()) -> ExecutionPlan:
        """The same plan with every level, batch size and exit set at ``threads`` intra-op threads
        (the backends keep their choice); an exit set in ``exit_sets`` the plan does not name gets
        the default backend at ``threads``.

        Raises:
            BackendError: ``threads`` is not an int in [1, 1024].
        """
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise BackendError(f"`threads` must be an int in [1, 1024], got {threads!r}")
        keys = dict.fromkeys([*self.exits, *exit_sets])
        exits = {k: replace(self.exits.get(k) or ExitsPlan(), threads=threads) for k in keys}
        return replace(self, levels=tuple(replace(lp, threads=threads) for lp in self.levels), exits=exits,
                       batches={b: tuple(replace(lp, threads=threads) for lp in lps) for b, lps in self.batches.items()})

    def to_json(self) -> dict[str, Any]:
        return {"format": "nestflex-execution-plan", "version": 1, "bundle": self.bundle, "machine": self.machine,
                "reference": self.reference, "budget_points": self.budget_points, "check_samples": self.check_samples,
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
        reference = data.get("reference", "eager")  # plans written before the torch-free reference: eager
        if not isinstance(reference, str):
            raise BackendError(f"{where}: `reference` must be a backend name, got {reference!r:.80}. "
                               f"HINT: re-run `nestflex tune BUNDLE`")
        return cls(tuple(levels), str(data.get("bundle", "")), dict(data.get("machine") or {}),
                   tuple(data.get("candidates") or ()), None if budget is None else float(budget), checked, exits,
                   batches, reference)


def _backend_and_threads(r: Any, where: str) -> tuple[str, int]:
    if not isinstance(r, Mapping) or not isinstance(r.get("backend"), str):
        raise BackendError(f"{where} must be an object with a `backend` name, got {r!r:.80}")
    t = r.get("threads", 1)
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 1024:
        raise BackendError(f"{where}.threads must be an int in [1, 1024], got {t!r}")
    return r["backend"], t


def plan_path(bundle: Any) -> Path:
    """Where a bundle's plan lives: beside it, ``<bundle dir>.plan.json``.

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).
    """
    p = Path(bundle.path)
    return p.with_name(p.name + ".plan.json")


def load_plan(bundle: Any) -> ExecutionPlan | None:
    """The plan beside ``bundle``, or ``None`` when there is none or it was tuned for another bundle
    (with a warning: the bundle was re-exported since).

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).

    Raises:
        BackendError: the plan file cannot be read, is not a valid plan, or has another number
            of levels than the bundle.
    """
    from nestflex.deploy.bundle.loader import bundle_id

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
        warnings.warn(f"execution plan {str(path)!r} was tuned for another bundle; running the default plan. HINT: "
                      f"run `nestflex tune {bundle.path}` again", stacklevel=2)
        return None
    if len(plan.levels) != bundle.num_levels:
        raise BackendError(f"execution plan {str(path)!r} has {len(plan.levels)} levels, the bundle "
                           f"{bundle.num_levels}. HINT: run `nestflex tune` again")
    return plan


def resolve(plan_level: LevelPlan | ExitsPlan) -> tuple[Backend, int]:
    """The backend to use for a plan entry: itself, or (with a warning) the first installed of
    ``onnxruntime`` (the base install's) and ``eager`` when its package is missing.

    Args:
        plan_level: a level's or an exit set's entry of an :class:`ExecutionPlan`.

    Returns:
        ``(backend, threads)``: the backend to run and the entry's thread count.

    Raises:
        BackendError: the entry's package is missing and so are both fallbacks'.
    """
    backend = get_backend(plan_level.backend)
    if backend.available():
        return backend, plan_level.threads
    fallback = next((b for b in map(get_backend, (_DEFAULT, "eager")) if b is not backend and b.available()), None)
    if fallback is None:
        raise BackendError(f"execution backend {backend.name!r} needs the package {backend.package!r}, which is not "
                           f"installed, and no fallback is ({_DEFAULT}, eager). HINT: pip install {backend.package}")
    warnings.warn(f"execution backend {backend.name!r} needs the package {backend.package!r}, which is not "
                  f"installed; running {fallback.name}. HINT: pip install {backend.package}", stacklevel=3)
    return fallback, plan_level.threads


def writable_plan_path(bundle: Any, path: str | os.PathLike | None = None) -> Path:
    """Where the plan goes (beside ``bundle`` unless ``path``), checked writable before any measuring.

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).
        path: where to write the plan instead (``None``: :func:`plan_path`).

    Raises:
        BackendError: the folder does not exist or is not writable (the bundle's own files are never touched).
    """
    path = plan_path(bundle) if path is None else Path(path)
    if path.parent.exists() and not path.parent.is_dir():
        raise BackendError(f"cannot write the execution plan to {str(path)!r}: {str(path.parent)!r} is a file, not a "
                           f"folder. HINT: pass --out with a path inside a folder")
    if not path.parent.is_dir():
        raise BackendError(f"cannot write the execution plan to {str(path)!r}: folder {str(path.parent)!r} does not "
                           f"exist. HINT: create it, or pass another --out")
    if not os.access(path.parent, os.W_OK):
        raise BackendError(f"cannot write the execution plan beside the bundle: folder {str(path.parent)!r} is not "
                           f"writable. HINT: copy the bundle somewhere writable, or pass --out PATH")
    return path


def write_plan(bundle: Any, plan: ExecutionPlan, path: str | os.PathLike | None = None) -> Path:
    """Store ``plan`` beside ``bundle`` (or at ``path``), atomically.

    Args:
        bundle: a loaded bundle (:class:`~nestflex.deploy.bundle.Bundle`).
        plan: the plan to store.
        path: where to write it instead (``None``: :func:`plan_path`).

    Returns:
        The path written.

    Raises:
        BackendError: the folder does not exist or is not writable (see
            :func:`writable_plan_path`).
    """
    from nestflex._io import write_json

    return write_json(writable_plan_path(bundle, path), plan.to_json())
