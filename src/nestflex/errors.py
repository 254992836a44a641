"""Exception types shared by every nestflex package.

One base type, :class:`NestflexError`, so callers can catch everything nestflex raises on bad
input with a single ``except``. Subclasses say which layer complained. This module imports
nothing heavy: the light runtime (``nestflex.deploy``) uses it too.
"""

from __future__ import annotations

__all__ = ["NestflexError", "DataError", "ModelError", "GraphError", "ProfileError", "PruningError", "CapacityError"]


class NestflexError(Exception):
    """Base class of every error nestflex raises on bad input or bad files."""


class DataError(NestflexError, ValueError):
    """A dataset argument, directory or file is missing, malformed or corrupt."""


class ModelError(NestflexError, ValueError):
    """A model name or model argument is unknown or out of range."""


class GraphError(NestflexError, RuntimeError):
    """A model cannot be traced, or a graph/surgery request does not fit the model."""


class ProfileError(NestflexError, ValueError):
    """A profiler argument is out of range or its data is unusable."""


class PruningError(NestflexError, ValueError):
    """A pruning argument is out of range: unknown criterion, impossible goal, unusable data."""


class CapacityError(NestflexError, ValueError):
    """A multi-capacity (freeze-&-grow) argument or roadmap does not fit the model."""
