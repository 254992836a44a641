"""The error type of the resource-aware scheduler.

Its own tiny module so every scheduler module (profiles, solvers, registry) and the simulation can
import it without import cycles.
"""

from __future__ import annotations

from nestflex.errors import NestflexError

__all__ = ["SchedulerError"]


class SchedulerError(NestflexError, ValueError):
    """A scheduler argument or an application profile is invalid, or a problem has no solution.

    Subclasses ``ValueError`` too, so code that catches ``ValueError`` still catches it.
    """
