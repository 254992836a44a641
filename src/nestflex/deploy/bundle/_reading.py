"""Reading JSON into records: the ``r.`` reader, whose typed getters record a problem (path, value,
expectation) instead of raising, and the helpers every record of the manifest shares (:class:`_Record`,
``_join`` for paths, ``_show`` for values, ``_extra`` for unknown keys, :func:`describe` for the message).

Private to :mod:`nestflex.deploy.bundle`: the record modules and the loader import from here.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from nestflex.deploy.bundle.constants import MANIFEST
from nestflex.deploy.bundle.errors import BundleError

#: free-form JSON (provenance, calibration summaries) deeper than this is refused: nothing nestflex
#: writes comes close, and deeper values make printing, hashing or comparing them recurse too far
_MAX_DEPTH = 32
_SHOWN_PROBLEMS = 25
_HINT = ("HINT: the manifest was edited by hand or written by a broken exporter; export the bundle again "
         "(nestflex.export.export_bundle)")


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
# the base of every section record


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
