"""Strict JSON: every JSON document :func:`nestflex.deploy.load` reads (``manifest.json``, the
safetensors header) is parsed by :func:`parse_json`, with limits on nesting, size and number literals
checked before Python's parser sees the text.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate, repeat
from typing import Any

from nestflex.deploy.bundle.errors import BundleError

__all__ = [
    "parse_json",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "MAX_NUMBER_CHARS",
]

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

    Examples:
        >>> parse_json(b'{"a": [1, 2.5]}', "x.json", "fix it")
        {'a': [1, 2.5]}
        >>> parse_json(b'{"a": NaN}', "x.json", "fix it")
        Traceback (most recent call last):
        nestflex.deploy.bundle.errors.BundleError: x.json exceeds a JSON limit: it holds NaN, which JSON does not have (no NaN or Infinity). HINT: fix it
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
