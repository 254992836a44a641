"""The bundle manifest, defined once: typed, frozen records that the writer and the reader share.

The exporter (:func:`nestflex.export.export_bundle`, training side) builds a :class:`Manifest`
and writes :meth:`Manifest.to_json` to ``manifest.json``; :func:`nestflex.deploy.load` reads it
back with :meth:`Manifest.from_json`, and the exporter checks what it wrote with the same call, so
writer and reader cannot drift. ``from_json`` validates every field the runtime uses (JSON types,
finite numbers, ranges, tensor shapes and dtypes against the safetensors header, program node ops,
arguments and attributes, regions inside their tensors, exit taps, FlexDNN filter indices, split
nodes) and reports *every* problem it finds in one :class:`BundleError`, each named by its path
(``levels[2].memory_mb``) with the value it found. It raises nothing else, whatever the JSON holds.

Records (one per manifest section): :class:`Manifest`, :class:`Producer`, :class:`InputSpec`,
:class:`LevelRow`, :class:`Capacity`, :class:`Program` of :class:`ProgramNode`,
:class:`ExitSet` with :class:`ExitHead`, :class:`ExitPlan` and :class:`OperatingPoint`,
:class:`SplitPoint` with :class:`SplitQuantization` and :class:`QuantizationRow`,
:class:`PrecisionPlan`, :class:`Weights` of :class:`TensorInfo`, :class:`OnnxFile`,
:class:`FileEntry`. Keys a record does not know are kept in its ``extra`` and written back
(additive keys from a newer exporter survive a read); everything the runtime reads is typed.

Schema versions: **2** lists the exit sets as ``"exit_sets": [{"kind": "progressive", ...},
{"kind": "flexdnn", ...}]``. **1** had two parallel keys, ``exits`` and ``flex_exits``; a
version-1 manifest is upgraded on read (problems are reported under its own key names), and
:meth:`Manifest.to_json` always writes the current version.

Example:
    >>> m = Manifest.from_json(json.load(open("model.nfx/manifest.json")))  # doctest: +SKIP
    >>> [s.kind for s in m.exit_sets], m.num_levels                         # doctest: +SKIP
    (['progressive', 'flexdnn'], 3)
    >>> Manifest.from_json(m.to_json()) == m                                # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from pathlib import PurePosixPath
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from nestflex.errors import NestflexError

__all__ = [
    "BundleError",
    "FORMAT",
    "SCHEMA_VERSION",
    "MANIFEST",
    "WEIGHTS",
    "SAMPLES",
    "EXIT_KINDS",
    "EXIT_SET_KEYS",
    "BACKBONES",
    "DTYPES",
    "PROGRAM_OPS",
    "Producer",
    "InputSpec",
    "SampleSet",
    "LevelRow",
    "ProgramNode",
    "Program",
    "Capacity",
    "ExitHead",
    "ExitPlan",
    "OperatingPoint",
    "ExitSet",
    "QuantizationRow",
    "SplitQuantization",
    "SplitPoint",
    "PrecisionPlan",
    "TensorInfo",
    "Weights",
    "OnnxFile",
    "FileEntry",
    "Manifest",
    "manifest_digest",
    "read_safetensors_header",
    "parse_json",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "MAX_NUMBER_CHARS",
    "MAX_HEADER_BYTES",
]

#: ``manifest["format"]`` of every bundle
FORMAT = "nestflex-bundle"
#: the manifest layout written here; :meth:`Manifest.from_json` reads 1 and 2 and refuses larger
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
SAMPLES = "samples.safetensors"  # the optional labelled samples (SampleSet)
#: the kinds of exit set a bundle may hold (at most one of each); both run under the same runtime
EXIT_KINDS: tuple[str, ...] = ("progressive", "flexdnn")
#: kind -> the key that held the set in schema 1 (and that ``Bundle.exit_sets`` still uses)
EXIT_SET_KEYS: dict[str, str] = {"progressive": "exits", "flexdnn": "flex_exits"}
#: ``shared``: the heads sit on the capacity backbone's largest level; ``own``: the set stores its backbone
BACKBONES: tuple[str, ...] = ("shared", "own")
#: tensor dtype (manifest spelling) -> bytes per element
DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                          "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_FLOATS = ("float32", "float16", "bfloat16", "float64")
_INDEX_DTYPES = ("int64", "int32")
#: safetensors header dtype -> manifest spelling
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
#: free-form JSON (provenance, calibration summaries) deeper than this is refused: nothing nestflex
#: writes comes close, and deeper values make printing, hashing or comparing them recurse too far
_MAX_DEPTH = 32
_SHOWN_PROBLEMS = 25
_HINT = ("HINT: the manifest was edited by hand or written by a broken exporter; export the bundle again "
         "(nestflex.export.export_bundle)")


class BundleError(NestflexError, ValueError):
    """A bundle is missing, corrupt, tampered with, of an unknown version, or used wrongly.

    Attributes:
        problems: every problem found, one line each (``()`` for a single-cause error).
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems)


# --------------------------------------------------------------------------------------------
# program ops: what the runtime (nestflex.deploy.runtime) interprets


@dataclass(frozen=True)
class _Op:
    """Signature of one program op: argument count, attributes (name -> kind, required) and params."""

    args: int | None  # exact count; None: one or more (output)
    literals: bool = False  # may an argument be a number instead of a node name (binary ops)
    attrs: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
    params: tuple[str, ...] = ()  # required roles
    optional_params: tuple[str, ...] = ()
    per_level: bool = False  # may carry params_per_level (a switchable BatchNorm)


_UNARY = _Op(1)
_POOL_ATTRS = {"kernel_size": ("pos_pair", True), "stride": ("pos_pair", True), "padding": ("pair", True),
               "ceil_mode": ("bool", True)}
#: op name -> signature. ``nestflex.deploy.runtime`` runs exactly these (a test keeps the two in step).
PROGRAM_OPS: dict[str, _Op] = {
    "input": _Op(0),
    "output": _Op(None),
    "param": _Op(0, params=("value",)),
    "conv2d": _Op(1, attrs={"stride": ("pos_pair", True), "padding": ("pair", True), "dilation": ("pos_pair", True),
                            "groups": ("pos_int", True), "depthwise": ("bool", False)},
                  params=("weight",), optional_params=("bias",)),
    "linear": _Op(1, params=("weight",), optional_params=("bias",)),
    "batch_norm": _Op(1, attrs={"eps": ("eps", True)}, params=("running_mean", "running_var"),
                      optional_params=("weight", "bias"), per_level=True),
    "relu": _UNARY,
    "relu6": _UNARY,
    "identity": _UNARY,
    "max_pool2d": _Op(1, attrs={**_POOL_ATTRS, "dilation": ("pos_pair", True)}),
    "avg_pool2d": _Op(1, attrs={**_POOL_ATTRS, "count_include_pad": ("bool", True),
                                "divisor_override": ("opt_pos_int", False)}),
    "adaptive_avg_pool2d": _Op(1, attrs={"output_size": ("output_size", True)}),
    "adaptive_max_pool2d": _Op(1, attrs={"output_size": ("output_size", True)}),
    "flatten": _Op(1, attrs={"start_dim": ("int", True), "end_dim": ("int", True)}),
    "add": _Op(2, literals=True),
    "sub": _Op(2, literals=True),
    "mul": _Op(2, literals=True),
    "index_select": _Op(2, attrs={"dim": ("int", True)}),
}
_SAME_CHANNELS = ("batch_norm", "relu", "relu6", "identity", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                  "adaptive_max_pool2d")


# --------------------------------------------------------------------------------------------
# the reader: typed getters that record a problem (path, value, expectation) instead of raising


class _Bad:
    def __repr__(self) -> str:
        return "<invalid>"


_BAD: Any = _Bad()
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (list, tuple)):
        return "array"
    if isinstance(v, Mapping):
        return "object"
    return type(v).__name__


