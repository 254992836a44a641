"""The bundle writer (training side): one self-describing ``.nfx`` directory per model.

:func:`export_bundle` writes a multi-capacity (or plain) network, its exits and its profiles as
``manifest.json`` + ``weights.safetensors`` (every tensor once, nested order) + ONNX graphs +
profile JSON; :class:`BundleExporter` is the Lightning callback that does it at the end of
``fit``. The schema and the loader live on the deploy side (:mod:`nestflex.deploy.bundle`): this
package imports them, never the reverse. docs/deploy.md is the user guide.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nestflex.export._program import ExportError
from nestflex.export.bundle import BUNDLE_SUFFIX, export_bundle

if TYPE_CHECKING:  # the lazy names below, for type checkers, IDEs and the API reference (read statically)
    from nestflex.export.callback import BundleExporter

__all__ = ["ExportError", "BUNDLE_SUFFIX", "export_bundle", "BundleExporter"]


def __getattr__(name: str) -> Any:
    # the callback imports Lightning: loaded on first use so export_bundle needs torch alone
    if name == "BundleExporter":
        value = importlib.import_module("nestflex.export.callback").BundleExporter
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nestflex.export' has no attribute {name!r}")
