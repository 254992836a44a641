"""The error of the bundle format: :class:`BundleError`, raised for every problem a bundle can have."""

from __future__ import annotations

from typing import Sequence

from nestflex.errors import NestflexError

__all__ = [
    "BundleError",
]


class BundleError(NestflexError, ValueError):
    """A bundle is missing, corrupt, tampered with, of an unknown version, or used wrongly.

    Args:
        message: what is wrong, with a ``HINT:`` where one helps.
        problems: every problem found, one line each, when the loader collected several.

    Attributes:
        problems: every problem found, one line each (``()`` for a single-cause error).
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems)
