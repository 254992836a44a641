"""What the scheduler knows about one application: its descendants' profiles and its goals.

The rows come from :func:`nestflex.capacity.profile.profile_levels` (the recipe writes them to
``<out>/grow/profile.json`` and ``<out>/summary.json`` under ``"levels"``; a bundle's manifest
carries the same rows). One row per capacity level, level 0 the smallest::

    {"level": 0, "accuracy": 0.54, "params": 37764, "macs": 1778820, "memory_mb": 0.153,
     "latency_ms": {"1": 0.458, "64": 5.485}}

Levels must be sorted by cost: ``level`` strictly increasing and ``memory_mb`` and ``macs``
non-decreasing (a nested model's level k+1 contains level k). Accuracy need not increase with
the level: measured accuracies of small models on a small test set are noisy, and the cost
function simply never prefers a dominated level, so rejecting such profiles would only make real
profiles unusable.

The *knee* (:func:`knee_level`) is the status-quo baseline's fixed model, see its docstring.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from nestflex.deploy.bundle.loader import load
from nestflex.deploy.scheduler.errors import SchedulerError

__all__ = [
    "DEFAULT_FPS",
    "LevelProfile",
    "AppProfile",
    "knee_level",
]

#: frame rate of the camera stream when no latency goal is given (continuous mobile vision)
DEFAULT_FPS = 30.0


@dataclass(frozen=True)
class LevelProfile:
    """One descendant (capacity level) of a multi-capacity model.

    Attributes:
        level: capacity level, 0 = smallest.
        accuracy: test top-1 in [0, 1].
        latency_ms: latency of one inference at 100 % of the compute (the chosen batch size's
            per-call time).
        memory_mb: runtime memory of the level's weights, MB.
        macs: multiply-accumulates per sample (0 when unknown).
        params: parameters (0 when unknown).
    """

    level: int
    accuracy: float
    latency_ms: float
    memory_mb: float
    macs: int = 0
    params: int = 0


@dataclass(frozen=True)
class AppProfile:
    """An application: a name, its levels (sorted by cost) and its goals A_min and L_max.

    Attributes:
        name: unique name of the application (decisions are keyed by it).
        levels: the descendants, smallest first.
        min_accuracy: A_min(v); ``None`` means the best accuracy among the levels (the cost's
            first term then charges every point of accuracy given up).
        max_latency_ms: L_max(v), the frame period of the app's stream; ``None`` means a
            30 fps camera (33.3 ms).
        switch_ms: measured level-switch times ``((from, to, ms), ...)`` (the profile's
            ``"switching"`` rows, ``nested_ms``); empty when unknown.

    Examples:
        >>> rows = [{"level": 0, "accuracy": 0.80, "macs": 10, "memory_mb": 1.0, "latency_ms": {"1": 2.0}},
        ...         {"level": 1, "accuracy": 0.85, "macs": 20, "memory_mb": 2.0, "latency_ms": {"1": 3.0}}]
        >>> app = AppProfile.from_levels("cam", rows, max_latency_ms=10.0)
        >>> app.goal_accuracy, app.goal_latency_ms, [lv.latency_ms for lv in app.levels]
        (0.85, 10.0, [2.0, 3.0])
    """

    name: str
    levels: tuple[LevelProfile, ...]
    min_accuracy: float | None = None
    max_latency_ms: float | None = None
    switch_ms: tuple[tuple[int, int, float], ...] = field(default=(), compare=True)

    def __post_init__(self) -> None:
        _check_app(self)

    # ------------------------------------------------------------------ goals
    @property
    def goal_accuracy(self) -> float:
        """A_min(v): the given minimum accuracy, or the best level's accuracy."""
        if self.min_accuracy is not None:
            return float(self.min_accuracy)
        return max(lv.accuracy for lv in self.levels)

    @property
    def goal_latency_ms(self) -> float:
        """L_max(v): the given maximum latency, or the frame period of a 30 fps stream."""
        return float(self.max_latency_ms) if self.max_latency_ms is not None else 1000.0 / DEFAULT_FPS

    def with_goals(self, *, min_accuracy: float | None = None, max_latency_ms: float | None = None) -> "AppProfile":
        """A copy with other goals (``None`` keeps the default rule, see the class docstring)."""
        return replace(self, min_accuracy=min_accuracy, max_latency_ms=max_latency_ms)

    def renamed(self, name: str) -> "AppProfile":
        """A copy under another name (several apps may share one model's profile)."""
        return replace(self, name=name)

    def switch_time_ms(self, src: int, dst: int) -> float | None:
        """Measured time to switch from level ``src`` to ``dst``, or ``None`` if not profiled."""
        for a, b, ms in self.switch_ms:
            if a == src and b == dst:
                return ms
        return None

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_levels(
        cls,
        name: str,
        rows: Sequence[Mapping[str, Any]],
        *,
        batch_size: int | str = 1,
        min_accuracy: float | None = None,
        max_latency_ms: float | None = None,
        switching: Iterable[Mapping[str, Any]] | None = None,
    ) -> "AppProfile":
        """Build an app from ``profile_levels`` rows.

        Args:
            name: application name.
            rows: one dict per level (keys ``level``, ``accuracy``, ``latency_ms``,
                ``memory_mb``; ``macs`` and ``params`` optional).
            batch_size: which ``latency_ms`` entry to use (per-call time at that batch size).
            min_accuracy: A_min, see the class docstring.
            max_latency_ms: L_max, see the class docstring.
            switching: the profile's ``"switching"`` rows (``from``, ``to``, ``nested_ms``).

        Raises:
            SchedulerError: a row lacks a key, a value is out of range, or the rows are not
                sorted by cost.
        """
        if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)) or len(rows) == 0:
            raise SchedulerError(
                f"app {name!r}: `levels` must be a non-empty list of profile rows, got {rows!r:.80}. "
                "HINT: pass the \"levels\" list of grow/profile.json or summary.json."
            )
        key = str(batch_size)
        levels = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise SchedulerError(f"app {name!r}: level row {i} must be a dict, got {type(row).__name__}.")
            missing = [k for k in ("level", "accuracy", "latency_ms", "memory_mb") if k not in row]
            if missing:
                raise SchedulerError(
                    f"app {name!r}: level row {i} lacks {missing}. "
                    "HINT: rows come from nestflex.capacity.profile.profile_levels (with a test loader)."
                )
            lat = row["latency_ms"]
            if isinstance(lat, Mapping):
                if key not in lat:
                    raise SchedulerError(
                        f"app {name!r}: level {row['level']} has no latency at `batch_size`={key!r} "
                        f"(profiled: {sorted(lat)}). HINT: pick one of those batch sizes."
                    )
                lat = lat[key]
            if row["accuracy"] is None:
                raise SchedulerError(
                    f"app {name!r}: level {row['level']} has no accuracy (None). "
                    "HINT: profile the levels with a test loader."
                )
            levels.append(
                LevelProfile(
                    level=int(row["level"]), accuracy=float(row["accuracy"]), latency_ms=float(lat),
                    memory_mb=float(row["memory_mb"]), macs=int(row.get("macs") or 0),
                    params=int(row.get("params") or 0),
                )
            )
        switch = tuple(
            (int(r["from"]), int(r["to"]), float(r["nested_ms"]))
            for r in (switching or ())
            if "nested_ms" in r
        )
        return cls(name=name, levels=tuple(levels), min_accuracy=min_accuracy,
                   max_latency_ms=max_latency_ms, switch_ms=switch)

    @classmethod
    def from_json(cls, path: str | os.PathLike, name: str | None = None, **kwargs: Any) -> "AppProfile":
        """Build an app from a ``grow/profile.json`` or a recipe ``summary.json`` (``"levels"`` key).

        Args:
            path: the JSON file.
            name: application name; default: the run directory's name (the folder that holds
                ``grow/``), else the file's stem.
            **kwargs: forwarded to :meth:`from_levels`.

        Raises:
            SchedulerError: the file is missing, is not JSON, or has no ``"levels"`` list.
        """
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SchedulerError(
                f"profile file {str(path)!r} does not exist. "
                "HINT: run the recipe's grow stage; it writes <out>/grow/profile.json."
            ) from None
        except (OSError, ValueError) as exc:
            raise SchedulerError(f"profile file {str(path)!r} is not readable JSON: {exc}.") from None
        if not isinstance(doc, Mapping) or not isinstance(doc.get("levels"), list):
            raise SchedulerError(
                f"profile file {str(path)!r} has no \"levels\" list. "
                "HINT: pass <out>/grow/profile.json or a recipe summary.json that ran the grow stage."
            )
        if name is None:
            name = path.parent.parent.name if path.parent.name == "grow" else path.parent.name or path.stem
        kwargs.setdefault("switching", doc.get("switching"))
        return cls.from_levels(name, doc["levels"], **kwargs)

    @classmethod
    def from_bundle(cls, bundle: Any, name: str | None = None, **kwargs: Any) -> "AppProfile":
        """Build an app from a deployment bundle, or a path that :func:`nestflex.deploy.load` opens.

        The bundle's ``.levels`` (or ``.manifest["levels"]``) are the same rows as
        :meth:`from_levels` takes; ``manifest["switching"]`` is used when present.

        Args:
            bundle: a loaded bundle, or a path to one.
            name: application name; default: the manifest's model name (``vgg16-w0.25`` when it
                records a width), else the path's stem.
            **kwargs: forwarded to :meth:`from_levels`.

        Raises:
            SchedulerError: the bundle carries no levels.
            BundleError: the path is not a valid bundle.
        """
        source = None
        if isinstance(bundle, (str, os.PathLike)):
            source = Path(bundle)
            bundle = load(source)
        manifest = getattr(bundle, "manifest", None) or {}
        rows = getattr(bundle, "levels", None) or manifest.get("levels")
        if not rows:
            raise SchedulerError(
                f"bundle {str(source or bundle)!r:.120} carries no capacity levels. "
                "HINT: export a multi-capacity model (recipe grow stage) into the bundle."
            )
        if name is None:
            model = manifest.get("model")
            model_name = model.get("name") if isinstance(model, Mapping) else model
            name = str(model_name) if model_name else (source.stem if source is not None else "app")
            if model_name and isinstance(model, Mapping) and isinstance(model.get("width"), (int, float)):
                name += f"-w{model['width']:g}"
        kwargs.setdefault("switching", manifest.get("switching"))
        return cls.from_levels(name, list(rows), **kwargs)


