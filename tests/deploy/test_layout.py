"""The deploy package's layout: imports point down the layers, and no module imports back into one
that imports it, function-level imports included (DESIGN.md, "Dependency direction")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: bottom to top; a module may import its own layer (without a cycle) and the ones below
LAYERS: list[tuple[str, ...]] = [
    ("nestflex.errors", "nestflex._io", "nestflex.deploy._registry", "nestflex.deploy._arrays",
     "nestflex.deploy._memory",
     "nestflex.deploy.timing", "nestflex.deploy.exits", "nestflex.deploy.codec"),
    ("nestflex.deploy.onnxgraph",),
    ("nestflex.deploy.bundle",),
    ("nestflex.deploy.scheduler",),
    ("nestflex.deploy.backends",),
    ("nestflex.deploy.runtime",),
    ("nestflex.deploy.profiler",),
    ("nestflex.deploy.engine", "nestflex.deploy.split"),
    ("nestflex.deploy.tune",),
    ("nestflex.deploy",),  # the package's __init__: the public API, above every part
    ("nestflex.serve",),
    ("nestflex.cli", "nestflex.__main__"),
    ("nestflex.testing",),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    roots = [SRC / "nestflex" / "deploy", SRC / "nestflex" / "serve", SRC / "nestflex" / "testing"]
    files = [p for r in roots for p in r.rglob("*.py")] + [SRC / "nestflex" / "cli.py", SRC / "nestflex" / "__main__.py"]
    return {_module_name(p): p for p in files}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every nestflex module ``path`` imports, at any depth (function bodies too, not ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m.startswith("nestflex")}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no layer: add it to LAYERS"
    return rank


MODULES = _modules()
GRAPH = {m: _imports(p, set(MODULES)) for m, p in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    up = sorted(t for t in GRAPH[module] if _known_layer(t) and _layer(t) > _layer(module))
    assert not up, f"{module} (layer {_layer(module)}) imports {up} from a layer above it"


def _known_layer(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for prefixes in LAYERS for p in prefixes)


def test_no_import_cycles():
    """Depth-first search for a cycle among the modules (a package counts as its __init__)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if t not in MODULES:
                continue
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (cycle := walk(t)):
                return cycle
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(MODULES):
        if m not in state and (cycle := walk(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_layer_table_knows_every_module():
    assert all(_known_layer(m) for m in MODULES), sorted(m for m in MODULES if not _known_layer(m))
