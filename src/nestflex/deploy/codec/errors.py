"""The error type of the split-tensor codec.

Kept in its own tiny module so every codec module (and the frame decoder, which must turn every
malformed byte string into this one type) can import it without import cycles.
"""

from __future__ import annotations

from nestflex.errors import NestflexError

__all__ = ["CodecError"]


class CodecError(NestflexError, ValueError):
    """A codec argument is out of range, or a frame is malformed, truncated or tampered with.

    Subclasses ``ValueError`` too, so code that predates nestflex and catches ``ValueError`` still
    catches it.
    """