def _check_app(app: AppProfile) -> None:
    """Validate an app at construction; every scheduler relies on these facts."""
    name = app.name
    if not isinstance(name, str) or not name:
        raise SchedulerError(f"`name` must be a non-empty string, got {name!r}.")
    if len(app.levels) == 0:
        raise SchedulerError(
            f"app {name!r}: `levels` is empty. HINT: a multi-capacity model has at least one level "
            "(profile it with nestflex.capacity.profile.profile_levels)."
        )
    prev = None
    for lv in app.levels:
        if not (0.0 <= lv.accuracy <= 1.0) or math.isnan(lv.accuracy):
            raise SchedulerError(
                f"app {name!r}: level {lv.level} has `accuracy`={lv.accuracy}, outside [0, 1]. "
                "HINT: accuracies are fractions (0.91), not percentages (91)."
            )
        if not (lv.latency_ms > 0 and math.isfinite(lv.latency_ms)):
            raise SchedulerError(f"app {name!r}: level {lv.level} has `latency_ms`={lv.latency_ms}; it must be > 0.")
        if not (lv.memory_mb > 0 and math.isfinite(lv.memory_mb)):
            raise SchedulerError(f"app {name!r}: level {lv.level} has `memory_mb`={lv.memory_mb}; it must be > 0.")
        if prev is not None and (
            lv.level <= prev.level or lv.memory_mb < prev.memory_mb or lv.macs < prev.macs
        ):
            raise SchedulerError(
                f"app {name!r}: levels are not sorted by cost: level {prev.level} "
                f"(memory_mb={prev.memory_mb}, macs={prev.macs}) comes before level {lv.level} "
                f"(memory_mb={lv.memory_mb}, macs={lv.macs}). HINT: list levels smallest first, as "
                "profile_levels writes them."
            )
        prev = lv
    if app.min_accuracy is not None and not (0.0 <= app.min_accuracy <= 1.0):
        raise SchedulerError(f"app {name!r}: `min_accuracy`={app.min_accuracy} is outside [0, 1].")
    if app.max_latency_ms is not None and not (app.max_latency_ms > 0 and math.isfinite(app.max_latency_ms)):
        raise SchedulerError(f"app {name!r}: `max_latency_ms`={app.max_latency_ms}; it must be > 0.")


