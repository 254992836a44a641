"""The multi-capacity records: one :class:`LevelRow` per level (its profile, widths and resident
bytes) and the :class:`Capacity` backbone (its program and the region of each tensor a level reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _Reader, _Record, _show
from nestflex.deploy.bundle.program_records import Program

__all__ = [
    "LevelRow",
    "Capacity",
]


@dataclass(frozen=True)
class LevelRow(_Record):
    """One multi-capacity level: the ``profile_levels`` row plus its widths and resident bytes.

    Attributes:
        level: the level index (rows are listed smallest first, ``level == index``).
        accuracy: top-1 in [0, 1], or ``None`` when not measured.
        params: parameters.
        macs: multiply-accumulates per sample.
        memory_mb: weight memory, MB.
        latency_ms: ``{batch size: ms}`` (keys are strings), a single number, or ``None``.
        widths: output channels of every conv/linear at this level.
        weight_bytes: bytes resident at this level (``capacity.level_bytes[level]``).
    """

    level: int
    accuracy: float | None
    params: int
    macs: int
    memory_mb: float
    latency_ms: dict[str, float] | float | None
    widths: dict[str, int]
    weight_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("level", "accuracy", "params", "macs", "memory_mb", "latency_ms", "widths",
                                        "weight_bytes")

    _PATH: ClassVar[str] = "levels[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str, index: int | None = None) -> LevelRow | None:
        before = r.count
        v = r.obj(v, path)
        level = r.int_(r.get(v, "level", path), _join(path, "level"), lo=0)
        if isinstance(level, int) and index is not None and level != index:
            r.fail(_join(path, "level"), f"must be {index} (rows are listed smallest level first), got {_show(level)}")
        n = len(r.problems)
        accuracy = r.num(r.get(v, "accuracy", path), _join(path, "accuracy"), lo=0, hi=1, null=True)
        r.hint(n, "HINT: accuracies are fractions (0.91), not percentages (91)")
        params = r.int_(r.get(v, "params", path), _join(path, "params"), lo=0)
        macs = r.int_(r.get(v, "macs", path), _join(path, "macs"), lo=0)
        memory = r.num(r.get(v, "memory_mb", path), _join(path, "memory_mb"), lo=0)
        lat = r.get(v, "latency_ms", path)
        lp = _join(path, "latency_ms")
        if isinstance(lat, Mapping):
            lat = r.obj(lat, lp)
            if lat is not _BAD:
                lat = {k: r.num(x, _join(lp, k), lo=0) for k, x in lat.items()}
        elif lat is not None and lat is not _BAD:
            n = len(r.problems)
            lat = r.num(lat, lp, lo=0)
            r.hint(n, "HINT: {\"batch size\": ms} as profile_levels writes it, a number, or null")
        widths = r.obj(r.get(v, "widths", path), _join(path, "widths"))
        if widths is not _BAD:
            widths = {k: r.int_(x, _join(_join(path, "widths"), k), lo=0) for k, x in widths.items()}
        weight_bytes = r.int_(r.get(v, "weight_bytes", path), _join(path, "weight_bytes"), lo=0)
        if _failed(r, before):
            return None
        return cls(level, accuracy, params, macs, memory, lat, widths, weight_bytes, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        lat = dict(self.latency_ms) if isinstance(self.latency_ms, Mapping) else self.latency_ms
        out = {"level": self.level, "accuracy": self.accuracy, "params": self.params, "macs": self.macs,
               "memory_mb": self.memory_mb, "latency_ms": lat}
        out.update(self.extra)
        out.update(widths=dict(self.widths), weight_bytes=self.weight_bytes)
        return out


@dataclass(frozen=True)
class Capacity(_Record):
    """The multi-capacity backbone: its program and, per nested tensor, the prefix each level reads.

    Attributes:
        nested: whether the model has several nested levels.
        num_levels: levels, >= 1.
        level_bytes: weight bytes resident at each level.
        largest_level_bytes: ``level_bytes[-1]``.
        program: the backbone's op program.
        regions: tensor name -> per level the prefix shape it reads, or ``None`` when that level
            does not read it (another level's BatchNorm); tensors not listed are read whole.
    """

    nested: bool
    num_levels: int
    level_bytes: tuple[int, ...]
    largest_level_bytes: int
    program: Program
    regions: dict[str, tuple[tuple[int, ...] | None, ...]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("nested", "num_levels", "level_bytes", "largest_level_bytes", "program",
                                        "regions")

    _PATH: ClassVar[str] = "capacity"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Capacity | None:
        before = r.count
        v = r.obj(v, path)
        nested = r.bool_(r.get(v, "nested", path), _join(path, "nested"))
        k = r.int_(r.get(v, "num_levels", path), _join(path, "num_levels"), lo=1)
        lb = r.ints(r.get(v, "level_bytes", path), _join(path, "level_bytes"), lo=0)
        largest = r.int_(r.get(v, "largest_level_bytes", path), _join(path, "largest_level_bytes"), lo=0)
        if isinstance(k, int):
            r.length(lb, _join(path, "level_bytes"), k, "one per level, `num_levels`")
        if isinstance(lb, tuple) and lb and isinstance(largest, int) and largest != lb[-1]:
            r.fail(_join(path, "largest_level_bytes"), f"must equal level_bytes[-1] ({lb[-1]}), got {_show(largest)}")
        program = Program._read(r, r.get(v, "program", path), _join(path, "program"))
        rp = _join(path, "regions")
        raw = r.obj(r.get(v, "regions", path, required=False), rp, null=True)
        regions: dict[str, Any] = {}
        for name, per in (raw or {}).items() if raw is not _BAD else ():
            p = _join(rp, name)
            per = r.seq(per, p, what="a list with one shape (or null) per level")
            if per is _BAD:
                continue
            if isinstance(k, int):
                r.length(per, p, k, "one shape or null per level, `num_levels`")
            regions[name] = tuple(r.ints(s, _join(p, i), lo=0, null=True) for i, s in enumerate(per))
        if _failed(r, before):
            return None
        return cls(nested, k, lb, largest, program, regions, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        regions = {n: [None if s is None else list(s) for s in per] for n, per in self.regions.items()}
        return {"nested": self.nested, "num_levels": self.num_levels, "level_bytes": list(self.level_bytes),
                "largest_level_bytes": self.largest_level_bytes, "program": self.program.to_json(),
                "regions": regions, **self.extra}

    def region(self, tensor: str, level: int, full: Sequence[int]) -> tuple[int, ...] | None:
        """The shape of ``tensor`` that ``level`` reads (``full`` when it has no region entry)."""
        per = self.regions.get(tensor)
        return tuple(full) if per is None else per[level]
