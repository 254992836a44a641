"""The network profiler: the link's latency and bandwidth as the device sees them, from the transfers
split inference makes (fast and slow moving averages), for the split scheduler.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from typing import Any

from nestflex.deploy.profiler import ProfilerError

__all__ = ["NetworkProfiler"]

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

    Fed by the split client (:class:`~nestflex.deploy.split.offload.Offloader`) with every completed
    transfer and by latency probes (:meth:`~nestflex.deploy.split.client.TailClient.ping_ms`):

    * **latency** L: one-way-and-back time of an empty request, as a real-time and a historical
      moving average (exponential, ``alpha_fast`` / ``alpha_slow``);
    * **bandwidth** B: from each transfer, ``8 * bytes / (network time - L)`` where the network time is
      the round trip minus the server's piggybacked compute and queue time; samples whose payload
      time is under ``min_payload_ms`` are skipped (they measure L, not B);
    * **server time** per split as a moving median, and the server's slowdown factor (measured /
      predicted) when the caller passes a prediction;
    * **failure rate**: share of the last ``window`` requests that failed (refused, deadline, down).

    Args:
        alpha_fast: weight of a new sample in the real-time moving averages, in (0, 1].
        alpha_slow: weight of a new sample in the historical moving averages, in (0, 1].
        window: requests the moving medians (server time, slowdown) and the failure rate cover
            (``>= 1``).
        min_payload_ms: transfers whose payload time (network time minus latency) is under this
            many ms give no bandwidth sample.

    Raises:
        ProfilerError: an ``alpha`` outside (0, 1] or ``window`` not an int ``>= 1``.

    Examples:
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
