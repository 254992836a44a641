"""The input record: :class:`InputSpec`, what one sample looks like and how to normalise it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _list, _Reader, _Record, _show
from nestflex.deploy.bundle.constants import FLOAT_DTYPES

__all__ = [
    "InputSpec",
]


@dataclass(frozen=True)
class InputSpec(_Record):
    """What one sample looks like; the caller normalises ``(raw * scale - mean) / std``.

    Attributes:
        shape: per-sample shape, e.g. ``(3, 32, 32)``.
        dtype: ``float32``.
        layout: ``NCHW``.
        mean: per-channel normalisation mean (one per ``shape[0]``), or ``None``.
        std: per-channel normalisation standard deviation (one per ``shape[0]``), or ``None``.
        note: how to normalise, for people.
        scale: factor from the raw input to the range ``mean``/``std`` apply to (``1/255`` for
            8-bit images); ``None`` when the data's own transforms define the range (the note says so).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str = "NCHW"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    note: str | None = None
    scale: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _PATH: ClassVar[str] = "input"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> InputSpec | None:
        before = r.count
        v = r.obj(v, path)
        shape = r.ints(r.get(v, "shape", path), _join(path, "shape"), lo=1)
        if isinstance(shape, tuple) and not shape:
            shape = r.fail(_join(path, "shape"), "must have at least one dimension, got [] (array)")
        dtype = r.str_(r.get(v, "dtype", path), _join(path, "dtype"), choices=FLOAT_DTYPES)
        layout = r.str_(r.get(v, "layout", path), _join(path, "layout"))
        mean = r.nums(r.get(v, "mean", path, required=False), _join(path, "mean"), null=True)
        std = r.nums(r.get(v, "std", path, required=False), _join(path, "std"), null=True)
        note = r.str_(r.get(v, "note", path, required=False), _join(path, "note"), null=True)
        scale = r.num(r.get(v, "scale", path, required=False), _join(path, "scale"), lo=0, lo_open=True, null=True)
        if isinstance(shape, tuple):
            for key, val in (("mean", mean), ("std", std)):
                r.length(val, _join(path, key), shape[0], f"one per input channel, shape {list(shape)}")
        if isinstance(std, tuple) and any(s <= 0 for s in std):
            r.fail(_join(path, "std"), f"must hold numbers > 0, got {_show(list(std))}")
        if (mean is None) != (std is None) and mean is not _BAD and std is not _BAD:
            r.fail(_join(path, "std" if std is None else "mean"), "must be given with `mean`/`std` (both or neither)")
        if _failed(r, before):
            return None
        return cls(shape, dtype, layout, mean, std, note, scale,
                   _extra(v, ("shape", "dtype", "layout", "mean", "std", "note", "scale")))

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout, "mean": _list(self.mean),
                "std": _list(self.std), "note": self.note,
                **({} if self.scale is None else {"scale": self.scale}), **self.extra}
