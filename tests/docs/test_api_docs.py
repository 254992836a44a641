"""Every public name has a docstring that documents its arguments (issue 39).

Public means exported by a package's ``__all__``; the API reference (mkdocs, docs/api/) is built
from these docstrings. Arguments are documented in a Google-style ``Args:`` section (or
``Attributes:`` for dataclass fields, which are the constructor's arguments); ``*args`` and
``**kwargs`` count as documented when the section names them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re

import pytest

import nestflex

SECTIONS = ("Args", "Arguments", "Parameters", "Attributes")
_HEADING = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^\s{4}(\*{0,2}\w+)(?:\s*\([^)]*\))?:")


def _packages() -> list[str]:
    names = ["nestflex"]
    for info in pkgutil.walk_packages(nestflex.__path__, "nestflex."):
        if info.ispkg:
            names.append(info.name)
    return names


def documented_arguments(doc: str) -> set[str]:
    """The names listed in a docstring's argument sections (Google style, after getdoc)."""
    names, inside = set(), False
    for line in doc.splitlines():
        heading = _HEADING.match(line)
        if heading:
            inside = heading.group(1) in SECTIONS
            continue
        if inside:
            if line and not line.startswith(" "):
                inside = False
                continue
            entry = _ENTRY.match(line)
            if entry:
                names.add(entry.group(1).lstrip("*"))
    return names


def _arguments(obj) -> tuple[list[str], str]:
    """(the arguments a user passes, the docstring text that must document them)."""
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        if init is None and not dataclasses.is_dataclass(obj):
            # the constructor is inherited (an exception type, a subclass that adds methods):
            # the parent documents its arguments
            return [], doc
        target = obj
        if init is not None and init.__doc__:
            doc += "\n" + inspect.getdoc(init)
    else:
        target = obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return [], doc
    names = [
        p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and not p.name.startswith("_")
    ]
    return names, doc


def _public_callables():
    seen = set()
    for package in _packages():
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{package}.{name}", obj


PUBLIC = sorted(_public_callables(), key=lambda item: item[0])


def test_the_walk_sees_every_package():
    # a package that fails to import would silently drop its names from the check below
    assert len(PUBLIC) > 250
    assert {"nestflex.deploy", "nestflex.exits", "nestflex.serve", "nestflex.testing"} <= set(
        _packages()
    )


@pytest.mark.parametrize("qualname,obj", PUBLIC, ids=[name for name, _ in PUBLIC])
def test_public_name_documents_its_arguments(qualname, obj):
    arguments, doc = _arguments(obj)
    assert doc.strip(), f"{qualname} has no docstring"
    missing = [a for a in arguments if a not in documented_arguments(doc)]
    assert not missing, f"{qualname}: arguments {missing} are not in its Args:/Attributes: section"


def test_documented_arguments_reads_google_sections():
    doc = inspect.cleandoc(
        """Summary.

        Args:
            x: first.
            y (int): second,
                continued.
            **kwargs: the rest.

        Returns:
            z: not an argument.
        """
    )
    assert documented_arguments(doc) == {"x", "y", "kwargs"}
