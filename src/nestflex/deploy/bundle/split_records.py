"""The split-point record: :class:`SplitPoint`, where the largest level can be cut for split inference
and what crosses the cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _put, _Reader, _Record, _show
from nestflex.deploy.bundle.quantization_records import SplitQuantization

__all__ = [
    "SplitPoint",
]


@dataclass(frozen=True)
class SplitPoint(_Record):
    """A point where the largest level can be cut for split inference, and what crosses the cut.

    Attributes:
        name: the layer name (``features.relu3``).
        node: the capacity program node the head ends at.
        tensors: ``(node name, per-sample shape)`` of every tensor that crosses the cut.
        numel: elements crossing per sample; ``float32_bytes == 4 * numel``.
        macs_before: MACs of the head; ``macs_fraction`` of the whole model.
        quantization: its :class:`SplitQuantization`, or ``None`` when the split profile was not given.
    """

    name: str
    node: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    numel: int
    float32_bytes: int
    macs_before: int
    macs_fraction: float
    quantization: SplitQuantization | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("name", "node", "tensors", "numel", "float32_bytes", "macs_before",
                                        "macs_fraction", "quantization")

    _PATH: ClassVar[str] = "splits[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> SplitPoint | None:
        before = r.count
        v = r.obj(v, path)
        name = r.str_(r.get(v, "name", path), _join(path, "name"))
        node = r.str_(r.get(v, "node", path), _join(path, "node"))
        tp = _join(path, "tensors")
        raw = r.seq(r.get(v, "tensors", path), tp)
        tensors: Any = []
        for i, t in enumerate(raw if raw is not _BAD else []):
            pair = r.seq(t, _join(tp, i), what="a [node name, shape] pair")
            if pair is _BAD:
                continue
            if len(pair) != 2:
                r.fail(_join(tp, i), f"must be a [node name, shape] pair, got {_show(pair)}")
                continue
            tensors.append((r.str_(pair[0], _join(_join(tp, i), 0)), r.ints(pair[1], _join(_join(tp, i), 1), lo=1)))
        numel = r.int_(r.get(v, "numel", path), _join(path, "numel"), lo=0)
        f32 = r.int_(r.get(v, "float32_bytes", path), _join(path, "float32_bytes"), lo=0)
        if isinstance(numel, int) and isinstance(f32, int) and f32 != 4 * numel:
            r.fail(_join(path, "float32_bytes"), f"must be 4 * numel ({4 * numel}), got {_show(f32)}")
        if isinstance(numel, int) and raw is not _BAD and not _failed(r, before):
            total = sum(math.prod(shape) for _, shape in tensors)
            if total != numel:
                r.fail(_join(path, "numel"), f"must be the elements of `tensors` ({total}), got {_show(numel)}")
        macs_before = r.int_(r.get(v, "macs_before", path), _join(path, "macs_before"), lo=0)
        fraction = r.num(r.get(v, "macs_fraction", path), _join(path, "macs_fraction"), lo=0, hi=1)
        q = r.get(v, "quantization", path, required=False)
        if q is not None:
            q = SplitQuantization._read(r, q, _join(path, "quantization"))
        if _failed(r, before):
            return None
        return cls(name, node, tuple(tensors), numel, f32, macs_before, fraction, q, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "node": self.node,
                               "tensors": [[n, list(s)] for n, s in self.tensors], "numel": self.numel,
                               "float32_bytes": self.float32_bytes, "macs_before": self.macs_before,
                               "macs_fraction": self.macs_fraction}
        _put(out, "quantization", None if self.quantization is None else self.quantization.to_json())
        out.update(self.extra)
        return out
