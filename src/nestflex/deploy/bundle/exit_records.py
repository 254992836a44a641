"""The exit-set records: an :class:`ExitSet` (progressive SPINN/SDN or FlexDNN) with its
:class:`ExitHead` per early exit, FlexDNN's :class:`ExitPlan` and its :class:`OperatingPoint` profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _list, _put, _Reader, _Record, _show
from nestflex.deploy.bundle.constants import BACKBONES, EXIT_KINDS, EXIT_SET_KEYS
from nestflex.deploy.bundle.program_records import Program

__all__ = [
    "ExitHead",
    "ExitPlan",
    "OperatingPoint",
    "ExitSet",
]


@dataclass(frozen=True)
class ExitHead(_Record):
    """One early exit's head. FlexDNN heads also say which filters of the tapped layer feed them.

    Attributes:
        name: the exit's name.
        program: the head's op program (its input is the tapped tensor).
        tap_channels: channels of the tapped layer (FlexDNN), or ``None``.
        filters: the channel indices it reads, ranked (FlexDNN), or ``None``.
        widths: its conv blocks' widths (FlexDNN), or ``None``.
        stem_pool: the factor its input is average-pooled by first (FlexDNN; 1: not pooled), or ``None``.
    """

    name: str
    program: Program
    tap_channels: int | None = None
    filters: tuple[int, ...] | None = None
    widths: tuple[int, ...] | None = None
    stem_pool: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("name", "program", "tap_channels", "filters", "widths", "stem_pool")

    _PATH: ClassVar[str] = "heads[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> ExitHead | None:
        before = r.count
        v = r.obj(v, path)
        name = r.str_(r.get(v, "name", path), _join(path, "name"))
        program = Program._read(r, r.get(v, "program", path), _join(path, "program"))
        tap = r.int_(r.get(v, "tap_channels", path, required=False), _join(path, "tap_channels"), lo=1, null=True)
        filters = r.ints(r.get(v, "filters", path, required=False), _join(path, "filters"), lo=0, null=True)
        widths = r.ints(r.get(v, "widths", path, required=False), _join(path, "widths"), lo=1, null=True)
        stem = r.int_(r.get(v, "stem_pool", path, required=False), _join(path, "stem_pool"), lo=1, null=True)
        fp = _join(path, "filters")
        if isinstance(filters, tuple):
            if not filters:
                r.fail(fp, "is empty; a FlexDNN head reads at least one filter")
            elif tap is None:
                r.fail(_join(path, "tap_channels"), "is missing; it bounds `filters` (channels of the tapped layer)")
            elif isinstance(tap, int) and max(filters) >= tap:
                r.fail(fp, f"holds index {max(filters)}, outside the tapped layer's {tap} channels ([0, {tap - 1}]), "
                           f"got {_show(list(filters))}")
            if len(set(filters)) != len(filters):
                r.fail(fp, f"repeats a filter index, got {_show(list(filters))}")
            if program is not None and not any(n.op == "index_select" for n in program.nodes):
                r.fail(_join(path, "program"), "has no `index_select` node, but the head lists `filters`")
        if _failed(r, before):
            return None
        return cls(name, program, tap, filters, widths, stem, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "program": self.program.to_json()}
        _put(out, "tap_channels", self.tap_channels)
        _put(out, "filters", _list(self.filters))
        _put(out, "widths", _list(self.widths))
        _put(out, "stem_pool", self.stem_pool)
        out.update(self.extra)
        return out

    def index_tensor(self) -> str | None:
        """The weights tensor that holds the filter indices (the ``param`` fed to ``index_select``)."""
        for n in self.program.nodes:
            if n.op == "index_select":
                src = self.program.node(n.args[1]) if isinstance(n.args[1], str) else None
                return (src.params or {}).get("value") if src is not None else None
        return None


@dataclass(frozen=True)
class ExitPlan(_Record):
    """FlexDNN's plan summary: where it keeps exits and what that buys, on ``split``."""

    split: str | None = None
    kept_locations: tuple[str, ...] | None = None
    thresholds: tuple[float, ...] | None = None
    accuracy: float | None = None
    mean_macs: float | None = None
    mean_macs_fraction: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("split", "kept_locations", "thresholds", "accuracy", "mean_macs",
                                        "mean_macs_fraction")

    _PATH: ClassVar[str] = "plan"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> ExitPlan | None:
        before = r.count
        v = r.obj(v, path)
        g = lambda k: r.get(v, k, path, required=False)  # every key is optional
        out = cls(r.str_(g("split"), _join(path, "split"), null=True),
                  r.strs(g("kept_locations"), _join(path, "kept_locations"), null=True),
                  r.nums(g("thresholds"), _join(path, "thresholds"), lo=0, hi=1, null=True),
                  r.num(g("accuracy"), _join(path, "accuracy"), lo=0, hi=1, null=True),
                  r.num(g("mean_macs"), _join(path, "mean_macs"), lo=0, null=True),
                  r.num(g("mean_macs_fraction"), _join(path, "mean_macs_fraction"), lo=0, null=True),
                  _extra(v, cls._KEYS))
        return None if _failed(r, before) else out

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "kept_locations": _list(self.kept_locations), "thresholds": _list(self.thresholds),
                "accuracy": self.accuracy, "mean_macs": self.mean_macs, "mean_macs_fraction": self.mean_macs_fraction,
                **self.extra}


