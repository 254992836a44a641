"""The records of the files a bundle ships: the :class:`Weights` table of :class:`TensorInfo`, the
:class:`OnnxFile` graphs, the :class:`SampleSet` of labelled inputs, and a :class:`FileEntry` (size and
sha256) per file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nestflex.deploy.bundle._reading import _BAD, _extra, _failed, _join, _put, _Reader, _Record, _show
from nestflex.deploy.bundle.constants import DTYPES, EXIT_KINDS, EXIT_SET_KEYS, SCHEMA_VERSION, WEIGHTS

__all__ = [
    "TensorInfo",
    "Weights",
    "OnnxFile",
    "SampleSet",
    "FileEntry",
]


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of ``weights.safetensors``: ``shape`` and ``dtype`` (:data:`DTYPES`)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Weights(_Record):
    """The weights file and its tensor table (must match the safetensors header exactly)."""

    tensors: dict[str, TensorInfo]
    file: str = WEIGHTS
    extra: dict[str, Any] = field(default_factory=dict)

    _PATH: ClassVar[str] = "weights"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Weights | None:
        before = r.count
        v = r.obj(v, path)
        file = r.str_(r.get(v, "file", path), _join(path, "file"), choices=(WEIGHTS,))
        tp = _join(path, "tensors")
        raw = r.obj(r.get(v, "tensors", path), tp)
        tensors = {}
        for name, meta in (raw.items() if raw is not _BAD else ()):
            p = _join(tp, name)
            meta = r.obj(meta, p)
            shape = r.ints(r.get(meta, "shape", p), _join(p, "shape"), lo=0)
            dtype = r.str_(r.get(meta, "dtype", p), _join(p, "dtype"), choices=tuple(DTYPES))
            tensors[name] = TensorInfo(shape, dtype)
        if _failed(r, before):
            return None
        return cls(tensors, file, _extra(v, ("file", "tensors")))

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "tensors": {n: t.to_json() for n, t in self.tensors.items()}, **self.extra}


@dataclass(frozen=True)
class OnnxFile(_Record):
    """An ONNX graph shipped for other runtimes: ``file``, ``kind`` (level/stage/exit), ``exit_set`` (a kind)."""

    file: str
    kind: str
    exit_set: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    KINDS: ClassVar[tuple[str, ...]] = ("level", "stage", "exit")

    _PATH: ClassVar[str] = "onnx[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str, version: int = SCHEMA_VERSION) -> OnnxFile | None:
        before = r.count
        v = r.obj(v, path)
        file = r.file(r.get(v, "file", path), _join(path, "file"))
        kind = r.str_(r.get(v, "kind", path), _join(path, "kind"), choices=cls.KINDS)
        exit_set = r.get(v, "exit_set", path, required=False)
        if version == 1 and exit_set in EXIT_SET_KEYS.values():  # schema 1 named the set by its key
            exit_set = next(k for k, key in EXIT_SET_KEYS.items() if key == exit_set)
        exit_set = r.str_(exit_set, _join(path, "exit_set"), choices=EXIT_KINDS, null=True)
        if _failed(r, before):
            return None
        return cls(file, kind, exit_set, _extra(v, ("file", "kind", "exit_set")))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "kind": self.kind}
        _put(out, "exit_set", self.exit_set)
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class SampleSet(_Record):
    """Labelled inputs shipped for tuning on the device (int8 calibration, accuracy checks of plans).

    Attributes:
        file: a safetensors file (``samples.safetensors``) holding ``inputs`` (float32,
            ``(count, *input.shape)``, prepared as ``input.note`` says) and ``labels`` (int64, ``(count,)``).
        count: how many samples.
        split: where they were drawn from (``validation``: never the training data), free text.
    """

    file: str
    count: int
    split: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS: ClassVar[tuple[str, ...]] = ("file", "count", "split")

    _PATH: ClassVar[str] = "samples"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> SampleSet | None:
        before = r.count
        v = r.obj(v, path)
        file = r.file(r.get(v, "file", path), _join(path, "file"))
        count = r.int_(r.get(v, "count", path), _join(path, "count"), lo=1)
        split = r.str_(r.get(v, "split", path, required=False), _join(path, "split"), null=True)
        if _failed(r, before):
            return None
        return cls(file, count, split, _extra(v, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "count": self.count}
        _put(out, "split", self.split)
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class FileEntry(_Record):
    """A file of the bundle: its size in ``bytes`` and hex ``sha256``."""

    bytes: int
    sha256: str

    _PATH: ClassVar[str] = "files[0]"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> FileEntry | None:
        before = r.count
        v = r.obj(v, path)
        size = r.int_(r.get(v, "bytes", path), _join(path, "bytes"), lo=0)
        digest = r.get(v, "sha256", path)
        if digest is not _BAD and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            r.fail(_join(path, "sha256"), f"must be 64 lowercase hex digits, got {_show(digest)}")
        return None if _failed(r, before) else cls(size, digest)

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}
