"""The online profiler: what the device does now, measured on the live stream (SPINN §3, METHODS §3).

Every frame the engine runs is recorded here with the configuration it ran (app, level, exit it
left at), the compute time it took and the time the offline profile predicted for it. From that:

* **per app x level x exit**: the measured latency as a moving median over the last ``window``
  frames, and how often frames leave at each exit (exit rates over the same window);
* **slowdown factor** (SPINN): measured / predicted, as the median of the last ``window`` per-frame
  ratios, per app and for the whole device. It rises when another process takes a core, and the
  scheduler multiplies every predicted latency by it, so it plans for the device as it is now.

**Waiting for a CPU.** A frame's compute time is wall time on the runtime call, and a call of
0.1-2 ms is rarely preempted: a scheduler time slice is several ms, and a thread that sleeps
between frames is favoured when it wakes. Another process taking the cores therefore shows up as
the engine's worker waiting for a core (runnable, not running) between and before calls, in
bursts of a time slice that a few frames take, not as longer calls: a median of per-frame call
ratios does not move (docs/results/cpu_wait). Where Linux reports it (``/proc/thread-self/schedstat``),
the engine marks each frame's start on its worker thread (:meth:`OnlineProfiler.frame_started`),
and the slowdown is the median call ratio times the **contention** ``1 + sum(wait) / sum(compute)``
over the last ``4 * window`` frames: the worker waits that share of its running time for a core,
so every frame costs it that much more. Each wait is clipped to ``(max_ratio - 1)`` times its
frame's prediction, so one long stall moves the factor by at most ``max_ratio / (4 * window)``.
Elsewhere the wait is 0 and the contention 1.

Outlier guard: a single ratio is clipped to ``[1 / max_ratio, max_ratio]`` before it enters the
window, and the ratios' statistics are medians, so one frame preempted by the OS for 50 ms moves them not at all;
a sustained change moves the median within ``window / 2`` frames.

:meth:`OnlineProfiler.stats` is the live view (plain dict), :meth:`OnlineProfiler.write_json`
writes it, and ``log=`` appends one CSV row per frame for offline analysis.

Examples:
    >>> p = OnlineProfiler(window=8)
    >>> for _ in range(8):
    ...     p.record("cam", level=2, exit=None, compute_ms=3.0, predicted_ms=2.0)
    >>> p.slowdown(), p.slowdown("cam")
    (1.5, 1.5)
"""

from __future__ import annotations

import csv
import io
import math
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from nestflex._io import write_json
from nestflex.errors import NestflexError

__all__ = ["ProfilerError", "OnlineProfiler", "LOG_FIELDS"]

#: columns of the per-frame CSV log
LOG_FIELDS = ("t", "app", "level", "exit", "compute_ms", "predicted_ms", "ratio", "wait_ms")


class ProfilerError(NestflexError, ValueError):
    """An online-profiler argument is out of range."""