@dataclass(frozen=True)
class OperatingPoint(_Record):
    """One point of an exit set's accuracy-resource profile: a threshold (or one per exit) and what it costs."""

    accuracy: float
    mean_macs_fraction: float
    threshold: float | None = None
    thresholds: tuple[float, ...] | None = None
    mean_macs: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("threshold", "thresholds", "accuracy", "mean_macs", "mean_macs_fraction")

    _PATH: ClassVar[str] = "operating_points[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> OperatingPoint | None:
        before = r.count
        v = r.obj(v, path)
        threshold = r.num(r.get(v, "threshold", path, required=False), _join(path, "threshold"), lo=0, hi=1, null=True)
        thresholds = r.nums(r.get(v, "thresholds", path, required=False), _join(path, "thresholds"), lo=0, hi=1,
                            null=True)
        if threshold is None and thresholds is None:
            r.fail(_join(path, "threshold"), "is missing (or `thresholds`, one per early exit)")
        accuracy = r.num(r.get(v, "accuracy", path), _join(path, "accuracy"), lo=0, hi=1)
        macs = r.num(r.get(v, "mean_macs", path, required=False), _join(path, "mean_macs"), lo=0, null=True)
        fraction = r.num(r.get(v, "mean_macs_fraction", path), _join(path, "mean_macs_fraction"), lo=0)
        if _failed(r, before):
            return None
        return cls(accuracy, fraction, threshold, thresholds, macs, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _put(out, "threshold", self.threshold)
        _put(out, "thresholds", _list(self.thresholds))
        out["accuracy"] = self.accuracy
        _put(out, "mean_macs", self.mean_macs)
        out["mean_macs_fraction"] = self.mean_macs_fraction
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class ExitSet(_Record):
    """One set of early exits and its policy; progressive (SPINN/SDN) and FlexDNN sets share this layout.

    Attributes:
        kind: ``progressive`` or ``flexdnn`` (:data:`EXIT_KINDS`); a bundle holds at most one of each.
        backbone: ``shared`` (heads on the capacity backbone's largest level) or ``own`` (``program``).
        names: exit names, the final exit last (``len(names) - 1`` early exits).
        taps: per early exit, the backbone node its head reads.
        heads: per early exit, its :class:`ExitHead`.
        thresholds: per early exit, the confidence threshold in [0, 1].
        confidence: the confidence measure (:func:`nestflex.deploy.exits.list_confidences`).
        fallback: what answers a sample no early exit takes (:data:`nestflex.deploy.exits.FALLBACKS`).
        positions: per early exit, its MACs fraction of the backbone.
        macs: per exit, the MACs of stopping there.
        backbone_macs: MACs of the whole backbone.
        level: the capacity level a shared backbone runs at (the largest), ``None`` when own.
        note: why the backbone is shared or own, for people.
        program: the own backbone's op program (``None`` when shared).
        calibration: where the thresholds were measured (free-form summary), or ``None``.
        plan: FlexDNN's :class:`ExitPlan`, or ``None``.
        operating_points: the accuracy-resource profile, or ``None``.
        profile: the shipped profile file (FlexDNN's spec and plan), or ``None``.
    """

    kind: str
    backbone: str
    names: tuple[str, ...]
    taps: tuple[str, ...]
    heads: tuple[ExitHead, ...]
    thresholds: tuple[float, ...]
    confidence: str
    fallback: str
    positions: tuple[float, ...]
    macs: tuple[int, ...]
    backbone_macs: int
    level: int | None = None
    note: str | None = None
    program: Program | None = None
    calibration: dict[str, Any] | None = None
    plan: ExitPlan | None = None
    operating_points: tuple[OperatingPoint, ...] | None = None
    profile: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("kind", "backbone", "level", "note", "names", "positions", "macs",
                                        "backbone_macs", "thresholds", "confidence", "fallback", "program", "taps",
                                        "heads", "calibration", "profile", "plan", "operating_points")

    _PATH: ClassVar[str] = "exit_sets[0]"

    @property
    def key(self) -> str:
        """The key this set had in schema 1 (``exits`` / ``flex_exits``), as ``Bundle.exit_sets`` names it."""
        return EXIT_SET_KEYS[self.kind]

    @property
    def num_early(self) -> int:
        return len(self.names) - 1

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str, kind: str | None = None) -> ExitSet | None:
        from nestflex.deploy.exits import FALLBACKS, list_confidences  # the runtime's own policy names

        before = r.count
        v = r.obj(v, path)
        g = lambda k, required=True: r.get(v, k, path, required)
        got_kind = g("kind", kind is None)
        if got_kind is None:  # schema-1 sets written before the `kind` key
            got_kind = kind
        got_kind = r.str_(got_kind, _join(path, "kind"), choices=EXIT_KINDS)
        if kind is not None and isinstance(got_kind, str) and got_kind != kind:
            r.fail(_join(path, "kind"), f"must be {kind!r} under `{EXIT_SET_KEYS[kind]}`, got {_show(got_kind)}")
        backbone = r.str_(g("backbone"), _join(path, "backbone"), choices=BACKBONES)
        names = r.strs(g("names"), _join(path, "names"))
        if isinstance(names, tuple) and not names:
            names = r.fail(_join(path, "names"), "is empty; it lists every exit, the final one last")
        early = len(names) - 1 if isinstance(names, tuple) else None
        taps = r.strs(g("taps"), _join(path, "taps"))
        heads = r.seq(g("heads"), _join(path, "heads"))
        if heads is not _BAD:
            heads = tuple(ExitHead._read(r, h, _join(_join(path, "heads"), i)) for i, h in enumerate(heads))
        n = len(r.problems)
        thresholds = r.nums(g("thresholds"), _join(path, "thresholds"), lo=0, hi=1)
        r.hint(n, "HINT: confidences lie in [0, 1]; 1 never exits early, 0 always does")
        confidence = r.str_(g("confidence"), _join(path, "confidence"), choices=list_confidences())
        fallback = r.str_(g("fallback"), _join(path, "fallback"), choices=FALLBACKS)
        positions = r.nums(g("positions"), _join(path, "positions"), lo=0, hi=1)
        macs = r.ints(g("macs"), _join(path, "macs"), lo=0)
        backbone_macs = r.int_(g("backbone_macs"), _join(path, "backbone_macs"), lo=0)
        level = r.int_(g("level", False), _join(path, "level"), lo=0, null=True)
        note = r.str_(g("note", False), _join(path, "note"), null=True)
        program = g("program", False)
        if program is not None:
            program = Program._read(r, program, _join(path, "program"))
        if backbone == "own" and g("program", False) is None:
            r.fail(_join(path, "program"), "is missing; an `own` backbone stores its program here")
        if backbone == "shared" and program is not None:
            r.fail(_join(path, "program"), "must be absent for a `shared` backbone (it runs the capacity program)")
        calibration = r.obj(g("calibration", False), _join(path, "calibration"), null=True)
        if isinstance(calibration, dict) and "file" in calibration:
            r.file(calibration["file"], _join(_join(path, "calibration"), "file"), null=True)
        plan = g("plan", False)
        if plan is not None:
            plan = ExitPlan._read(r, plan, _join(path, "plan"))
        points = r.seq(g("operating_points", False), _join(path, "operating_points"), null=True)
        if points not in (None, _BAD):
            points = tuple(OperatingPoint._read(r, p, _join(_join(path, "operating_points"), i))
                           for i, p in enumerate(points))
        profile = r.file(g("profile", False), _join(path, "profile"), null=True)
        if early is not None:
            why = f"one per early exit: `names` lists {early + 1} exits, the final one last"
            r.length(taps, _join(path, "taps"), early, why)
            r.length(heads, _join(path, "heads"), early, why)
            r.length(thresholds, _join(path, "thresholds"), early, why)
            r.length(positions, _join(path, "positions"), early, why)
            r.length(macs, _join(path, "macs"), early + 1, "one per exit, the final one included")
        if _failed(r, before):
            return None
        return cls(got_kind, backbone, names, taps, heads, thresholds, confidence, fallback, positions, macs,
                   backbone_macs, level, note, program, calibration, plan, points, profile, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind, "backbone": self.backbone, "level": self.level, "note": self.note,
            "names": list(self.names), "positions": list(self.positions), "macs": list(self.macs),
            "backbone_macs": self.backbone_macs, "thresholds": list(self.thresholds), "confidence": self.confidence,
            "fallback": self.fallback,
        }
        _put(out, "program", None if self.program is None else self.program.to_json())
        out["taps"] = list(self.taps)
        out["heads"] = [h.to_json() for h in self.heads]
        _put(out, "calibration", self.calibration)
        _put(out, "profile", self.profile)
        _put(out, "plan", None if self.plan is None else self.plan.to_json())
        _put(out, "operating_points", None if self.operating_points is None else
             [p.to_json() for p in self.operating_points])
        out.update(self.extra)
        return out
