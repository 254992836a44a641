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


def alternating_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each ``fns`` entry, the entries run in turn within every repeat.

    Alternating spreads a change in machine load (other jobs on a shared machine) over every
    entry alike, so the ratios between them stay fair. One untimed warm-up call each first.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
