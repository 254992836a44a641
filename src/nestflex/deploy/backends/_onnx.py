"""The ``onnx`` package, for what edits ONNX graphs (int8 and mixed-precision quantisation, padded
widths, the fused early-exit graph, layer names): optional, the ``nestflex[tune]`` extra.

The runtime itself runs on onnxruntime alone: a graph built here once is kept beside the bundle
(:func:`~nestflex.deploy.backends.base.tuned_dir`) and later runs need no ``onnx``. So a missing
package is an error only when a graph has to be built now, and its message says both ways out.
"""

from __future__ import annotations

from typing import Any

from nestflex.deploy.backends.base import BackendError

__all__ = ["TUNE_EXTRA", "MissingOnnxError", "import_onnx"]

#: the extra that installs ``onnx``
TUNE_EXTRA = "nestflex[tune]"


class MissingOnnxError(BackendError, ModuleNotFoundError):
    """Building a graph needs the ``onnx`` package, which is not installed (a ``ModuleNotFoundError``
    too, with ``name == "onnx"``, so code that treats a missing package as "not here" still does)."""


def import_onnx(what: str) -> Any:
    """The ``onnx`` module, to build ``what`` (a phrase: "the int8 graph of level 2").

    Raises:
        MissingOnnxError: ``onnx`` is not installed.
    """
    try:
        import onnx
    except ModuleNotFoundError as e:
        if e.name != "onnx":  # onnx is there but broken: its own error says more
            raise
        err = MissingOnnxError(
            f"building {what} needs the `onnx` package, which is not installed. HINT: pip install "
            f"\"{TUNE_EXTRA}\" (or run `nestflex tune` where it is installed: the graphs it builds are kept "
            f"beside the bundle, in BUNDLE.tuned/, and run without onnx)")
        err.name = "onnx"
        raise err from None
    return onnx
