"""Timing shared by the benchmarks: one warm-up call, then the median of repeated runs."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after one untimed warm-up call.

    The warm-up pays for lazy imports and allocator growth, which are not what is measured.
    """
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
