"""The error of :mod:`nestflex.deploy.onnxgraph`, in a module of its own so that the op modules
(``program``, ``_tokens``) raise it without importing each other."""

from __future__ import annotations

from nestflex.errors import NestflexError

__all__ = ["OnnxGraphError"]


class OnnxGraphError(NestflexError, ValueError):
    """A program cannot be written as an ONNX graph: an op ONNX cannot express, a missing weight
    or input shape, a shape that does not fit its node."""