def _show(v: Any, limit: int = 60) -> str:
    """The value as the message echoes it: short repr plus its JSON type (never raises)."""
    try:
        text = "nan" if isinstance(v, float) and math.isnan(v) else repr(v)
    except (ValueError, RecursionError):  # an int too long to print, a value nested too deep
        text = "..."
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} ({_json_type(v)})"


def _between(kind: str, lo: Any, hi: Any, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{kind} {'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{kind} <= {hi}"
    return kind


class _Reader:
    """Collects problems; every getter returns the value, or ``_BAD`` after recording why."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.count = 0  # every failure, also those deduplicated by path
        self._seen: set[str] = set()

    def fail(self, path: str, message: str) -> Any:
        self.count += 1
        if path not in self._seen:
            self._seen.add(path)
            self.problems.append(f"`{path}` {message}")
        return _BAD

    def bad(self) -> Any:
        """A value that failed upstream reached a record: that record fails too (nothing new to report)."""
        self.count += 1
        return _BAD

    def hint(self, before: int, text: str) -> None:
        """Append ``text`` to the last problem if it was added after ``before`` problems."""
        if len(self.problems) > before:
            self.problems[-1] += f". {text}"

    def raise_if_any(self, what: str) -> None:
        if self.problems:
            raise BundleError(describe(self.problems, what, hint=None), self.problems)

    # field access -------------------------------------------------------------------------
    def get(self, obj: Any, key: str, path: str, required: bool = True) -> Any:
        if obj is _BAD:
            return _BAD
        if key in obj:
            return obj[key]
        return self.fail(_join(path, key), "is missing") if required else None

    # JSON types ---------------------------------------------------------------------------
    def obj(self, v: Any, path: str, null: bool = False) -> Any:
        if v is _BAD:
            return self.bad()
        if v is None and null:
            return v
        if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
            return dict(v)
        return self.fail(path, f"must be an object{' or null' if null else ''}, got {_show(v)}")

    def seq(self, v: Any, path: str, null: bool = False, what: str = "a list") -> Any:
        if v is _BAD:
            return self.bad()
        if v is None and null:
            return v
        if isinstance(v, (list, tuple)):
            return list(v)
        return self.fail(path, f"must be {what}{' or null' if null else ''}, got {_show(v)}")

    def int_(self, v: Any, path: str, lo: int | None = None, hi: int | None = None, null: bool = False) -> Any:
        if v is _BAD:
            return self.bad()
        if v is None and null:
            return v
        if isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (hi is None or v <= hi):
            return v
        return self.fail(path, f"must be {_between('an int', lo, hi)}{' or null' if null else ''}, got {_show(v)}")

    def num(self, v: Any, path: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            null: bool = False) -> Any:
        if v is _BAD:
            return self.bad()
        if v is None and null:
            return v
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok and isinstance(v, float):
            ok = math.isfinite(v)
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v <= hi
        if ok:
            return v
        return self.fail(path, f"must be {_between('a finite number', lo, hi, lo_open)}{' or null' if null else ''}, "
                               f"got {_show(v)}")

    def str_(self, v: Any, path: str, choices: Sequence[str] | None = None, null: bool = False) -> Any:
        if v is _BAD:
            return self.bad()
        if v is None and null:
            return v
        if isinstance(v, str) and v and (choices is None or v in choices):
            return v
        want = f"one of {', '.join(repr(c) for c in choices)}" if choices is not None else "a non-empty string"
        return self.fail(path, f"must be {want}{' or null' if null else ''}, got {_show(v)}")

    def bool_(self, v: Any, path: str, null: bool = False) -> Any:
        if v is _BAD:
            return self.bad()
        if (v is None and null) or isinstance(v, bool):
            return v
        return self.fail(path, f"must be true or false{' or null' if null else ''}, got {_show(v)}")

    # composites ---------------------------------------------------------------------------
    def ints(self, v: Any, path: str, lo: int | None = None, null: bool = False) -> Any:
        """A list of ints (>= ``lo``), as a tuple."""
        v = self.seq(v, path, null=null, what=f"a list of {_between('ints', lo, None)}")
        if v is _BAD or v is None:
            return v
        out = tuple(self.int_(x, _join(path, i), lo=lo) for i, x in enumerate(v))
        return _BAD if any(x is _BAD for x in out) else out

    def nums(self, v: Any, path: str, lo: float | None = None, hi: float | None = None, null: bool = False) -> Any:
        v = self.seq(v, path, null=null, what=f"a list of {_between('finite numbers', lo, hi)}")
        if v is _BAD or v is None:
            return v
        out = tuple(self.num(x, _join(path, i), lo=lo, hi=hi) for i, x in enumerate(v))
        return _BAD if any(x is _BAD for x in out) else out

    def strs(self, v: Any, path: str, null: bool = False) -> Any:
        v = self.seq(v, path, null=null, what="a list of strings")
        if v is _BAD or v is None:
            return v
        out = tuple(self.str_(x, _join(path, i)) for i, x in enumerate(v))
        return _BAD if any(x is _BAD for x in out) else out

    def str_map(self, v: Any, path: str, null: bool = False) -> Any:
        """An object of string values."""
        v = self.obj(v, path, null=null)
        if v is _BAD or v is None:
            return v
        out = {k: self.str_(x, _join(path, k)) for k, x in v.items()}
        return _BAD if any(x is _BAD for x in out.values()) else out

    def length(self, v: Any, path: str, n: int, why: str) -> Any:
        if v is _BAD or v is None or len(v) == n:
            return v
        return self.fail(path, f"has {len(v)} entries, expected {n} ({why}), got {_show(list(v))}")

    def file(self, v: Any, path: str, null: bool = False) -> Any:
        v = self.str_(v, path, null=null)
        if isinstance(v, str) and not safe_relpath(v):
            return self.fail(path, f"must be a path inside the bundle (relative, no '..'), got {_show(v)}")
        return v


def describe(problems: Sequence[str], what: str = MANIFEST, hint: str | None = _HINT) -> str:
    """``manifest.json is invalid (N problems): a; b; ... HINT: ...``, at most 25 problems spelled out."""
    n = len(problems)
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = f"; and {n - _SHOWN_PROBLEMS} more (BundleError.problems lists them all)" if n > _SHOWN_PROBLEMS else ""
    return f"{what} is invalid ({n} problem{'s' if n != 1 else ''}): {shown}{more}." + (f" {hint}" if hint else "")


def safe_relpath(rel: str) -> bool:
    """Whether ``rel`` names a file inside the bundle: relative, POSIX, no ``..``, not empty."""
    if not isinstance(rel, str) or not rel or any(c in rel for c in "\\\x00") or not rel.isprintable():
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and ".." not in p.parts and rel not in (".", MANIFEST)


def _walk_free_form(r: _Reader, value: Any, path: str) -> None:
    """Flag non-finite numbers and over-deep nesting anywhere in ``value`` (iterative: no recursion)."""
    stack = [(value, path, 0)]
    while stack:
        v, p, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            r.fail(p, f"must be a finite number, got {_show(v)}. HINT: JSON has no NaN or Infinity")
        elif isinstance(v, (Mapping, list, tuple)):
            if depth >= _MAX_DEPTH:
                r.fail(p, f"is nested deeper than {_MAX_DEPTH} levels")
                continue
            items = list(v.items() if isinstance(v, Mapping) else enumerate(v))
            for k, x in reversed(items):  # reversed onto the stack: problems come in document order
                if isinstance(x, (float, Mapping, list, tuple)):
                    stack.append((x, _join(p, k) if isinstance(k, (str, int)) else f"{p}[{k!r}]", depth + 1))


def _extra(obj: Any, known: Iterable[str]) -> dict[str, Any]:
    if obj is _BAD or obj is None:
        return {}
    known = set(known)
    return {k: v for k, v in obj.items() if k not in known}


def _failed(r: _Reader, before: int) -> bool:
    return r.count > before


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """Write ``key`` only when it has a value (optional keys stay absent, as the exporter wrote them)."""
    if value is not None:
        out[key] = value


def _list(v: Sequence[Any] | None) -> list[Any] | None:
    return None if v is None else list(v)


# --------------------------------------------------------------------------------------------
# records


class _Record:
    """``from_json`` for a section record: local checks only (the checks across sections need the
    whole manifest: :meth:`Manifest.from_json`)."""

    _PATH: ClassVar[str] = ""

    @classmethod
    def from_json(cls, obj: Any, *, path: str | None = None, **context: Any) -> Any:
        """Read one section (its JSON object) into the record.

        Args:
            obj: the parsed JSON of the section.
            path: the name its problems are reported under (default: the section's manifest key).
            **context: what the section's checks need from around it (``index`` of a level row,
                ``kind`` of a schema-1 exit set, ``version`` of an ONNX entry).

        Raises:
            BundleError: every problem found in the section.
        """
        r = _Reader()
        out = cls._read(r, obj, cls._PATH if path is None else path, **context)  # type: ignore[attr-defined]
        r.raise_if_any(f"`{path or cls._PATH}`" if (path or cls._PATH) else cls.__name__)
        return out


@dataclass(frozen=True)
class Producer(_Record):
    """Who wrote the bundle: ``name`` (``nestflex``), ``version``, ``torch``."""

    name: str
    version: str
    torch: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _PATH: ClassVar[str] = "producer"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Producer | None:
        before = r.count
        v = r.obj(v, path)
        name = r.str_(r.get(v, "name", path), _join(path, "name"))
        version = r.str_(r.get(v, "version", path), _join(path, "version"))
        torch = r.str_(r.get(v, "torch", path, required=False), _join(path, "torch"), null=True)
        if _failed(r, before):
            return None
        return cls(name, version, torch, _extra(v, ("name", "version", "torch")))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "torch": self.torch, **self.extra}


@dataclass(frozen=True)
class InputSpec(_Record):
    """What one sample looks like; the caller normalises ``(raw * scale - mean) / std``.

    Attributes:
        shape: per-sample shape, e.g. ``(3, 32, 32)``.
        dtype: ``float32``.
        layout: ``NCHW``.
        mean, std: per-channel normalisation (one per ``shape[0]``), or ``None``.
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
        dtype = r.str_(r.get(v, "dtype", path), _join(path, "dtype"), choices=_FLOATS)
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


@dataclass(frozen=True)
class LevelRow(_Record):
    """One multi-capacity level: the ``profile_levels`` row plus its widths and resident bytes.

    Attributes:
        level: the level index (rows are listed smallest first, ``level == index``).
        accuracy: top-1 in [0, 1], or ``None`` when not measured.
        params, macs: parameters and multiply-accumulates per sample.
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
class ProgramNode:
    """One node of an op program (see :data:`PROGRAM_OPS`).

    Attributes:
        name: unique within its program; later nodes refer to it in ``args``.
        op: the op.
        args: earlier node names, or numbers (binary ops only).
        attrs: the op's attributes (``stride``, ``eps``, ...).
        params: role -> tensor name in ``weights.safetensors``, or ``None``.
        params_per_level: for a switchable BatchNorm, one ``params`` mapping per level.
    """

    name: str
    op: str
    args: tuple[str | int | float, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] | None = None
    params_per_level: tuple[dict[str, str], ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def level_params(self, level: int) -> dict[str, str]:
        """The params this node reads at ``level`` (one mapping shared by every level, or the level's own)."""
        per = self.params_per_level
        if per:
            return per[level if len(per) > 1 else 0]
        return self.params or {}

    def tensor_names(self) -> list[str]:
        """Every tensor the node may read, at any level."""
        out = list((self.params or {}).values())
        for p in self.params_per_level or ():
            out += [t for t in p.values() if t not in out]
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "op": self.op}
        if self.args or self.op not in ("input", "param"):
            out["args"] = list(self.args)
        if self.attrs or self.op not in ("input", "output", "param"):
            out["attrs"] = dict(self.attrs)
        _put(out, "params", None if self.params is None else dict(self.params))
        _put(out, "params_per_level", None if self.params_per_level is None else [dict(p) for p in self.params_per_level])
        out.update(self.extra)
        return out


def _read_attr(r: _Reader, kind: str, v: Any, path: str) -> Any:
    if kind == "int":
        return r.int_(v, path)
    if kind == "pos_int":
        return r.int_(v, path, lo=1)
    if kind == "opt_pos_int":
        return r.int_(v, path, lo=1, null=True)
    if kind == "bool":
        return r.bool_(v, path)
    if kind == "eps":
        return r.num(v, path, lo=0, lo_open=True)
    lo = 1 if kind in ("pos_pair", "output_size") else 0
    null_ok = kind == "output_size"  # adaptive pools: None keeps that dimension
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(
            (isinstance(x, int) and not isinstance(x, bool) and x >= lo) or (null_ok and x is None) for x in v):
        return list(v)
    if isinstance(v, int) and not isinstance(v, bool) and v >= lo:
        return v
    extra = " (null keeps that dimension)" if null_ok else ""
    return r.fail(path, f"must be an int >= {lo} or a list of two{extra}, got {_show(v)}")


@dataclass(frozen=True)
class Program(_Record):
    """An op program: nodes in execution order, the first ``input``, the last ``output``.

    In JSON a program is the list of its nodes. :meth:`from_json` checks every node: a known op,
    the op's argument count, arguments that name an *earlier* node (or numbers where the op takes
    them), the op's attributes with their types, and its params roles.
    """

    nodes: tuple[ProgramNode, ...]

    _PATH: ClassVar[str] = "program"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Program | None:
        before = r.count
        v = r.seq(v, path, what="a list of program nodes")
        if v is _BAD:
            return None
        if not v:
            r.fail(path, "is empty; a program has at least an `input` and an `output` node")
            return None
        nodes: list[ProgramNode] = []
        defined: dict[str, str] = {}  # name -> op, in order
        for i, raw in enumerate(v):
            node = _read_node(r, raw, _join(path, i), defined)
            if node is not None:
                nodes.append(node)
            # a broken node still defines its name: later nodes that read it are not broken too
            name = raw.get("name") if isinstance(raw, Mapping) else None
            if isinstance(name, str) and name not in defined:
                op = raw.get("op")
                defined[name] = op if isinstance(op, str) and op in PROGRAM_OPS else "?"
        if _failed(r, before):
            return None
        ops = [n.op for n in nodes]
        if ops[0] != "input" or ops.count("input") != 1:
            r.fail(_join(path, 0), f"must be the program's one `input` node; ops are {_show(ops[:6])}")
        if ops[-1] != "output" or ops.count("output") != 1:
            r.fail(_join(path, len(ops) - 1), f"must be the program's one `output` node (the last); ops end "
                                               f"{_show(ops[-6:])}")
        return None if _failed(r, before) else cls(tuple(nodes))

    def to_json(self) -> list[dict[str, Any]]:
        return [n.to_json() for n in self.nodes]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> ProgramNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def tensor_names(self) -> list[str]:
        """Every tensor the program may read (all levels), in first-use order."""
        out: list[str] = []
        for n in self.nodes:
            out += [t for t in n.tensor_names() if t not in out]
        return out


def _read_node(r: _Reader, v: Any, path: str, defined: Mapping[str, str]) -> ProgramNode | None:
    before = r.count
    v = r.obj(v, path)
    name = r.str_(r.get(v, "name", path), _join(path, "name"))
    if isinstance(name, str) and name in defined:
        r.fail(_join(path, "name"), f"repeats node name {name!r}; names are unique within a program")
    op = r.get(v, "op", path)
    spec = PROGRAM_OPS.get(op) if isinstance(op, str) else None
    if op is not _BAD and spec is None:
        r.fail(_join(path, "op"), f"names op {_show(op)}, which this runtime does not know; known: "
                                  f"{', '.join(sorted(PROGRAM_OPS))}. HINT: a newer nestflex may know it; upgrade nestflex")
        return None
    if spec is None:
        return None
    where = f"`{op}` node {name!r}" if isinstance(name, str) else f"`{op}` node"
    ap = _join(path, "args")
    args = r.get(v, "args", path, required=spec.args != 0)
    args = [] if args is None and spec.args == 0 else r.seq(args, ap)
    if args is not _BAD:
        if spec.args is not None and len(args) != spec.args:
            r.fail(ap, f"has {len(args)} arguments, a {where} takes {spec.args}, got {_show(args)}")
        elif spec.args is None and not args:
            r.fail(ap, f"is empty; a {where} returns at least one node")
        for i, a in enumerate(args):
            p = _join(ap, i)
            if isinstance(a, str):
                if a not in defined:
                    r.fail(p, f"names {a!r}, which is not an earlier node of this program (a {where} reads only "
                              f"nodes defined before it)")
                elif defined[a] == "output":
                    r.fail(p, f"names the `output` node {a!r}")
                elif op == "index_select" and i == 1 and defined[a] not in ("param", "?"):
                    r.fail(p, f"must name a `param` node (the index tensor), got node {a!r} ({defined[a]})")
            elif spec.literals and isinstance(a, (int, float)) and not isinstance(a, bool):
                r.num(a, p)
            else:
                kind = "a node name or a number" if spec.literals else "a node name"
                r.fail(p, f"must be {kind} (the {where} reads a tensor), got {_show(a)}")
        if spec.literals and len(args) == 2 and not any(isinstance(a, str) for a in args):
            r.fail(ap, f"must name at least one node (a {where} of two numbers is not a tensor), got {_show(args)}")
    attrs = r.obj(r.get(v, "attrs", path, required=bool(spec.attrs)), _join(path, "attrs"), null=not spec.attrs)
    if attrs is None:
        attrs = {}
    if attrs is not _BAD:
        for key, (kind, required) in spec.attrs.items():
            if key in attrs:
                _read_attr(r, kind, attrs[key], _join(_join(path, "attrs"), key))
            elif required:
                r.fail(_join(_join(path, "attrs"), key), f"is missing; a {where} needs it")
    params = _read_params(r, r.get(v, "params", path, required=False), _join(path, "params"), spec, where)
    per_level = r.get(v, "params_per_level", path, required=False)
    pp = _join(path, "params_per_level")
    if per_level is not None:
        if not spec.per_level:
            per_level = r.fail(pp, f"is not allowed on a {where} (only on batch_norm)")
        else:
            per_level = r.seq(per_level, pp)
            if per_level is not _BAD:
                if not per_level:
                    r.fail(pp, "is empty; it holds one params object per level")
                per_level = tuple(_read_params(r, p, _join(pp, k), spec, where, required=True)
                                  for k, p in enumerate(per_level))
        if params is not None and per_level is not _BAD:
            r.fail(pp, f"and `params` are both given on {where}; use one")
    elif spec.params and params is None:
        r.fail(_join(path, "params"), f"is missing; a {where} reads {', '.join(spec.params)}")
    if _failed(r, before):
        return None
    extra = _extra(v, ("name", "op", "args", "attrs", "params", "params_per_level"))
    return ProgramNode(name, op, tuple(args), attrs, params, per_level, extra)


def _read_params(r: _Reader, v: Any, path: str, spec: _Op, where: str, required: bool = False) -> Any:
    if v is None and not required:
        return None
    v = r.str_map(v, path)
    if v is _BAD:
        return v
    allowed = (*spec.params, *spec.optional_params)
    for role in v:
        if role not in allowed:
            r.fail(_join(path, role), f"is not a role a {where} reads; roles: {', '.join(allowed) or 'none'}")
    for role in spec.params:
        if role not in v:
            r.fail(_join(path, role), f"is missing; a {where} reads it")
    return v


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


@dataclass(frozen=True)
class Manifest(_Record):
    """The whole ``manifest.json`` (docs/deploy.md lists every key).

    Build one to write a bundle (the exporter does), or read one with :meth:`from_json`, which
    validates it; :meth:`to_json` gives the plain dict written to ``manifest.json`` (always the
    current :data:`SCHEMA_VERSION`).

    Attributes:
        producer, input: :class:`Producer`, :class:`InputSpec`.
        num_classes, classes: logits per sample; class names or ``None``.
        levels: one :class:`LevelRow` per level, smallest first.
        capacity: the multi-capacity backbone (:class:`Capacity`).
        weights: the tensor table (:class:`Weights`).
        exit_sets: the exit sets (:class:`ExitSet`, at most one per kind).
        splits: the split points (:class:`SplitPoint`) of the largest level.
        precision: the precision plan, or ``None``.
        samples: the labelled sample inputs (:class:`SampleSet`), or ``None``.
        profiles: profile name -> shipped file.
        onnx: the ONNX files (:class:`OnnxFile`).
        files: path -> :class:`FileEntry`, every file but the manifest.
        model: the producer's provenance (free-form JSON object), or ``None``.
        switching: measured level switches (objects with ``from``, ``to``, ``nested_ms``), or ``None``.
        created_unix: export time.
        integrity: ``{"manifest_sha256": ...}`` (:func:`manifest_digest`), or ``None`` before it is computed.
        extra: top-level keys this version does not know (kept, written back).
        schema_version: the version the manifest was *read* in (1 for an upgraded bundle; not compared).
    """

    producer: Producer
    input: InputSpec
    num_classes: int
    levels: tuple[LevelRow, ...]
    capacity: Capacity
    weights: Weights
    classes: tuple[str, ...] | None = None
    exit_sets: tuple[ExitSet, ...] = ()
    splits: tuple[SplitPoint, ...] = ()
    precision: PrecisionPlan | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    samples: SampleSet | None = None
    onnx: tuple[OnnxFile, ...] = ()
    files: dict[str, FileEntry] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    switching: tuple[dict[str, Any], ...] | None = None
    created_unix: int = 0
    integrity: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = field(default=SCHEMA_VERSION, compare=False)

    _KEYS: ClassVar[tuple[str, ...]] = ("format", "schema_version", "producer", "created_unix", "input", "num_classes",
                                        "classes", "levels", "model", "switching", "capacity", "exit_sets", "splits",
                                        "profiles", "precision", "samples", "weights", "onnx", "files",
                                        "integrity")

    @property
    def num_levels(self) -> int:
        return self.capacity.num_levels

    def exit_set(self, name: str) -> ExitSet | None:
        """The exit set of kind ``name`` (``progressive``/``flexdnn``) or schema-1 key (``exits``/``flex_exits``)."""
        return next((s for s in self.exit_sets if name in (s.kind, s.key)), None)

    @classmethod
    def from_json(cls, obj: Any, *, weights_header: Mapping[str, Any] | None = None,
                  where: str = "manifest") -> Manifest:
        """Validate a parsed ``manifest.json`` (schema 1 or 2) and return its record.

        Args:
            obj: the parsed JSON.
            weights_header: the safetensors header of the weights (:func:`read_safetensors_header`);
                when given, the tensor table must match it exactly (names, shapes, dtypes).
            where: what the message names (``"bundle 'model.nfx'"``).

        Returns:
            the :class:`Manifest`.

        Raises:
            BundleError: every problem found, each named by its path, with the value and what was
                expected; ``BundleError.problems`` lists them one by one.
        """
        spec, problems = parse_manifest(obj, weights_header)
        if problems:
            raise BundleError(f"{where}: {describe(problems)}", problems)
        return spec

    def to_json(self) -> dict[str, Any]:
        """The plain dict written to ``manifest.json`` (JSON types only, schema :data:`SCHEMA_VERSION`)."""
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "producer": self.producer.to_json(),
            "created_unix": self.created_unix,
            "input": self.input.to_json(),
            "num_classes": self.num_classes,
            "classes": _list(self.classes),
            "levels": [row.to_json() for row in self.levels],
            "model": self.model,
            "switching": None if self.switching is None else [dict(s) for s in self.switching],
            "capacity": self.capacity.to_json(),
            "exit_sets": [s.to_json() for s in self.exit_sets],
            "splits": [s.to_json() for s in self.splits],
            "profiles": dict(self.profiles),
            "precision": None if self.precision is None else self.precision.to_json(),
            **({} if self.samples is None else {"samples": self.samples.to_json()}),
            "weights": self.weights.to_json(),
            "onnx": [o.to_json() for o in self.onnx],
            "files": {rel: f.to_json() for rel, f in self.files.items()},
            "integrity": None if self.integrity is None else dict(self.integrity),
            **self.extra,
        }



# --------------------------------------------------------------------------------------------
# reading a whole manifest: structure first, then the checks that span sections


def parse_manifest(obj: Any, weights_header: Mapping[str, Any] | None = None) -> tuple[Manifest | None, list[str]]:
    """The :class:`Manifest` and ``[]``, or ``None`` and every problem (what :meth:`Manifest.from_json` raises)."""
    r = _Reader()
    try:
        spec = _read_manifest(r, obj, weights_header)
    except RecursionError:  # pragma: no cover - inputs are depth-checked first; belt and braces
        r.fail("manifest", f"is nested too deeply to read (deeper than {_MAX_DEPTH} levels)")
        spec = None
    except Exception as e:  # pragma: no cover - a validator bug must still surface as a BundleError
        r.fail("manifest", f"could not be validated ({type(e).__name__}: {e}); this is a nestflex bug, please "
                           f"report it with the manifest")
        spec = None
    return (None, r.problems) if r.count else (spec, [])


def _read_manifest(r: _Reader, obj: Any, header: Mapping[str, Any] | None) -> Manifest | None:
    if not isinstance(obj, Mapping):
        r.fail("manifest", f"must be a JSON object, got {_show(obj)}")
        return None
    _walk_free_form(r, obj, "")
    obj = r.obj(obj, "manifest")
    if obj is _BAD:
        return None
    r.str_(obj.get("format"), "format", choices=(FORMAT,))
    version = r.int_(r.get(obj, "schema_version", ""), "schema_version", lo=1, hi=SCHEMA_VERSION)
    if version is _BAD:  # read the layout the keys suggest, to report what else is wrong
        version = 1 if ("exits" in obj or "flex_exits" in obj) else SCHEMA_VERSION
    g = lambda k, required=True: r.get(obj, k, "", required)
    producer = Producer._read(r, g("producer"), "producer")
    created = r.int_(g("created_unix"), "created_unix", lo=0)
    spec_input = InputSpec._read(r, g("input"), "input")
    num_classes = r.int_(g("num_classes"), "num_classes", lo=1)
    classes = r.strs(g("classes", False), "classes", null=True)
    if isinstance(num_classes, int):
        r.length(classes, "classes", num_classes, "one name per class, `num_classes`")
    raw_levels = r.seq(g("levels"), "levels")
    levels = [] if raw_levels is _BAD else [LevelRow._read(r, row, _join("levels", i), i)
                                             for i, row in enumerate(raw_levels)]
    if raw_levels is not _BAD and not raw_levels:
        r.fail("levels", "is empty; a bundle has at least one level")
    model = r.obj(g("model", False), "model", null=True)
    switching = _read_switching(r, g("switching", False))
    capacity = Capacity._read(r, g("capacity"), "capacity")

    # the exit sets, each with the path its problems are reported under
    sources: list[tuple[str, Any, str | None]] = []
    if version == 1:
        for kind, key in EXIT_SET_KEYS.items():
            if obj.get(key) is not None:
                sources.append((key, obj[key], kind))
        if "exit_sets" in obj:
            r.fail("exit_sets", "is a schema-2 key in a schema-1 manifest (schema 1 has `exits` and `flex_exits`)")
    else:
        for key in EXIT_SET_KEYS.values():
            if key in obj:
                r.fail(key, f"is a schema-1 key; schema {version} lists exit sets in `exit_sets` (with their `kind`)")
        raw_sets = r.seq(g("exit_sets", False), "exit_sets", null=True) or []
        if raw_sets is not _BAD:
            sources = [(_join("exit_sets", i), s, None) for i, s in enumerate(raw_sets)]
    exit_sets = [(p, ExitSet._read(r, s, p, kind)) for p, s, kind in sources]

    raw_splits = r.seq(g("splits", False), "splits", null=True) or []
    splits = [] if raw_splits is _BAD else [SplitPoint._read(r, s, _join("splits", i)) for i, s in enumerate(raw_splits)]
    profiles = r.obj(g("profiles", False), "profiles", null=True) or {}
    if profiles is not _BAD:
        profiles = {k: r.file(f, _join("profiles", k)) for k, f in profiles.items()}
    precision = g("precision", False)
    if precision is not None:
        precision = PrecisionPlan._read(r, precision, "precision")
    samples = g("samples", False)
    if samples is not None:
        samples = SampleSet._read(r, samples, "samples")
    weights = Weights._read(r, g("weights"), "weights")
    raw_onnx = r.seq(g("onnx", False), "onnx", null=True) or []
    onnx = [] if raw_onnx is _BAD else [OnnxFile._read(r, o, _join("onnx", i), version) for i, o in enumerate(raw_onnx)]
    raw_files = r.obj(g("files"), "files")
    files = {}
    if raw_files is not _BAD:
        for rel, meta in raw_files.items():
            if not safe_relpath(rel):
                r.fail(_join("files", rel), "is not a plain relative path inside the bundle (absolute, '..', a "
                                           "backslash or a control character); refused")
            files[rel] = FileEntry._read(r, meta, _join("files", rel))
        if WEIGHTS not in raw_files:
            r.fail("files", f"does not list {WEIGHTS}")
    integrity = r.obj(g("integrity", False), "integrity", null=True)
    if isinstance(integrity, dict):
        r.str_(r.get(integrity, "manifest_sha256", "integrity"), "integrity.manifest_sha256")

    known = set(Manifest._KEYS) | (set(EXIT_SET_KEYS.values()) if version == 1 else set())
    extra = {k: v for k, v in obj.items() if k not in known}
    # checks across sections; each runs on the sections that read cleanly, so one broken section
    # does not hide the problems of the others
    _cross_check(r, capacity, levels, [s for _, s in exit_sets], [p for p, _ in exit_sets], splits, weights, header,
                 spec_input, files, profiles, precision, onnx, switching, samples)
    if r.count:
        return None
    return Manifest(producer, spec_input, num_classes, tuple(levels), capacity, weights, classes,
                    tuple(s for _, s in exit_sets), tuple(splits), precision, profiles, samples, tuple(onnx), files,
                    model, switching, created, integrity, extra, schema_version=version)


def _read_switching(r: _Reader, v: Any) -> Any:
    v = r.seq(v, "switching", null=True)
    if v is None or v is _BAD:
        return v
    rows = []
    for i, row in enumerate(v):
        p = _join("switching", i)
        row = r.obj(row, p)
        if row is _BAD:
            continue
        r.int_(r.get(row, "from", p), _join(p, "from"), lo=0)
        r.int_(r.get(row, "to", p), _join(p, "to"), lo=0)
        r.num(r.get(row, "nested_ms", p, required=False), _join(p, "nested_ms"), lo=0, null=True)
        rows.append(row)
    return tuple(rows)


# --------------------------------------------------------------------------------------------
# checks across sections


def _cross_check(r: _Reader, cap: Capacity | None, levels: list[LevelRow | None], sets: list[ExitSet | None],
                 set_paths: list[str], splits: list[SplitPoint | None], weights: Weights | None,
                 header: Mapping[str, Any] | None, spec_input: InputSpec | None, files: Mapping[str, Any],
                 profiles: Any, precision: PrecisionPlan | None, onnx: list[OnnxFile | None],
                 switching: Any, samples: SampleSet | None = None) -> None:
    """Consistency between sections; each check runs only on sections that read cleanly."""
    table = weights.tensors if weights is not None else None
    if weights is not None and header is not None:
        _check_header(r, weights, header)
    K = cap.num_levels if cap is not None else None
    if K is not None and all(row is not None for row in levels):
        if len(levels) != K:
            r.fail("levels", f"has {len(levels)} rows, but capacity.num_levels is {K} (one row per level)")
        else:
            for k, row in enumerate(levels):
                if row.weight_bytes != cap.level_bytes[k]:
                    r.fail(f"levels[{k}].weight_bytes", f"must equal capacity.level_bytes[{k}] ({cap.level_bytes[k]}), "
                                                        f"got {_show(row.weight_bytes)}")
    if isinstance(switching, tuple) and K is not None:
        for i, row in enumerate(switching):
            for key in ("from", "to"):
                if isinstance(row.get(key), int) and not row[key] < K:
                    r.fail(f"switching[{i}].{key}", f"must be a level in [0, {K - 1}], got {_show(row[key])}")
    in_ch = spec_input.shape[0] if spec_input is not None else None
    cap_ok = cap is not None and table is not None and _check_capacity(r, cap, table, in_ch)
    # exit sets
    kinds: dict[str, str] = {}
    for path, s in zip(set_paths, sets):
        if s is None:
            continue
        if s.kind in kinds:
            r.fail(_join(path, "kind"), f"repeats kind {s.kind!r} (also {kinds[s.kind]}); a bundle holds one set per kind")
        kinds.setdefault(s.kind, path)
        if table is not None and (cap_ok or (cap is not None and s.backbone == "own")):
            _check_exit_set(r, s, path, cap, table, in_ch)
    # split points cut the capacity program
    if cap is not None:
        ops = {n.name: n.op for n in cap.program.nodes}
        names = set()
        for i, s in enumerate(splits):
            if s is None:
                continue
            p = _join("splits", i)
            if s.name in names:
                r.fail(_join(p, "name"), f"repeats split point {s.name!r}")
            names.add(s.name)
            if ops.get(s.node) in (None, "output"):
                r.fail(_join(p, "node"), f"names {s.node!r}, which is not a node of capacity.program the program can "
                                         f"be cut after")
            for j, (t, _) in enumerate(s.tensors):
                if t not in ops:
                    r.fail(f"{p}.tensors[{j}][0]", f"names {t!r}, which is not a node of capacity.program")
    # files the manifest points at are listed (and so checked) in `files`
    listed = set(files)
    refs = [(_join("profiles", k), f) for k, f in (profiles.items() if isinstance(profiles, dict) else ())]
    if precision is not None:
        refs.append(("precision.file", precision.file))
    if samples is not None:
        refs.append(("samples.file", samples.file))
    for path, s in zip(set_paths, sets):
        if s is not None:
            refs.append((_join(path, "profile"), s.profile))
            if s.calibration is not None:
                refs.append((_join(_join(path, "calibration"), "file"), s.calibration.get("file")))
    refs += [(_join(_join("onnx", i), "file"), o.file) for i, o in enumerate(onnx) if o is not None]
    for path, rel in refs:
        if isinstance(rel, str) and rel not in listed:
            r.fail(path, f"names {rel!r}, which `files` does not list (so it is neither shipped nor checked)")


def _check_header(r: _Reader, weights: Weights, header: Mapping[str, Any]) -> None:
    if not isinstance(header, Mapping):
        r.fail("weights", f"cannot be checked: the {WEIGHTS} header is not a JSON object")
        return
    body = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in weights.tensors.items():
        p = _join(_join("weights", "tensors"), name)
        got = body.get(name)
        if got is None:
            r.fail(p, f"is in the manifest but not in {WEIGHTS}")
            continue
        dtype = got.get("dtype") if isinstance(got, Mapping) else None
        shape = got.get("shape") if isinstance(got, Mapping) else None
        dtype = _SAFETENSORS_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
            r.fail(p, f"cannot be checked: {WEIGHTS} gives it no valid shape ({_show(got)})")
        elif list(shape) != list(info.shape) or dtype != info.dtype:
            r.fail(p, f"says {info.dtype}{list(info.shape)}, but {WEIGHTS} holds {dtype}{list(shape)}")
    extra = sorted(set(body) - set(weights.tensors))
    if extra:
        r.fail(_join("weights", "tensors"), f"does not list tensors {WEIGHTS} holds: {extra[:5]}"
                                            f"{f' and {len(extra) - 5} more' if len(extra) > 5 else ''}")


def _check_program_tensors(r: _Reader, prog: Program, path: str, table: Mapping[str, TensorInfo]) -> bool:
    """Every params entry names a tensor of the table, of a dtype its op can use."""
    ok = True
    for i, n in enumerate(prog.nodes):
        np_ = _join(path, i)
        entries = [("params", None, n.params)] if n.params is not None else []
        entries += [("params_per_level", k, p) for k, p in enumerate(n.params_per_level or ())]
        for key, k, params in entries:
            base = _join(np_, key) if k is None else _join(_join(np_, key), k)
            for role, t in (params or {}).items():
                info = table.get(t)
                if info is None:
                    r.fail(_join(base, role), f"names tensor {t!r}, which weights.tensors does not hold "
                                              f"(node {n.name!r})")
                    ok = False
                elif n.op != "param" and info.dtype not in _FLOATS:
                    r.fail(_join(base, role), f"names {info.dtype} tensor {t!r}; a `{n.op}` node computes "
                                              f"with floating-point weights")
                    ok = False
    # the index of an index_select is an integer tensor
    for i, n in enumerate(prog.nodes):
        if n.op == "index_select" and isinstance(n.args[1], str):
            src = prog.node(n.args[1])
            t = (src.params or {}).get("value") if src is not None else None
            info = table.get(t) if t else None
            if info is not None and (info.dtype not in _INDEX_DTYPES or len(info.shape) != 1):
                r.fail(_join(_join(_join(path, i), "args"), 1),
                       f"names param {n.args[1]!r} holding {info.dtype}{list(info.shape)}; an index is a 1-d int64 "
                       f"tensor")
                ok = False
    return ok


def _channels(prog: Program, table: Mapping[str, TensorInfo], cap: Capacity | None, level: int,
              in_ch: int | None, r: _Reader | None = None, path: str = "", label: str = "") -> dict[str, int | None]:
    """Channels (dim 1) of every node's output at ``level``, where the program determines them.

    With ``r``, also checks that conv, linear-free and BatchNorm weights fit the channels they read.
    """
    ch: dict[str, int | None] = {}

    def shape(t: str | None) -> tuple[int, ...] | None:
        if t is None or t not in table:
            return None
        return cap.region(t, level, table[t].shape) if cap is not None else table[t].shape

    for i, n in enumerate(prog.nodes):
        first = n.args[0] if n.args and isinstance(n.args[0], str) else None
        src = ch.get(first) if first is not None else None
        params = n.level_params(level)
        out: int | None = None
        if n.op == "input":
            out = in_ch
        elif n.op == "conv2d":
            w = shape(params.get("weight"))
            if w is not None and len(w) == 4:
                out = w[0]
                depthwise = n.attrs.get("depthwise")
                want = w[0] if depthwise else w[1] * n.attrs.get("groups", 1)
                if r is not None and src is not None and want != src:
                    r.fail(_join(path, i), f"(conv2d {n.name!r}) reads {src} channels{label}, but its weight "
                                           f"{'region ' if cap else ''}{list(w)} takes {want}")
        elif n.op == "linear":
            w = shape(params.get("weight"))
            out = w[0] if w is not None and len(w) == 2 else None
        elif n.op in _SAME_CHANNELS:
            out = src
            if n.op == "batch_norm" and r is not None and src is not None:
                m = shape(params.get("running_mean"))
                if m is not None and m != (src,):
                    r.fail(_join(path, i), f"(batch_norm {n.name!r}) normalises {src} channels{label}, but its "
                                           f"running_mean {'region ' if cap else ''}is {list(m)}")
        elif n.op in ("add", "sub", "mul"):
            known = [ch.get(a) for a in n.args if isinstance(a, str) and ch.get(a) is not None]
            out = known[0] if known else None
        elif n.op == "index_select":
            idx = prog.node(n.args[1]) if isinstance(n.args[1], str) else None
            t = shape((idx.params or {}).get("value") if idx is not None else None)
            out = (t[0] if t else None) if n.attrs.get("dim") == 1 else src
        elif n.op == "flatten":
            out = src if n.attrs.get("start_dim", 0) > 1 else None
        ch[n.name] = out
    return ch


def _check_capacity(r: _Reader, cap: Capacity, table: Mapping[str, TensorInfo], in_ch: int | None) -> bool:
    """Whether the capacity program can be walked at every level (what the exit-set checks rely on)."""
    K = cap.num_levels
    path = "capacity.program"
    ok = _check_program_tensors(r, cap.program, path, table)
    for i, n in enumerate(cap.program.nodes):
        if n.params_per_level is not None and len(n.params_per_level) not in (1, K):
            r.fail(f"{path}[{i}].params_per_level", f"has {len(n.params_per_level)} entries, expected 1 or {K} "
                                                     f"(one per level, capacity.num_levels)")
            ok = False
    # regions: each per-level shape fits inside its tensor
    for name, per in cap.regions.items():
        p = _join("capacity.regions", name)
        info = table.get(name)
        if info is None:
            r.fail(p, f"names tensor {name!r}, which weights.tensors does not hold")
            ok = False
            continue
        for k, s in enumerate(per):
            if s is None:
                continue
            if len(s) != len(info.shape) or any(a > b for a, b in zip(s, info.shape)):
                r.fail(_join(p, k), f"must be a shape of rank {len(info.shape)} inside the tensor's "
                                    f"{list(info.shape)} (each 0 <= r <= dim), got {_show(list(s))}")
                ok = False
    if not ok:
        return False
    # each level reads only tensors it has a region for
    for k in range(K):
        for i, n in enumerate(cap.program.nodes):
            for t in n.level_params(k).values():
                per = cap.regions.get(t)
                if per is not None and per[k] is None:
                    r.fail(_join(_join(path, i), "params"), f"(node {n.name!r}) reads {t!r} at level {k}, but "
                                                            f"capacity.regions gives that level no region of it")
                    ok = False
    if not ok:
        return False
    # level_bytes: what the runtime keeps resident at each level
    names = cap.program.tensor_names()
    for k in range(K):
        total = 0
        for t in names:
            s = cap.region(t, k, table[t].shape)
            total += 0 if s is None else math.prod(s) * DTYPES[table[t].dtype]
        if total != cap.level_bytes[k]:
            r.fail(f"capacity.level_bytes[{k}]", f"must be the bytes level {k} reads ({total}, from the program's "
                                                 f"tensors and regions), got {_show(cap.level_bytes[k])}")
    for k in range(K):
        _channels(cap.program, table, cap, k, in_ch, r, path, f" at level {k}")
    return True  # wrong byte counts or channels are reported, but the program can still be walked


def _check_exit_set(r: _Reader, s: ExitSet, path: str, cap: Capacity, table: Mapping[str, TensorInfo],
                    in_ch: int | None) -> None:
    K = cap.num_levels
    if s.backbone == "shared":
        if s.level is not None and s.level != K - 1:
            r.fail(_join(path, "level"), f"must be {K - 1} (the largest level: a shared backbone runs there), "
                                         f"got {_show(s.level)}")
        prog, prog_path, level, region_cap = cap.program, "capacity.program", K - 1, cap
    else:
        prog, prog_path, level, region_cap = s.program, _join(path, "program"), 0, None
        if not _check_program_tensors(r, prog, prog_path, table):
            return
    order = {n.name: i for i, n in enumerate(prog.nodes)}
    last = -1
    for j, tap in enumerate(s.taps):
        p = _join(_join(path, "taps"), j)
        pos = order.get(tap)
        if pos is None or prog.nodes[pos].op in ("output", "param"):
            r.fail(p, f"names {tap!r}, which is not a node of the backbone program ({prog_path}) a head can read")
        elif pos <= last:
            r.fail(p, f"names {tap!r}, which does not come after the previous tap; taps are in execution order")
        else:
            last = pos
    ch = _channels(prog, table, region_cap, level, in_ch)
    for j, head in enumerate(s.heads):
        hp = _join(_join(path, "heads"), j)
        if not _check_program_tensors(r, head.program, _join(hp, "program"), table):
            continue
        tapped = ch.get(s.taps[j]) if j < len(s.taps) else None
        if head.tap_channels is not None and tapped is not None and head.tap_channels != tapped:
            r.fail(_join(hp, "tap_channels"), f"must be the channels of tap {s.taps[j]!r} ({tapped}), "
                                              f"got {_show(head.tap_channels)}")
        if head.filters is not None:
            t = head.index_tensor()
            info = table.get(t) if t else None
            if info is not None and list(info.shape) != [len(head.filters)]:
                r.fail(_join(hp, "filters"), f"lists {len(head.filters)} filters, but the index tensor {t!r} holds "
                                             f"{list(info.shape)}")
        _channels(head.program, table, None, 0, tapped, r, _join(hp, "program"), "")


# --------------------------------------------------------------------------------------------
# files


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its ``integrity`` entry.

    Stored in ``manifest["integrity"]["manifest_sha256"]`` so an edited manifest is detected. It
    is a corruption check, not a signature: someone who edits the manifest on purpose can
    recompute it.

    Raises:
        ValueError: the manifest holds NaN or Infinity (JSON has neither); RecursionError: nested too deep.
    """
    body = {k: v for k, v in manifest.items() if k != "integrity"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# strict JSON: what load parses (manifest.json, the safetensors header) is parsed with limits

#: JSON nested deeper than this is refused before it is parsed: nestflex writes about 8 levels, and
#: Python's json recurses once per level (a deep document would otherwise be a RecursionError)
MAX_JSON_DEPTH = 64
#: at most this many ``[``, ``{``, ``,`` and ``:`` outside strings (an upper bound on the containers,
#: keys and values; quotes and those characters anywhere at most 4x this): each costs up to ~70 bytes
#: of Python objects once parsed, so this bounds a document's memory to ~20 MB beyond its text (a
#: VGG-16 x0.5 manifest has ~9,000; a ResNet-152 one ~50,000 by estimate)
MAX_JSON_ITEMS = 2**18
#: characters of one number literal (an int64 has 19 digits, a float64 ~25 characters with its
#: exponent); longer literals are refused before Python converts them (a 5,000-digit int is a
#: ValueError in int(), a 10^6-digit one takes seconds)
MAX_NUMBER_CHARS = 100

# One token per match: a JSON string (or an unterminated one, up to the end of the text), which
# yields b"" (group 1 unset), or a structural character, which yields itself. A string always
# matches from its opening quote, so one left-to-right pass in C reads the structure in linear
# time; the possessive loops keep no backtracking state (with plain `*`, 8 MB of escapes took ~1
# GB in `re`), and findall's items are shared objects (b"" and one-byte bytes): 8 bytes per token.
_JSON_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"?|([\[\]{},:])', re.DOTALL)
_DEPTH_STEP = {b"[": 1, b"{": 1, b"]": -1, b"}": -1}


class _JSONLimit(ValueError):
    """A limit of :func:`parse_json` (kept apart from json's own syntax errors in the message)."""


def _number(kind: type) -> Any:
    def parse(literal: str) -> Any:
        if len(literal) > MAX_NUMBER_CHARS:
            raise _JSONLimit(f"it holds a number literal of {len(literal):,} characters ({literal[:20]}...), above "
                             f"the {MAX_NUMBER_CHARS}-character limit")
        value = kind(literal)
        if not math.isfinite(value):  # 1e999 parses as inf: Infinity spelled as a number
            raise _JSONLimit(f"it holds the number {literal}, beyond float64 (it would read as {value})")
        return value

    return parse


_parse_int, _parse_float = _number(int), _number(float)


def _constant(name: str) -> Any:
    raise _JSONLimit(f"it holds {name}, which JSON does not have (no NaN or Infinity)")


def parse_json(data: bytes, what: str, hint: str) -> Any:
    """``json.loads`` with limits, for every JSON document :func:`nestflex.deploy.load` reads.

    Refused: text that is not UTF-8; nesting deeper than :data:`MAX_JSON_DEPTH` (checked on the
    bytes before parsing, so no RecursionError); more than :data:`MAX_JSON_ITEMS` containers, keys
    and values; a number literal longer than :data:`MAX_NUMBER_CHARS` or beyond float64;
    ``NaN``, ``Infinity``, ``-Infinity``. The caller bounds the size of ``data``.

    Args:
        data: the document's bytes.
        what: the file, for the message (``"bundle 'm.nfx': manifest.json"``).
        hint: the fix, appended as ``HINT: ...``.

    Raises:
        BundleError: ``{what} is not valid JSON (...)`` or ``{what} exceeds a JSON limit: ...``, with the hint.

    Example:
        >>> parse_json(b'{"a": [1, 2.5]}', "x.json", "fix it")
        {'a': [1, 2.5]}
        >>> parse_json(b'{"a": NaN}', "x.json", "fix it")
        Traceback (most recent call last):
        nestflex.deploy.bundle.schema.BundleError: x.json exceeds a JSON limit: it holds NaN, which JSON does not have (no NaN or Infinity). HINT: fix it
    """
    try:
        # quotes and structural characters anywhere: an upper bound on the tokens scanned below, so
        # the scan's list stays small (a nestflex manifest has about 2 per key or value)
        marks = sum(data.count(c) for c in (b'"', b"[", b"]", b"{", b"}", b",", b":"))
        if marks > 4 * MAX_JSON_ITEMS:
            raise _JSONLimit(f"it has {marks:,} quotes, brackets, commas and colons, above the limit of "
                             f"{4 * MAX_JSON_ITEMS:,} (4 per key or value)")
        # the structure outside strings (brackets, commas and colons inside strings are text)
        tokens = _JSON_TOKEN.findall(data)
        count = tokens.count  # no b"".join: it costs an 80-byte buffer per item
        openers, closers = count(b"[") + count(b"{"), count(b"]") + count(b"}")
        items = openers + count(b",") + count(b":")
        if items > MAX_JSON_ITEMS:
            raise _JSONLimit(f"it has {items:,} containers, keys and values, above the limit of {MAX_JSON_ITEMS:,}")
        if openers != closers:
            raise ValueError(f"its brackets do not balance: {openers:,} opened, {closers:,} closed outside strings")
        depth = max(accumulate(map(_DEPTH_STEP.get, tokens, repeat(0, len(tokens)))), default=0)
        del tokens
        if depth > MAX_JSON_DEPTH:
            raise _JSONLimit(f"it nests {depth} levels deep, above the limit of {MAX_JSON_DEPTH}")
        return json.loads(data.decode("utf-8"), parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_constant)
    except _JSONLimit as e:
        raise BundleError(f"{what} exceeds a JSON limit: {e}. HINT: {hint}") from None
    except RecursionError:  # pragma: no cover - the depth scan refuses first; belt and braces
        raise BundleError(f"{what} is nested too deeply to parse. HINT: {hint}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise BundleError(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:200]}). HINT: {hint}") from None


#: the largest safetensors header :func:`read_safetensors_header` reads (a VGG-16 bundle's is ~10 KB);
#: read at call time, so a program may raise it before :func:`nestflex.deploy.load`
MAX_HEADER_BYTES = 16 * 2**20
_WEIGHTS_HINT = "the weights are corrupt; export the bundle again"


def read_safetensors_header(path: Any) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data_offsets), torch-free.

    The header is parsed by :func:`parse_json` (depth, size, number limits; no NaN/Infinity) and
    its layout checked as the safetensors reader will check it when the runtime opens the file
    (:func:`_layout_problem`), so a file that passes here does not fail later with a ``SafetensorError``.

    Raises:
        BundleError: the file is not a safetensors file (or cannot be read); ``problems`` holds
            the one reason, without the path.
    """
    def refuse(problem: str) -> BundleError:
        return BundleError(f"{str(path)!r} is not a safetensors file ({problem}). HINT: {_WEIGHTS_HINT}", [problem])

    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            size = f.seek(0, 2)
            if n <= 0 or n > size - 8:
                raise refuse(f"header length {n} does not fit a {size}-byte file")
            if n > MAX_HEADER_BYTES:  # read whole before parsing: bound it (safetensors itself caps at 100 MB)
                raise refuse(f"header of {n} bytes is above the {MAX_HEADER_BYTES}-byte limit")
            f.seek(8)
            data = f.read(n)
    except OSError as e:
        raise refuse(f"cannot be read: {e.strerror or e}") from None
    try:
        header = parse_json(data, "its header", _WEIGHTS_HINT)
    except BundleError as e:
        raise refuse(str(e).split(". HINT: ")[0]) from None
    problem = _layout_problem(header, size - 8 - n)
    if problem is not None:
        raise refuse(problem)
    return header


#: bytes per element of the safetensors dtypes a bundle may hold (others are refused by the schema)
_SAFETENSORS_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                         "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E5M2": 1, "F8_E4M3": 1}


def _layout_problem(header: Any, data_bytes: int) -> str | None:
    """Why ``header`` does not describe ``data_bytes`` of tensor data as safetensors requires, or ``None``.

    The rules of the safetensors reader: every entry has a known dtype, a shape of non-negative
    ints and ``data_offsets`` ``[begin, end]`` holding exactly its elements; the entries tile the
    data from 0 to its end without gaps or overlaps; ``__metadata__`` maps strings to strings.
    """
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return "`__metadata__` is not an object of strings"
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shown = name if len(name) <= 80 else name[:77] + "..."
        if not isinstance(entry, dict):
            return f"tensor {shown!r} is not described by an object"
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _SAFETENSORS_ITEMSIZE:
            return f"tensor {shown!r} has dtype {_show(dtype, 20)}, not one of {', '.join(_SAFETENSORS_ITEMSIZE)}"
        ints = (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in [*shape, *offsets]))
        if not ints:
            return (f"tensor {shown!r} needs a shape and data_offsets of non-negative ints, got {_show(shape, 40)} "
                    f"and {_show(offsets, 40)}")
        numel = 0 if 0 in shape else 1
        for d in shape:  # stop early: the product of a forged shape could have millions of digits
            numel *= d
            if numel > data_bytes:
                break
        if offsets[1] - offsets[0] != numel * _SAFETENSORS_ITEMSIZE[dtype]:
            return (f"tensor {shown!r} is {dtype}{shape} but data_offsets {offsets} span {offsets[1] - offsets[0]} "
                    f"bytes")
        spans.append((offsets[0], offsets[1], shown))
    end = 0
    for begin, stop, shown in sorted(spans):
        if begin != end:
            return f"tensor {shown!r} starts at byte {begin} of the data, expected {end} (a gap or an overlap)"
        end = stop
    if end != data_bytes:
        return f"the tensors cover {end} bytes of data, the file holds {data_bytes}"
    return None
