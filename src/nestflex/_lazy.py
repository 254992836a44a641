"""Names a package exports without importing their modules until first use (PEP 562).

The packages whose public names live in heavy modules (Lightning callbacks and data modules, the
deploy runtime's parts) share this one loader: ``__getattr__, __dir__ = lazy_exports(__name__,
table)``. Their ``__all__`` still lists every name and a ``TYPE_CHECKING`` block imports them, so
type checkers and the API reference see them statically.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` that import ``homes[name]`` when ``name`` is first read.

    Args:
        package: the importing package's ``__name__``.
        homes: exported name -> the module that defines it.

    Returns:
        ``(__getattr__, __dir__)`` for the package's namespace. The first lookup of a name stores
        the value in the package, so later lookups are plain attribute reads.

    Examples:
        >>> import types, sys
        >>> sys.modules["_demo"] = types.ModuleType("_demo")
        >>> getattr_, dir_ = lazy_exports("_demo", {"dumps": "json"})
        >>> getattr_("dumps").__name__, "dumps" in dir_()
        ('dumps', True)
    """
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
