"""The link emulator's error, and the argument checks that raise it."""

from __future__ import annotations

import math

from nestflex.errors import NestflexError

__all__ = ["LinkError", "is_finite", "check_number"]


class LinkError(NestflexError, ValueError):
    """A link argument is out of range, or a bandwidth trace file is malformed."""


def is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_number(name: str, value: object, *, low: float = 0.0, hint: str = "") -> float:
    """``value`` as a finite float >= ``low``; a :class:`LinkError` naming ``name`` otherwise."""
    if not is_finite(value) or value < low:
        raise LinkError(f"`{name}` must be a finite number >= {low:g}, got {value!r}."
                        + (f" HINT: {hint}" if hint else ""))
    return float(value)
