"""Finding a dataset's files on disk: the one search behind the CIFAR-10 and MNIST readers.

A reader lists the folders a dataset may sit in (``data_dir`` itself, ``raw/``, the archive's own
folder name) and says which required files a folder holds; this module picks the first folder
that holds them all, or names the missing files of the folder that holds the most, so a partial
copy is reported as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from nestflex.errors import DataError

__all__ = ["find_dir", "require_dir"]

Present = Callable[[Path], set[str]]


def find_dir(candidates: Sequence[Path], present: Present, required: Sequence[str]) -> Path | None:
    """The first of ``candidates`` whose ``present(folder)`` holds every name in ``required``."""
    for cand in candidates:
        if set(required) <= present(cand):
            return cand
    return None


def require_dir(root: Path, candidates: Sequence[Path], present: Present, required: Sequence[str], *,
                what: str, expected: str, hint: str) -> Path:
    """Like :func:`find_dir`, but raise :class:`~nestflex.errors.DataError` naming ``root``, the
    missing files of the best candidate, what was expected and ``hint``."""
    found = find_dir(candidates, present, required)
    if found is not None:
        return found
    if not root.is_dir():
        raise DataError(f"{what} directory {root} does not exist (expected {expected} in it). {hint}")
    best = max(candidates, key=lambda c: len(present(c) & set(required)))
    have = present(best)
    missing = [f for f in required if f not in have]
    raise DataError(f"{what} not found in {root}: {best} lacks {', '.join(missing)} (expected {expected}). {hint}")
