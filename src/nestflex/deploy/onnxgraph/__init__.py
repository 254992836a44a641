"""Bundle programs as ONNX graphs, written without the ``onnx`` package (numpy only).

The light runtime runs a bundle's components in onnxruntime: every level of the multi-capacity
backbone, every stage of a cut (split head and tail, early-exit stages) and every exit head.
:func:`program_to_onnx` turns one program (weights given already cut to the level's region)
into a serialised ONNX model; :func:`stages_to_onnx` does so for each stage of a cut program;
:func:`infer_shapes` is the shape walk both rely on. ``_proto`` writes the protobuf.

Importing this package imports numpy and :mod:`nestflex.errors`, nothing else (no torch, no onnx).
"""

from nestflex.deploy.onnxgraph.program import (
    BATCH,
    SUPPORTED_OPS,
    OnnxGraphError,
    infer_shapes,
    program_to_onnx,
    stages_to_onnx,
)

__all__ = ["BATCH", "SUPPORTED_OPS", "OnnxGraphError", "infer_shapes", "program_to_onnx", "stages_to_onnx"]