class OnlineProfiler:
    """Moving statistics of latency, exit rates and the slowdown factor, per app and for the device.

    Args:
        window: frames in each moving window (>= 1).
        max_ratio: per-frame measured/predicted ratios are clipped to ``[1/max_ratio, max_ratio]``.
        log: optional CSV file; one row per recorded frame (:data:`LOG_FIELDS`), flushed every
            ``flush_every`` rows and on :meth:`close`.
        flush_every: rows buffered before the log is written.

    Raises:
        ProfilerError: ``window`` < 1, ``max_ratio`` <= 1, or a ``log`` path whose folder is missing.
    """

    def __init__(self, window: int = 32, max_ratio: float = 20.0, log: str | os.PathLike | None = None,
                 flush_every: int = 256) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ProfilerError(f"`window` must be an int >= 1 (frames per moving window), got {window!r}")
        if not isinstance(max_ratio, (int, float)) or not math.isfinite(max_ratio) or max_ratio <= 1:
            raise ProfilerError(f"`max_ratio` must be a finite number > 1, got {max_ratio!r}")
        if log is not None and not Path(log).parent.is_dir():
            raise ProfilerError(f"`log` {str(log)!r}: folder {str(Path(log).parent)!r} does not exist. "
                                f"HINT: create it first")
        self.window, self.max_ratio = window, float(max_ratio)
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, int, int | None], deque[float]] = {}
        self._exits: dict[tuple[str, int], deque[int | None]] = {}
        self._ratios: dict[str, deque[float]] = {}
        self._device: deque[float] = deque(maxlen=window)
        self._frames: dict[str, int] = {}
        # the worker's waits for a CPU and its compute time, over a longer window than the ratios:
        # waits come in bursts of a time slice, and a sum over few frames would swing with one
        self._waits: deque[float] = deque(maxlen=4 * window)
        self._busy: deque[float] = deque(maxlen=4 * window)
        self._wait_sum = self._busy_sum = 0.0  # their running sums: the slowdown is read after every frame
        self._runq = _RunQueueClock()
        self._wait_ms = 0.0  # the wait before the frame in progress (frame_started)
        self._rq_mark: float | None = None  # the watched thread's run-queue clock at the last record
        self._rq_start: float | None = None  # ... and at the start of the call in progress
        self._t0 = time.perf_counter()
        self._log_path = Path(log) if log is not None else None
        self._rows: list[tuple[Any, ...]] = []
        self._flush_every = max(1, int(flush_every))
        if self._log_path is not None:
            with open(self._log_path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(LOG_FIELDS)

    # ------------------------------------------------------------------ recording
    def watch_thread(self) -> bool:
        """Measure the calling thread's waits for a CPU from now on (the engine's worker calls it
        once, first thing). ``False`` where the OS does not report them (the wait stays 0)."""
        ok = self._runq.watch()
        self._rq_mark, self._rq_start = self._runq.read(), None
        return ok

    def frame_started(self) -> None:
        """A frame's runtime call starts now: the watched thread's wait for a CPU since the last
        :meth:`record` is charged to this frame, and its waits during the call (a call preempted
        by another process) will be when it is recorded; nothing when no thread is watched."""
        now = self._runq.read()
        self._wait_ms = max(0.0, now - self._rq_mark) if now is not None and self._rq_mark is not None else 0.0
        self._rq_start = now

    def record(self, app: str, level: int, exit: int | None, compute_ms: float, predicted_ms: float | None) -> None:
        """One frame: ``app`` ran ``level`` and left at ``exit`` (``None``: no exits) in ``compute_ms``.

        ``predicted_ms`` is the offline profile's time for that configuration and exit; ``None``
        records the latency without a slowdown sample. The wait for a CPU :meth:`frame_started`
        measured enters the contention (not the latency window).
        """
        wait_ms, self._wait_ms = self._wait_ms, 0.0
        end, start, self._rq_start = self._runq.read(), self._rq_start, None
        in_call = max(0.0, end - start) if end is not None and start is not None else 0.0
        self._rq_mark = end
        # the call's own waits are in its wall time: counted as waiting, not as running
        wait_ms, busy_ms = wait_ms + in_call, max(compute_ms - in_call, 0.0)
        ratio = None
        if predicted_ms is not None and predicted_ms > 0 and math.isfinite(compute_ms):
            ratio = min(self.max_ratio, max(1.0 / self.max_ratio, compute_ms / predicted_ms))
            wait_ms = min(wait_ms, (self.max_ratio - 1.0) * predicted_ms)
        with self._lock:
            if math.isfinite(compute_ms):
                if len(self._waits) == self._waits.maxlen:
                    self._wait_sum -= self._waits[0]
                    self._busy_sum -= self._busy[0]
                self._waits.append(wait_ms)
                self._busy.append(busy_ms)
                self._wait_sum += wait_ms
                self._busy_sum += busy_ms
            # get-then-create: this runs once per frame, a throwaway deque is not free
            lat = self._latency.get((app, level, exit))
            if lat is None:
                lat = self._latency[(app, level, exit)] = deque(maxlen=self.window)
            lat.append(compute_ms)
            exits = self._exits.get((app, level))
            if exits is None:
                exits = self._exits[(app, level)] = deque(maxlen=self.window)
            exits.append(exit)
            self._frames[app] = self._frames.get(app, 0) + 1
            if ratio is not None:
                ratios = self._ratios.get(app)
                if ratios is None:
                    ratios = self._ratios[app] = deque(maxlen=self.window)
                ratios.append(ratio)
                self._device.append(ratio)
            if self._log_path is not None:
                self._rows.append((round(time.perf_counter() - self._t0, 6), app, level,
                                   "" if exit is None else exit, round(compute_ms, 4),
                                   "" if predicted_ms is None else round(predicted_ms, 4),
                                   "" if ratio is None else round(ratio, 4), round(wait_ms, 4)))
                if len(self._rows) >= self._flush_every:
                    self._flush_locked()

    def forget(self, app: str) -> None:
        """Drop everything measured for ``app`` (it left the device)."""
        with self._lock:
            for table in (self._latency, self._exits):
                for key in [k for k in table if k[0] == app]:
                    del table[key]
            self._ratios.pop(app, None)
            self._frames.pop(app, None)

    # ------------------------------------------------------------------ reading
    def slowdown(self, app: str | None = None, default: float = 1.0) -> float:
        """Median measured/predicted ratio over the window, of ``app`` or of the device (``None``),
        times the worker's :meth:`contention` (capped at ``max_ratio``).

        ``default`` when nothing has been measured yet.
        """
        with self._lock:
            window = self._device if app is None else self._ratios.get(app)
            return min(self.max_ratio, statistics.median(window) * self._contention()) if window else default

    def contention(self) -> float:
        """``1 + sum(wait) / sum(compute)`` over the last ``4 * window`` frames: the worker's wait for
        a CPU per unit of its running time, plus one (1.0 with no wait measured)."""
        with self._lock:
            return self._contention()

    def _contention(self) -> float:
        return 1.0 + max(self._wait_sum, 0.0) / self._busy_sum if self._busy_sum > 1e-9 else 1.0

    def latency_ms(self, app: str, level: int, exit: int | None = None) -> float | None:
        """Moving median latency of ``app`` at ``level`` leaving at ``exit``, or ``None`` if unseen."""
        with self._lock:
            window = self._latency.get((app, level, exit))
            return statistics.median(window) if window else None

    def exit_rates(self, app: str, level: int) -> dict[int | None, float]:
        """Share of the window's frames of ``app`` at ``level`` that left at each exit."""
        with self._lock:
            window = self._exits.get((app, level))
            if not window:
                return {}
            n = len(window)
            out: dict[int | None, float] = {}
            for e in window:
                out[e] = out.get(e, 0.0) + 1.0 / n
            return out

    def stats(self) -> dict[str, Any]:
        """Live view: device slowdown, and per app its slowdown, frames recorded, latency per
        (level, exit) and exit rates per level (plain JSON values)."""
        with self._lock:
            apps: dict[str, Any] = {}
            for app, n in self._frames.items():
                ratios = self._ratios.get(app)
                lat = {f"{lv}/{'-' if e is None else e}": round(statistics.median(w), 4)
                       for (a, lv, e), w in self._latency.items() if a == app and w}
                rates = {}
                for (a, lv), w in self._exits.items():
                    if a == app and w and any(e is not None for e in w):
                        counts: dict[str, int] = {}
                        for e in w:
                            counts[str(e)] = counts.get(str(e), 0) + 1
                        rates[str(lv)] = {k: round(c / len(w), 4) for k, c in sorted(counts.items())}
                apps[app] = {"frames": n, "slowdown": round(statistics.median(ratios), 4) if ratios else None,
                             "latency_ms": lat, "exit_rates": rates}
            c = self._contention()
            for a in apps.values():
                if a["slowdown"] is not None:
                    a["slowdown"] = round(min(self.max_ratio, a["slowdown"] * c), 4)
            return {"window": self.window,
                    "slowdown": round(min(self.max_ratio, statistics.median(self._device) * c), 4) if self._device
                    else None, "contention": round(c, 4),
                    "cpu_wait_ms": round(statistics.fmean(self._waits), 4) if self._waits else None, "apps": apps}

    def write_json(self, path: str | os.PathLike) -> Path:
        """Write :meth:`stats` atomically as JSON."""
        return write_json(path, self.stats())

    # ------------------------------------------------------------------ log
    def _flush_locked(self) -> None:
        if self._log_path is None or not self._rows:
            return
        buf = io.StringIO()
        csv.writer(buf).writerows(self._rows)
        with open(self._log_path, "a", newline="", encoding="utf-8") as f:
            f.write(buf.getvalue())
        self._rows.clear()

    def flush(self) -> None:
        """Write buffered log rows."""
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush the log; stop watching the thread."""
        self.flush()
        self._runq.close()

    def __repr__(self) -> str:
        return f"OnlineProfiler(window={self.window}, slowdown={self.slowdown():.3f}, apps={sorted(self._frames)})"


class _RunQueueClock:
    """One thread's cumulative time runnable but not running (Linux ``schedstat``'s second field),
    in ms. The file is opened on the watched thread (``/proc/thread-self`` resolves to it then) and
    read with ``pread`` from any thread: a few microseconds, no new file object per read."""

    _PATH = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        self._fd: int | None = None

    def watch(self) -> bool:
        self.close()
        try:
            self._fd = os.open(self._PATH, os.O_RDONLY)
        except OSError:  # not Linux, or no scheduler statistics: waits are not measured
            return False
        return self.read() is not None

    def read(self) -> float | None:
        """The clock in ms, or ``None`` when no thread is watched."""
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 96, 0).split()[1]) / 1e6
        except (OSError, ValueError, IndexError):  # unreadable: stop measuring
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
