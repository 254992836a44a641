"""The whole package's layout (issue 39): no import circle among nestflex's modules, function-level
imports included, and no source file a newcomer cannot read in one sitting (DESIGN.md, "Dependency
direction"; the deploy layers themselves are tests/deploy/test_layout.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import SRC, ImportGraph

#: longest source file, in lines
MAX_LINES = 800


def test_no_import_circle_in_the_package():
    graph = ImportGraph()
    circles = graph.cycles()
    assert not circles, "\n\n".join(graph.describe(c) for c in circles)


def test_no_source_file_over_the_line_limit():
    long = {str(p.relative_to(SRC)): n for p in sorted((SRC / "nestflex").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by concern): {long}"


# ---------------------------------------------------------------------------------------------
# the checker itself, on a small package written for the test


def _package(root: Path, files: dict[str, str]) -> ImportGraph:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ImportGraph("pkg", src=root)


def test_a_function_level_import_closes_a_circle(tmp_path):
    graph = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import f\n",
        "pkg/b.py": "def f():\n    from pkg import a\n    return a\n",
    })
    assert graph.cycles() == [["pkg.a", "pkg.b"]]
    assert "pkg.b:2  from pkg import a  -> pkg.a" in graph.describe(["pkg.a", "pkg.b"])


def test_a_name_taken_through_the_package_init_is_an_edge_to_its_home(tmp_path):
    graph = _package(tmp_path, {
        "pkg/__init__.py": "from pkg.core import thing\nfrom pkg.user import use\n",
        "pkg/core.py": "thing = 1\n",
        "pkg/user.py": "from pkg import thing\nfrom . import core\n\ndef use():\n    return thing\n",
        "pkg/lazy/__init__.py": ("import importlib\n_HOME = {'late': 'pkg.lazy.late'}\n\n"
                                 "def __getattr__(name):\n    return importlib.import_module(_HOME[name])\n"),
        "pkg/lazy/late.py": "from pkg.lazy import late_helper\n",
    })
    assert graph.targets("pkg.user") == {"pkg.core"}  # not pkg: its __init__ imports pkg.user back
    assert graph.targets("pkg.lazy") == {"pkg.lazy.late"}
    assert graph.targets("pkg.lazy.late") == {"pkg.lazy"}  # a name the table does not know: the __init__
    assert graph.cycles() == [["pkg.lazy", "pkg.lazy.late"]]


def test_type_checking_imports_are_not_edges(tmp_path):
    graph = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg/b.py": "from pkg.a import TYPE_CHECKING\n",
    })
    assert graph.cycles() == []


@pytest.mark.parametrize("statement", ["import pkg.b", "import pkg.b as b", "from pkg import b",
                                       "from .b import x", "from . import b"])
def test_every_import_form_is_seen(tmp_path, statement):
    graph = _package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": statement + "\n", "pkg/b.py": "x = 1\n"})
    assert graph.targets("pkg.a") == {"pkg.b"}