def knee_level(app: AppProfile, resource: str = "macs") -> int:
    """Index (into ``app.levels``) of the level at the knee of the resource-accuracy curve.

    The status-quo baseline runs this one fixed model (NestDNN §4.3.1: "the model located at the
    knee ... the best resource-accuracy trade-off among all the model variants"). Precisely:
    normalise resource r and accuracy a to [0, 1] over the app's levels,
    ``x = (r - r_min) / (r_max - r_min)``, ``y = (a - a_min) / (a_max - a_min)``, and take the
    level that maximises ``y - x`` (the point farthest above the diagonal, as in Kneedle); ties
    go to the smaller level. A flat resource or accuracy range gives level 0.

    Args:
        app: the application.
        resource: ``"macs"`` (default; deterministic, unlike latency), ``"memory_mb"`` or
            ``"latency_ms"``.

    Returns:
        The index of the knee level in ``app.levels``.

    Raises:
        SchedulerError: unknown ``resource``.

    Examples:
        >>> rows = [{"level": k, "accuracy": a, "macs": m, "memory_mb": m, "latency_ms": {"1": m}}
        ...         for k, (a, m) in enumerate([(0.70, 1), (0.82, 2), (0.84, 4), (0.85, 8)])]
        >>> knee_level(AppProfile.from_levels("cam", rows))
        1
    """
    if resource not in ("macs", "memory_mb", "latency_ms"):
        raise SchedulerError(
            f"`resource` must be one of ['latency_ms', 'macs', 'memory_mb'], got {resource!r}."
        )
    r = [float(getattr(lv, resource)) for lv in app.levels]
    a = [lv.accuracy for lv in app.levels]
    r_span, a_span = max(r) - min(r), max(a) - min(a)
    if r_span <= 0 or a_span <= 0:
        return 0
    score = [(ai - min(a)) / a_span - (ri - min(r)) / r_span for ai, ri in zip(a, r)]
    return max(range(len(score)), key=lambda i: (score[i], -i))
