"""The online profiler: what the device does now, measured on the live stream (SPINN §3, METHODS §3).

Every frame the engine runs is recorded here with the configuration it ran (app, level, exit it
left at), the compute time it took and the time the offline profile predicted for it. From that:

* **per app x level x exit**: the measured latency as a moving median over the last ``window``
  frames, and how often frames leave at each exit (exit rates over the same window);
* **slowdown factor** (SPINN): measured / predicted, as the median of the last ``window`` per-frame
  ratios, per app and for the whole device. It rises when another process takes a core, and the
  scheduler multiplies every predicted latency by it, so it plans for the device as it is now.

Outlier guard: a single ratio is clipped to ``[1 / max_ratio, max_ratio]`` before it enters the
window, and the statistics are medians, so one frame preempted by the OS for 50 ms moves nothing;
a sustained change moves the median within ``window / 2`` frames.

:meth:`OnlineProfiler.stats` is the live view (plain dict), :meth:`OnlineProfiler.write_json`
writes it, and ``log=`` appends one CSV row per frame for offline analysis.

Example:
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

__all__ = ["ProfilerError", "OnlineProfiler", "NetworkProfiler", "LOG_FIELDS"]

#: columns of the per-frame CSV log
LOG_FIELDS = ("t", "app", "level", "exit", "compute_ms", "predicted_ms", "ratio")


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
        self._t0 = time.perf_counter()
        self._log_path = Path(log) if log is not None else None
        self._rows: list[tuple[Any, ...]] = []
        self._flush_every = max(1, int(flush_every))
        if self._log_path is not None:
            with open(self._log_path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerow(LOG_FIELDS)

    # ------------------------------------------------------------------ recording
    def record(self, app: str, level: int, exit: int | None, compute_ms: float, predicted_ms: float | None) -> None:
        """One frame: ``app`` ran ``level`` and left at ``exit`` (``None``: no exits) in ``compute_ms``.

        ``predicted_ms`` is the offline profile's time for that configuration and exit; ``None``
        records the latency without a slowdown sample.
        """
        ratio = None
        if predicted_ms is not None and predicted_ms > 0 and math.isfinite(compute_ms):
            ratio = min(self.max_ratio, max(1.0 / self.max_ratio, compute_ms / predicted_ms))
        with self._lock:  # get-then-create: this runs once per frame, a throwaway deque is not free
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
                                   "" if ratio is None else round(ratio, 4)))
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
        """Median measured/predicted ratio over the window: of ``app``, or of the device (``None``).

        ``default`` when nothing has been measured yet.
        """
        with self._lock:
            window = self._device if app is None else self._ratios.get(app)
            return statistics.median(window) if window else default

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
            return {"window": self.window, "slowdown": round(statistics.median(self._device), 4) if self._device
                    else None, "apps": apps}

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
        """Flush the log."""
        self.flush()

    def __repr__(self) -> str:
        return f"OnlineProfiler(window={self.window}, slowdown={self.slowdown():.3f}, apps={sorted(self._frames)})"


class _Ewma:
    """A real-time (fast) and a historical (slow) exponential moving average of one quantity."""

    __slots__ = ("fast", "slow", "alpha_fast", "alpha_slow", "n")

    def __init__(self, alpha_fast: float, alpha_slow: float) -> None:
        self.fast = self.slow = None
        self.alpha_fast, self.alpha_slow, self.n = alpha_fast, alpha_slow, 0

    def add(self, v: float) -> None:
        self.n += 1
        self.fast = v if self.fast is None else self.fast + self.alpha_fast * (v - self.fast)
        self.slow = v if self.slow is None else self.slow + self.alpha_slow * (v - self.slow)

    def get(self, kind: str) -> float | None:
        return self.fast if kind == "realtime" else self.slow


class NetworkProfiler:
    """The network side of the online profiler (SPINN §3): bandwidth, latency, server time, failures.

    Fed by the split client (:class:`~nestflex.deploy.offload.Offloader`) with every completed
    transfer and by latency probes (:meth:`~nestflex.deploy.client.TailClient.ping_ms`):

    * **latency** L: one-way-and-back time of an empty request, as a real-time and a historical
      moving average (exponential, ``alpha_fast`` / ``alpha_slow``);
    * **bandwidth** B: from each transfer, ``8 * bytes / (network time - L)`` where the network time is
      the round trip minus the server's piggybacked compute and queue time; samples whose payload
      time is under ``min_payload_ms`` are skipped (they measure L, not B);
    * **server time** per split as a moving median, and the server's slowdown factor (measured /
      predicted) when the caller passes a prediction;
    * **failure rate**: share of the last ``window`` requests that failed (refused, deadline, down).

    Example:
        >>> p = NetworkProfiler()
        >>> p.record_ping(10.0)
        >>> p.record_transfer(125_000, 0, rtt_ms=112.0, server_ms=2.0)  # 1 Mbit in 100 ms
        >>> round(p.bandwidth_mbps(), 3), p.latency_ms()
        (10.0, 10.0)
    """

    def __init__(self, alpha_fast: float = 0.5, alpha_slow: float = 0.05, window: int = 32,
                 min_payload_ms: float = 0.2) -> None:
        for name, a in (("alpha_fast", alpha_fast), ("alpha_slow", alpha_slow)):
            if not isinstance(a, (int, float)) or not 0 < a <= 1:
                raise ProfilerError(f"`{name}` must be a number in (0, 1], got {a!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ProfilerError(f"`window` must be an int >= 1, got {window!r}")
        self.window, self.min_payload_ms = window, float(min_payload_ms)
        self._lock = threading.Lock()
        self._latency = _Ewma(alpha_fast, alpha_slow)
        self._bandwidth = _Ewma(alpha_fast, alpha_slow)
        self._server: deque[float] = deque(maxlen=window)
        self._server_ratio: deque[float] = deque(maxlen=window)
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._failures: dict[str, int] = {}
        self.transfers = 0
        self.bytes_sent = 0

    def record_ping(self, rtt_ms: float) -> None:
        """An empty round trip (the link's latency)."""
        if math.isfinite(rtt_ms) and rtt_ms >= 0:
            with self._lock:
                self._latency.add(float(rtt_ms))

    def record_transfer(self, bytes_sent: int, bytes_received: int, rtt_ms: float, server_ms: float,
                        queue_ms: float = 0.0, predicted_server_ms: float | None = None) -> None:
        """One answered request: bytes both ways, its round trip and the server's own time."""
        with self._lock:
            self.transfers += 1
            self.bytes_sent += int(bytes_sent)
            self._outcomes.append(True)
            self._server.append(float(server_ms))
            if predicted_server_ms is not None and predicted_server_ms > 0:
                self._server_ratio.append(float(server_ms) / predicted_server_ms)
            network = rtt_ms - server_ms - queue_ms
            latency = self._latency.get("historical")
            if latency is None:  # no probe yet: the smallest network time seen bounds it from above
                latency = network
                self._latency.add(max(0.0, network))
            payload_ms = network - latency
            if payload_ms >= self.min_payload_ms:
                self._bandwidth.add(8 * (bytes_sent + bytes_received) / (payload_ms * 1000))

    def record_failure(self, code: str) -> None:
        """A request that failed with gRPC status ``code`` (or ``CANCELLED`` by the device)."""
        with self._lock:
            if code != "CANCELLED":  # a cancellation is the device's choice, not the network's
                self._outcomes.append(False)
            self._failures[code] = self._failures.get(code, 0) + 1

    def bandwidth_mbps(self, kind: str = "realtime", default: float | None = None) -> float | None:
        """Bandwidth estimate in Mbit/s (``realtime`` or ``historical``), ``default`` before any sample."""
        v = self._bandwidth.get(kind)
        return default if v is None else v

    def latency_ms(self, kind: str = "realtime", default: float | None = None) -> float | None:
        """Empty round-trip estimate in ms, ``default`` before any sample."""
        v = self._latency.get(kind)
        return default if v is None else v

    def server_ms(self) -> float | None:
        """Moving median of the server's compute time per request."""
        return statistics.median(self._server) if self._server else None

    def server_slowdown(self, default: float = 1.0) -> float:
        """Moving median of the server's measured / predicted time."""
        return statistics.median(self._server_ratio) if self._server_ratio else default

    def failure_rate(self) -> float:
        """Share of the last ``window`` requests that failed."""
        return (sum(not o for o in self._outcomes) / len(self._outcomes)) if self._outcomes else 0.0

    def stats(self) -> dict[str, Any]:
        """The live view as a plain dict."""
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {"bandwidth_mbps": {"realtime": r(self.bandwidth_mbps()), "historical": r(self.bandwidth_mbps("historical"))},
                "latency_ms": {"realtime": r(self.latency_ms()), "historical": r(self.latency_ms("historical"))},
                "server_ms": r(self.server_ms()), "server_slowdown": r(self.server_slowdown()),
                "failure_rate": round(self.failure_rate(), 4), "failures": dict(self._failures),
                "transfers": self.transfers, "bytes_sent": self.bytes_sent}
