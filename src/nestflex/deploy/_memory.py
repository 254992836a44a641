"""What the process really holds: its resident set size, read from the OS.

The engine checks its memory budget against this, not only against the bytes its runtimes count:
an onnxruntime session also holds its arena, prepacked kernels and graph, which no weight sum
sees. Linux and Android give it in ``/proc/self/statm``; elsewhere :func:`rss_bytes` returns
``None`` and callers fall back to the counted bytes.
"""

from __future__ import annotations

import os

__all__ = ["rss_bytes"]


def rss_bytes() -> int | None:
    """The process's resident set size in bytes, or ``None`` where ``/proc/self/statm`` is absent."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
