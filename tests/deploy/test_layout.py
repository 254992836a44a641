"""The deploy package's layout: imports point down the layers, and no module imports back into one
that imports it, function-level imports included (DESIGN.md, "Dependency direction")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import ImportGraph

#: the package's imports, function-level ones included (tests/import_graph.py says how they are read)
IMPORTS = ImportGraph()

#: bottom to top; a module may import its own layer (without a cycle) and the ones below
LAYERS: list[tuple[str, ...]] = [
    ("nestflex.errors", "nestflex._io", "nestflex._lazy", "nestflex.deploy._registry", "nestflex.deploy._arrays",
     "nestflex.deploy._memory",
     "nestflex.deploy.timing", "nestflex.deploy.exits", "nestflex.deploy.codec"),
    ("nestflex.deploy.onnxgraph",),
    ("nestflex.deploy.bundle",),
    ("nestflex.deploy.operating_points",),  # read from a bundle's exit calibration
    ("nestflex.deploy.scheduler",),
    ("nestflex.deploy.backends",),
    ("nestflex.deploy.runtime",),
    ("nestflex.deploy.profiler",),
    ("nestflex.deploy._engine_apps",),  # what the engine keeps per app, and measures when it joins
    ("nestflex.deploy._engine_plan",),  # the engine's decisions, pure functions of its apps
    # the engine, the split runtime, and the engine's split apps and joint planner (they use both)
    ("nestflex.deploy.engine", "nestflex.deploy.split", "nestflex.deploy._engine_split",
     "nestflex.deploy._engine_joint"),
    ("nestflex.deploy.tune",),
    ("nestflex.deploy",),  # the package's __init__: the public API, above every part
    ("nestflex.serve",),
    ("nestflex.cli", "nestflex.__main__"),
    ("nestflex.testing",),
]


def _modules() -> dict[str, Path]:
    roots = ("nestflex.deploy", "nestflex.serve", "nestflex.testing")
    return {m: p for m, p in IMPORTS.files.items()
            if m in ("nestflex.cli", "nestflex.__main__") or any(m == r or m.startswith(r + ".") for r in roots)}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no layer: add it to LAYERS"
    return rank


MODULES = _modules()
GRAPH = {m: IMPORTS.targets(m) for m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    up = sorted(t for t in GRAPH[module] if _known_layer(t) and _layer(t) > _layer(module))
    assert not up, f"{module} (layer {_layer(module)}) imports {up} from a layer above it"


def _known_layer(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for prefixes in LAYERS for p in prefixes)


def test_no_import_cycles():
    """No circle through these modules (tests/test_layout.py checks the whole package)."""
    cycles = [c for c in IMPORTS.cycles() if set(c) & set(MODULES)]
    assert not cycles, "\n\n".join(IMPORTS.describe(c) for c in cycles)


def test_the_layer_table_knows_every_module():
    assert all(_known_layer(m) for m in MODULES), sorted(m for m in MODULES if not _known_layer(m))
