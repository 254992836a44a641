"""The import graph of the ``nestflex`` package, read from the source (no module is imported).

One node per module (a package is its ``__init__``); an edge per import of another nestflex
module at any depth: top level, function bodies, ``importlib.import_module("nestflex...")`` and
the name -> module tables of lazy (PEP 562) package ``__init__`` files. Imports under
``if TYPE_CHECKING:`` are not edges: they never run.

``from pkg import name`` is an edge to what ``name`` resolves to: the submodule ``pkg.name`` if
there is one, else the module ``pkg``'s ``__init__`` takes it from (following re-exports and lazy
tables), else ``pkg`` itself. A module that takes a name through its own package's re-exports
therefore depends on the module that defines it, not on every module the ``__init__`` imports.
Importing ``a.b.c`` also runs ``a`` and ``a.b``; those implied parent imports are not edges (a
package ``__init__`` that imports its own submodules is not a circle).

Used by tests/test_layout.py (the whole package) and tests/deploy/test_layout.py (the deploy layers).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Edge:
    """One import of ``target`` by ``source`` (``line`` in ``source``'s file)."""

    source: str
    target: str
    line: int
    text: str  # the import statement (or the lazy table entry) as written


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _walk(tree: ast.AST):
    """Every node of ``tree`` except what sits under ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


class ImportGraph:
    """The import graph of every module under ``src/<root>``."""

    def __init__(self, root: str = "nestflex", src: Path = SRC) -> None:
        self.src = src
        self.files: dict[str, Path] = {module_name(p, src): p for p in sorted((src / root).rglob("*.py"))}
        self._trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in self.files.items()}

    # ------------------------------------------------------------------ names
    def is_package(self, module: str) -> bool:
        return self.files.get(module, Path()).name == "__init__.py"

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        base = module.split(".") if self.is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    @cached_property
    def _homes(self) -> dict[str, dict[str, str]]:
        """Per package ``__init__``: the module each name it exports comes from (re-exports, the
        ``TYPE_CHECKING`` block included, and lazy tables), as written, not yet resolved further."""
        homes: dict[str, dict[str, str]] = {}
        for m, tree in self._trees.items():
            if not self.is_package(m):
                continue
            table: dict[str, str] = {}
            for node in ast.walk(tree):  # TYPE_CHECKING too: it says where a lazy name lives
                if isinstance(node, ast.ImportFrom):
                    origin = self._absolute(m, node)
                    for a in node.names:
                        table[a.asname or a.name] = origin
                elif isinstance(node, ast.Dict):
                    for k, v in zip(node.keys, node.values):
                        if (isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant)
                                and isinstance(v.value, str) and v.value in self.files):
                            table.setdefault(k.value, v.value)
            homes[m] = table
        return homes

    def resolve(self, module: str, name: str, _seen: frozenset[str] = frozenset()) -> str:
        """The module that ``from module import name`` depends on."""
        if f"{module}.{name}" in self.files:
            return f"{module}.{name}"
        origin = self._homes.get(module, {}).get(name)
        if origin is None or origin not in self.files or origin in _seen | {module}:
            return module
        return self.resolve(origin, name, _seen | {module}) if self.is_package(origin) else origin

    # ------------------------------------------------------------------ edges
    def _edges_of(self, module: str) -> list[Edge]:
        tree = self._trees[module]
        lines = self.files[module].read_text(encoding="utf-8").splitlines()
        out: list[Edge] = []

        def add(target: str, node: ast.AST) -> None:
            if target in self.files and target != module:
                out.append(Edge(module, target, node.lineno, lines[node.lineno - 1].strip()))

        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    # `import a.b.c` binds `a` and runs a.b.c: the edge is the deepest known module
                    parts = a.name.split(".")
                    known = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in self.files]
                    if known:
                        add(known[0], node)
            elif isinstance(node, ast.ImportFrom):
                origin = self._absolute(module, node)
                if origin not in self.files:
                    continue
                for a in node.names:
                    add(origin if a.name == "*" else self.resolve(origin, a.name), node)
            elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                add(node.args[0].value, node)
        if self.is_package(module):  # a lazy table's modules are imported by its __getattr__
            for node in ast.walk(tree):
                if isinstance(node, ast.Dict) and not _under_type_checking(tree, node):
                    for v in node.values:
                        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in self.files:
                            add(v.value, v)
        return out

    @cached_property
    def edges(self) -> dict[str, list[Edge]]:
        return {m: self._edges_of(m) for m in self.files}

    def targets(self, module: str) -> set[str]:
        return {e.target for e in self.edges[module]}

    # ------------------------------------------------------------------ circles
    def cycles(self) -> list[list[str]]:
        """Every strongly connected component of more than one module (Tarjan), each sorted."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on: set[str] = set()
        stack: list[str] = []
        out: list[list[str]] = []
        counter = 0

        def connect(v: str) -> None:  # iterative: deep chains must not hit the recursion limit
            nonlocal counter
            work = [(v, iter(sorted(self.targets(v))))]
            index[v] = low[v] = counter
            counter += 1
            stack.append(v)
            on.add(v)
            while work:
                node, it = work[-1]
                advanced = False
                for w in it:
                    if w not in index:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(sorted(self.targets(w)))))
                        advanced = True
                        break
                    if w in on:
                        low[node] = min(low[node], index[w])
                if advanced:
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

        for m in sorted(self.files):
            if m not in index:
                connect(m)
        return sorted(out)

    def describe(self, component: list[str]) -> str:
        """The imports inside one circle, one per line: ``module:line  statement -> target``."""
        inside = set(component)
        rows = [f"  {e.source}:{e.line}  {e.text}  -> {e.target}"
                for m in component for e in self.edges[m] if e.target in inside]
        return "circle among " + ", ".join(component) + ":\n" + "\n".join(rows)


def _under_type_checking(tree: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        if _type_checking(node) and any(target is n for child in node.body for n in ast.walk(child)):
            return True
    return False
