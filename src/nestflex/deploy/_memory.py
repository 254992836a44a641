"""What the process really holds: its resident set size, read from the OS.

The engine checks its memory budget against this, not only against the bytes its runtimes count:
an onnxruntime session also holds its arena, prepacked kernels and graph, which no weight sum
sees. Linux and Android give it in ``/proc/self/statm``; elsewhere :func:`rss_bytes` returns
``None`` and callers fall back to the counted bytes.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["release_freed", "rss_bytes"]


def rss_bytes() -> int | None:
    """The process's resident set size in bytes, or ``None`` where ``/proc/self/statm`` is absent."""
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


_LIBC: list = []  # [handle or None], resolved on first use


def release_freed() -> bool:
    """Hand the heap's freed pages back to the OS (glibc's ``malloc_trim``); False where there is none.

    Building an onnxruntime session allocates and frees several copies of its graph (optimisation,
    prepacking); glibc keeps the freed pages resident, about 7 MB per fused early-exit graph on the
    default recipe's bundle (docs/deploy.md: memory). Called after session builds, never per frame
    (it takes about a millisecond): at load, and once after the last of the stage sessions a batched
    early exit opens on its first call.
    """
    if not _LIBC:
        try:  # the process's own symbols: glibc's where it runs on glibc (musl and macOS have no malloc_trim)
            lib = ctypes.CDLL(None)
            _LIBC.append(lib if hasattr(lib, "malloc_trim") else None)
        except OSError:
            _LIBC.append(None)
    if _LIBC[0] is None:
        return False
    _LIBC[0].malloc_trim(0)
    return True
