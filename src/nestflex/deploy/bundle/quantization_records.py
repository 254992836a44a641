"""The quantisation records: the bitwidths profiled at a split point (:class:`SplitQuantization` of
:class:`QuantizationRow`) and the per-layer precision the precision profile chose (:class:`PrecisionPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _list, _put, _Reader, _Record, _show

__all__ = [
    "QuantizationRow",
    "SplitQuantization",
    "PrecisionPlan",
]


@dataclass(frozen=True)
class QuantizationRow(_Record):
    """One bitwidth at a split point: ``bits`` (``None``: float), accuracy, mean bytes per frame, ratio."""

    bits: int | None
    accuracy: float | None = None
    bytes_mean: float | None = None
    ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("bits", "accuracy", "bytes_mean", "ratio")

    _PATH: ClassVar[str] = "per_bits[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> QuantizationRow | None:
        before = r.count
        v = r.obj(v, path)
        g = lambda k, required=False: r.get(v, k, path, required)
        out = cls(r.int_(g("bits", True), _join(path, "bits"), lo=1, hi=32, null=True),
                  r.num(g("accuracy"), _join(path, "accuracy"), lo=0, hi=1, null=True),
                  r.num(g("bytes_mean"), _join(path, "bytes_mean"), lo=0, null=True),
                  r.num(g("ratio"), _join(path, "ratio"), lo=0, null=True), _extra(v, cls._KEYS))
        return None if _failed(r, before) else out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bits": self.bits}
        _put(out, "accuracy", self.accuracy)
        _put(out, "bytes_mean", self.bytes_mean)
        _put(out, "ratio", self.ratio)
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class SplitQuantization(_Record):
    """A split point's quantisation profile.

    Attributes:
        lowest_bits: accuracy budget in points (a string key, ``"1"``) -> the lowest bitwidth within
            it, ``None`` when only float transfer meets it.
        fixed_range: ``(lo, hi)`` of the fixed-range baseline, or ``None``.
        per_bits: one :class:`QuantizationRow` per profiled bitwidth.
    """

    lowest_bits: dict[str, int | None] | None = None
    fixed_range: tuple[float, float] | None = None
    per_bits: tuple[QuantizationRow, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("lowest_bits", "fixed_range", "per_bits")

    _PATH: ClassVar[str] = "quantization"

    @classmethod
    def from_profile(cls, row: Mapping[str, Any], *, path: str = "split_profile") -> SplitQuantization:
        """The manifest summary of one ``profile_split_quantization`` split row. Raises :class:`BundleError`."""
        r = _Reader()
        row = r.obj(row, path)
        keep = ("bits", "accuracy", "bytes_mean", "ratio")
        per_bits = r.seq(r.get(row, "per_bits", path, required=False) or [], _join(path, "per_bits"))
        summary = {"lowest_bits": r.get(row, "lowest_bits", path, required=False),
                   "fixed_range": r.get(row, "fixed_range", path, required=False),
                   "per_bits": [{k: x[k] for k in keep if k in x} if isinstance(x, Mapping) else x
                                for x in (per_bits if per_bits is not _BAD else [])]}
        out = cls._read(r, summary, path)
        r.raise_if_any(f"`{path}`")
        return out

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> SplitQuantization | None:
        before = r.count
        v = r.obj(v, path)
        lp = _join(path, "lowest_bits")
        lowest = r.obj(r.get(v, "lowest_bits", path, required=False), lp, null=True)
        if isinstance(lowest, dict):
            lowest = {k: r.int_(b, _join(lp, k), lo=1, hi=32, null=True) for k, b in lowest.items()}
        fixed = r.nums(r.get(v, "fixed_range", path, required=False), _join(path, "fixed_range"), null=True)
        if isinstance(fixed, tuple) and (len(fixed) != 2 or fixed[0] > fixed[1]):
            r.fail(_join(path, "fixed_range"), f"must be [lo, hi] with lo <= hi, got {_show(list(fixed))}")
        rows = r.seq(r.get(v, "per_bits", path, required=False) or [], _join(path, "per_bits"))
        if rows is not _BAD:
            rows = tuple(QuantizationRow._read(r, x, _join(_join(path, "per_bits"), i)) for i, x in enumerate(rows))
        if _failed(r, before):
            return None
        return cls(lowest, fixed, rows, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        return {"lowest_bits": None if self.lowest_bits is None else dict(self.lowest_bits),
                "fixed_range": _list(self.fixed_range), "per_bits": [p.to_json() for p in self.per_bits],
                **self.extra}


@dataclass(frozen=True)
class PrecisionPlan(_Record):
    """The per-layer precision assignment the precision profile chose.

    Attributes:
        assignment: layer name -> precision (``float32``, ``bfloat16``, ``int8``, ...), or ``None``.
        counts: precision -> how many layers use it, or ``None``.
        budget_points: the accuracy drop allowed, in points, or ``None``.
        file: the full profile in the bundle (``profiles/layer_precision.json``), or ``None``.
    """

    assignment: dict[str, str] | None = None
    counts: dict[str, int] | None = None
    budget_points: float | None = None
    file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("assignment", "counts", "budget_points", "file")

    _PATH: ClassVar[str] = "precision"

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any], *, file: str | None = None) -> PrecisionPlan:
        """The plan of a ``profile_layer_precision`` result. Raises :class:`BundleError`."""
        r = _Reader()
        out = None
        prof = r.obj(profile, "precision_profile")
        a = r.obj(r.get(prof, "assignment", "precision_profile", required=False) or {}, "precision_profile.assignment")
        if a is not _BAD:
            out = cls._read(r, {"assignment": a.get("layers", a.get("assignment")), "counts": a.get("counts"),
                                "budget_points": a.get("budget_points"), "file": file}, "precision_profile.assignment")
        r.raise_if_any("`precision_profile`")
        return out

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> PrecisionPlan | None:
        before = r.count
        v = r.obj(v, path)
        g = lambda k: r.get(v, k, path, required=False)
        assignment = r.str_map(g("assignment"), _join(path, "assignment"), null=True)
        counts = r.obj(g("counts"), _join(path, "counts"), null=True)
        if isinstance(counts, dict):
            counts = {k: r.int_(n, _join(_join(path, "counts"), k), lo=0) for k, n in counts.items()}
        budget = r.num(g("budget_points"), _join(path, "budget_points"), lo=0, null=True)
        file = r.file(g("file"), _join(path, "file"), null=True)
        if _failed(r, before):
            return None
        return cls(assignment, counts, budget, file, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        return {"assignment": None if self.assignment is None else dict(self.assignment),
                "counts": None if self.counts is None else dict(self.counts), "budget_points": self.budget_points,
                "file": self.file, **self.extra}
