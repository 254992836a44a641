"""Wall-clock timing shared by the runtime CLI, the profilers and the benchmarks.

One way to time a call everywhere: ``warmup`` untimed calls first (they pay for lazy imports,
kernel selection and allocator growth, which are not what is measured), then ``repeats`` timed
calls with :func:`time.perf_counter`; report the median, which one preempted call on a shared
machine does not move. Two refinements, both opt-in:

* ``min_ms``: a call faster than the timer's useful resolution is looped until one sample lasts
  at least ``min_ms`` (the loop count is set from the fastest of three calls, so one preempted
  call does not set it) and the sample is divided by the loop count;
* :func:`alternating_samples`: several variants run in turn within every repeat, so a change in
  machine load hits all of them alike and their ratios stay fair.

Examples:
    >>> ms = median_ms(lambda: sum(range(1000)), repeats=5)
    >>> 0 < ms < 1000
    True
    >>> sorted(alternating_median_ms({"a": lambda: None, "b": lambda: None}, repeats=3))
    ['a', 'b']
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Mapping

from nestflex.errors import NestflexError

__all__ = [
    "TimingError",
    "time_samples",
    "median_s",
    "median_ms",
    "alternating_samples",
    "alternating_median_s",
    "alternating_median_ms",
]

#: Upper bound of the loop count set by ``min_ms`` (a call that is timed as ~0 is not looped forever).
MAX_LOOPS = 1000


class TimingError(NestflexError, ValueError):
    """A timing argument is out of range."""


def _check(repeats: int, warmup: int, min_ms: float) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise TimingError(f"`repeats` must be an int >= 1, got {repeats!r}.")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise TimingError(f"`warmup` must be an int >= 0, got {warmup!r}.")
    if isinstance(min_ms, bool) or not isinstance(min_ms, (int, float)) or not min_ms >= 0:
        raise TimingError(f"`min_ms` must be a number >= 0, got {min_ms!r}. HINT: 0 times single calls.")


def _loops(fn: Callable[[], object], min_ms: float) -> int:
    """Calls per sample so that one sample lasts at least ``min_ms``."""
    if min_ms <= 0:
        return 1
    once = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        once.append(time.perf_counter() - start)
    return max(1, min(MAX_LOOPS, math.ceil(min_ms / 1e3 / max(min(once), 1e-7))))


def _sample(fn: Callable[[], object], loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - start) / loops


def time_samples(fn: Callable[[], object], repeats: int, *, warmup: int = 1, min_ms: float = 0.0) -> list[float]:
    """Seconds per call of ``fn()``, one sample per repeat, after ``warmup`` untimed calls.

    Args:
        fn: the call to time (no arguments; bind them with a lambda).
        repeats: timed samples.
        warmup: untimed calls first.
        min_ms: loop the call within a sample until the sample lasts this long (0: one call).

    Returns:
        ``repeats`` samples in seconds per call, in the order taken.

    Raises:
        TimingError: ``repeats`` < 1, ``warmup`` < 0 or ``min_ms`` < 0.
    """
    return alternating_samples({"fn": fn}, repeats, warmup=warmup, min_ms=min_ms)["fn"]


def median_s(fn: Callable[[], object], repeats: int, *, warmup: int = 1, min_ms: float = 0.0) -> float:
    """Median seconds per call of ``fn()`` (see :func:`time_samples` for the arguments)."""
    return statistics.median(time_samples(fn, repeats, warmup=warmup, min_ms=min_ms))


def median_ms(fn: Callable[[], object], repeats: int, *, warmup: int = 1, min_ms: float = 0.0) -> float:
    """Median milliseconds per call of ``fn()`` (see :func:`time_samples` for the arguments)."""
    return 1e3 * median_s(fn, repeats, warmup=warmup, min_ms=min_ms)


def alternating_samples(
    fns: Mapping[str, Callable[[], object]], repeats: int, *, warmup: int = 1, min_ms: float = 0.0
) -> dict[str, list[float]]:
    """Seconds per call of each ``fns`` entry, the entries run in turn within every repeat.

    Every entry gets its ``warmup`` calls (and, with ``min_ms``, its own loop count) before any
    is timed.

    Returns:
        ``{name: [seconds per call, one per repeat]}``, in ``fns`` order.

    Raises:
        TimingError: ``repeats`` < 1, ``warmup`` < 0 or ``min_ms`` < 0.
    """
    _check(repeats, warmup, min_ms)
    loops = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        loops[name] = _loops(fn, min_ms)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, loops[name]))
    return samples


def alternating_median_s(
    fns: Mapping[str, Callable[[], object]], repeats: int, *, warmup: int = 1, min_ms: float = 0.0
) -> dict[str, float]:
    """Median seconds per call of each entry, timed in alternation (see :func:`alternating_samples`)."""
    return {k: statistics.median(v) for k, v in alternating_samples(fns, repeats, warmup=warmup, min_ms=min_ms).items()}


def alternating_median_ms(
    fns: Mapping[str, Callable[[], object]], repeats: int, *, warmup: int = 1, min_ms: float = 0.0
) -> dict[str, float]:
    """Median milliseconds per call of each entry, timed in alternation (see :func:`alternating_samples`)."""
    return {k: 1e3 * v for k, v in alternating_median_s(fns, repeats, warmup=warmup, min_ms=min_ms).items()}
