"""Trace-driven network emulation in user space: a link model and a TCP proxy on 127.0.0.1.

Split inference (SPINN, DynO) is judged at given bandwidths and on real bandwidth traces, and the
kernel's traffic shaping (netem, tc) needs root. This module emulates the link in the process:

* :class:`BandwidthTrace`: a throughput trace (``time_seconds<TAB>throughput_Mbps`` per line, the
  format of the Pensieve / Norway 3G / FCC traces) or a fixed rate; the rate is piecewise
  constant, each sample holding until the next one, and the trace loops past its end.
* :class:`LinkModel`: one direction of a link as a pure, deterministic function of (virtual)
  time. A message of ``n`` bytes sent at ``t`` waits for the messages before it (FIFO), is
  serialised through the trace's rate (the integral of the piecewise-constant rate, so a
  0 Mbit/s interval means nothing gets through until it ends) and arrives ``delay_ms`` later,
  plus optional jitter and loss drawn from a seeded :class:`random.Random`, behind an optional
  drop-tail queue. Fluid serialisation, store-and-forward per message: the last byte of a
  message decides when the message has arrived.
* :class:`LinkProxy`: an asyncio TCP proxy that applies one :class:`LinkModel` per direction to
  the real byte stream, cut into packets (``packet_bytes``, 1500 by default: mahimahi-style
  packet delivery), on the monotonic clock. It is transparent to gRPC (HTTP/2 is just bytes),
  counts bytes, switches traces/rates at run time, and simulates outages.
  :class:`LinkProxyThread` runs one in a background thread for synchronous code.

Limits (user-space emulation): timers fire with ~1 ms granularity, shaping is per packet of the
byte stream the proxy reads (not per IP packet: no TCP congestion control reacts to it), and
loopback TCP's own socket buffers sit in front of the proxy. docs/link.md has the details.

Example:
    >>> link = LinkModel(8.0, delay_ms=20.0)  # 8 Mbit/s, 20 ms one way
    >>> tx = link.transmit(100_000, now=0.0)  # 800 kbit take 0.1 s, then 20 ms of propagation
    >>> round(tx.finish, 6), round(tx.arrival, 6)
    (0.1, 0.12)
    >>> round(link.transmit(100_000, now=0.05).arrival, 6)  # FIFO: waits for the first message
    0.22
    >>> trace = BandwidthTrace([0.0, 1.0], [0.0, 8.0], period=2.0)  # silent for 1 s, then 8 Mbit/s
    >>> round(LinkModel(trace).transmit(1000, now=0.5).arrival, 6)
    1.001
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import math
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from nestflex.errors import NestflexError

__all__ = [
    "LinkError",
    "BandwidthTrace",
    "Transmission",
    "LinkModel",
    "LinkCounters",
    "LinkProxy",
    "LinkProxyThread",
    "MAX_ATTEMPTS",
]

#: Most transmissions of one message in reliable mode (loss < 1 ends sooner almost surely).
MAX_ATTEMPTS = 64

_MBIT = 1e6


class LinkError(NestflexError, ValueError):
    """A link argument is out of range, or a bandwidth trace file is malformed."""


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(name: str, value: object, *, low: float = 0.0, hint: str = "") -> float:
    """``value`` as a finite float >= ``low``; a :class:`LinkError` naming ``name`` otherwise."""
    if not _finite(value) or value < low:
        raise LinkError(f"`{name}` must be a finite number >= {low:g}, got {value!r}."
                        + (f" HINT: {hint}" if hint else ""))
    return float(value)


# ====================================================================== bandwidth traces
class BandwidthTrace:
    """A piecewise-constant rate in Mbit/s over time, looping with period :attr:`period`.

    Sample ``i`` holds from ``times[i]`` until ``times[i + 1]`` (the last one until ``period``);
    past ``period`` the trace starts over. A 0 Mbit/s sample is an interval in which nothing is
    delivered (a transfer waits for the next positive sample), not an error.

    Args:
        times: sample times in seconds: the first 0, strictly increasing.
        mbps: throughput of each sample in Mbit/s (>= 0, at least one > 0).
        period: loop length in seconds (> ``times[-1]``). Default: the last sample lasts as long
            as the gap before it (1 s for a one-sample trace).
        name: shown in ``repr`` and in error messages (the file name for :meth:`load`).

    Raises:
        LinkError: mismatched lengths, no samples, a time or rate out of range, or all rates 0.
    """

    def __init__(self, times: Sequence[float], mbps: Sequence[float], *, period: float | None = None,
                 name: str = "trace") -> None:
        times, mbps = [float(t) for t in times], [float(r) for r in mbps]
        if not times or len(times) != len(mbps):
            raise LinkError(f"{name}: need as many times as rates and at least one sample, got {len(times)} "
                            f"times and {len(mbps)} rates. "
                            f"HINT: BandwidthTrace.constant(mbps) for a fixed rate")
        if times[0] != 0.0:
            raise LinkError(f"{name}: the first sample must be at time 0, got {times[0]!r}. "
                            f"HINT: subtract the first time (BandwidthTrace.load does)")
        for i, (t, r) in enumerate(zip(times, mbps)):
            if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                raise LinkError(f"{name}: sample {i} ({t!r} s, {r!r} Mbit/s) is not finite or has a "
                                f"negative rate. "
                                f"HINT: rates are throughputs in Mbit/s, >= 0")
            if i and t <= times[i - 1]:
                raise LinkError(f"{name}: times must increase strictly, sample {i} is at {t!r} s after "
                                f"{times[i - 1]!r} s. HINT: sort the samples and merge duplicates")
        if max(mbps) <= 0:
            raise LinkError(f"{name}: every rate is 0 Mbit/s, nothing would ever be delivered. "
                            f"HINT: model an outage with LinkProxy.set_down / outage, "
                            f"or give the trace some rate > 0")
        if period is None:
            period = times[-1] + (times[-1] - times[-2]) if len(times) > 1 else 1.0
        if not _finite(period) or not period > times[-1]:
            raise LinkError(f"{name}: `period` must be finite and > the last sample time {times[-1]!r}, "
                            f"got {period!r}.")
        self.name = name
        self.times: tuple[float, ...] = tuple(times)
        self.mbps: tuple[float, ...] = tuple(mbps)
        self.period = float(period)
        self._bps = [r * _MBIT for r in mbps]
        self._edges = times + [self.period]  # segment i is [edges[i], edges[i + 1])
        cum = [0.0]  # bits delivered from 0 to edges[i]
        for i, bps in enumerate(self._bps):
            cum.append(cum[-1] + bps * (self._edges[i + 1] - self._edges[i]))
        self._cum = cum
        self._period_bits = cum[-1]

    # ------------------------------------------------------------------ construction
    @classmethod
    def constant(cls, mbps: float) -> BandwidthTrace:
        """A fixed rate of ``mbps`` Mbit/s (> 0)."""
        if not _finite(mbps) or mbps <= 0:
            raise LinkError(f"a constant rate must be a finite number of Mbit/s > 0, got {mbps!r}. "
                            f"HINT: for an outage use LinkProxy.set_down")
        return cls([0.0], [float(mbps)], period=1.0, name=f"{float(mbps):g} Mbit/s")

    @classmethod
    def load(cls, path: str | os.PathLike, *, period: float | None = None) -> BandwidthTrace:
        """Read a trace file: one ``time_seconds<TAB>throughput_Mbps`` sample per line.

        Columns may be separated by any whitespace; blank lines and ``#`` comments are skipped.
        Times are taken relative to the first sample (they must increase strictly).

        Args:
            path: the trace file.
            period: loop length in seconds after shifting; default as in :class:`BandwidthTrace`.

        Raises:
            LinkError: the file is missing or empty, or a line is malformed, negative, not finite
                or not later than the line before it (the message names file, line and value).
        """
        name = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise LinkError(f"cannot read bandwidth trace {name!r}: {e}. "
                            f"HINT: pass a text file of `time_seconds<TAB>throughput_Mbps` lines") from e
        times: list[float] = []
        mbps: list[float] = []
        for lineno, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            where = f"{name}:{lineno}"
            fields = text.split()
            if len(fields) != 2:
                raise LinkError(f"{where}: expected 2 columns `time_seconds<TAB>throughput_Mbps`, got "
                                f"{len(fields)} in {line!r}. HINT: one sample per line, e.g. `0.5\\t3.2`")
            try:
                t, r = float(fields[0]), float(fields[1])
            except ValueError:
                raise LinkError(f"{where}: {line!r} is not two numbers. "
                                f"HINT: time in seconds and throughput in Mbit/s, e.g. `0.5\\t3.2`") from None
            if not (math.isfinite(t) and math.isfinite(r)):
                raise LinkError(f"{where}: {line!r} has a value that is not finite. "
                                f"HINT: fix or delete the line")
            if t < 0 or r < 0:
                what, value = ("time", fields[0]) if t < 0 else ("throughput", fields[1])
                raise LinkError(f"{where}: {what} {value} is negative. "
                                f"HINT: times are seconds since the start, throughputs Mbit/s >= 0")
            if times and t <= times[-1]:
                raise LinkError(f"{where}: time {fields[0]} s is not later than the previous sample's "
                                f"{times[-1]!r} s. HINT: sort the lines by time and merge duplicates")
            times.append(t)
            mbps.append(r)
        if not times:
            raise LinkError(f"bandwidth trace {name!r} has no samples. "
                            f"HINT: one `time_seconds<TAB>throughput_Mbps` line per sample")
        t0 = times[0]
        return cls([t - t0 for t in times], mbps, period=period, name=name)

    def scaled(self, factor: float) -> BandwidthTrace:
        """The same trace with every rate multiplied by ``factor`` (> 0)."""
        factor = _number("factor", factor, hint="a multiplier of every rate, > 0")
        if factor <= 0:
            raise LinkError(f"`factor` must be > 0, got {factor!r}.")
        return BandwidthTrace(self.times, [r * factor for r in self.mbps], period=self.period,
                              name=f"{self.name} x{factor:g}")

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        return (f"BandwidthTrace({self.name!r}, samples={len(self)}, period={self.period:g} s, "
                f"mean={self.mean_mbps:.3g} Mbit/s)")

    @property
    def mean_mbps(self) -> float:
        """Time-weighted mean rate over one period, in Mbit/s."""
        return self._period_bits / self.period / _MBIT

    def rate(self, t: float) -> float:
        """The rate in Mbit/s at trace time ``t`` >= 0 (looping)."""
        if not t >= 0:
            raise LinkError(f"trace time must be >= 0, got {t!r}.")
        return self.mbps[self._segment(t % self.period)]

    def _segment(self, r: float) -> int:
        return bisect.bisect_right(self.times, r) - 1

    def bits_until(self, t: float) -> float:
        """Bits the trace delivers from time 0 to ``t`` >= 0 (the integral of the rate)."""
        if not t > 0:
            return 0.0
        k = math.floor(t / self.period)
        r = t - k * self.period
        i = self._segment(r)
        return k * self._period_bits + self._cum[i] + self._bps[i] * (r - self._edges[i])

    def time_for_bits(self, bits: float) -> float:
        """The earliest time at which :meth:`bits_until` reaches ``bits`` (0 for ``bits`` <= 0)."""
        if not bits > 0:
            return 0.0
        k = math.ceil(bits / self._period_bits) - 1  # whole periods before; the rest is in (0, period_bits]
        r = min(bits - k * self._period_bits, self._period_bits)  # min: float rounding past the end
        j = min(max(bisect.bisect_left(self._cum, r), 1), len(self._cum) - 1)  # first edge with cum >= r
        i = j - 1  # cum[i] < r <= cum[j], so segment i has a positive rate
        return k * self.period + self._edges[i] + (r - self._cum[i]) / self._bps[i]

    def finish_time(self, start: float, bits: float) -> float:
        """When ``bits`` bits sent from trace time ``start`` have all gone through the link."""
        if not bits > 0:
            return start
        return max(start, self.time_for_bits(self.bits_until(start) + bits))


# ====================================================================== the link model
TraceLike = BandwidthTrace | float | int | None


def _as_trace(trace: TraceLike) -> BandwidthTrace | None:
    if trace is None or isinstance(trace, BandwidthTrace):
        return trace
    if isinstance(trace, (int, float)) and not isinstance(trace, bool):
        return BandwidthTrace.constant(trace)
    raise LinkError(f"a link rate must be a BandwidthTrace, a number of Mbit/s or None (unlimited), got "
                    f"{type(trace).__name__}. HINT: BandwidthTrace.load(path) for a trace file")


@dataclass(frozen=True)
class Transmission:
    """What the link did with one message (all times in the model's clock, seconds).

    Attributes:
        nbytes: message size.
        sent: when it was handed to the link.
        start: when its first bit entered the link (after the messages queued before it).
        finish: when its last bit left the sender side (after every attempt, in reliable mode).
        arrival: when its last byte is delivered (``finish`` + delay + jitter + retransmission
            timeouts); ``None`` when it was lost or dropped.
        attempts: transmissions it took (> 1 only in reliable mode with loss).
        lost: lost on the way (unreliable mode); it still used the link.
        dropped: refused by a full queue; it did not use the link.
    """

    nbytes: int
    sent: float
    start: float
    finish: float
    arrival: float | None
    attempts: int = 1
    lost: bool = False
    dropped: bool = False

    @property
    def delivered(self) -> bool:
        """Whether the message arrives."""
        return self.arrival is not None


class LinkModel:
    """One direction of a link, as a deterministic function of the times it is given.

    A message of ``nbytes`` sent at ``now`` starts once the link is free (FIFO: after every
    message sent before it), is serialised through the rate trace (the trace's time 0 is the
    model time of the last :meth:`set_trace`, 0 at first) and arrives ``delay_ms`` after its last
    bit was sent, plus a jitter drawn uniformly from ``[0, jitter_ms]``. With ``loss`` > 0 each
    transmission is lost with that probability: in unreliable (datagram) mode the message is gone
    (it still used the link); in reliable mode (a TCP stream, what :class:`LinkProxy` uses) it is
    sent again right away and arrives ``rto_ms`` later per loss. ``queue_bytes`` bounds the
    bytes waiting in or going through the link (drop-tail: a message that does not fit is
    dropped; a message counts in full until its last bit is sent).

    The same sequence of calls gives the same results: randomness comes only from
    ``random.Random(seed)``, drawn in a fixed order (loss, then jitter), and time only from the
    ``now`` arguments, which must not decrease.

    Args:
        trace: a :class:`BandwidthTrace`, a fixed rate in Mbit/s, or ``None`` for unlimited rate.
        delay_ms: one-way propagation delay in ms (>= 0).
        jitter_ms: extra delay per message, uniform in ``[0, jitter_ms]`` ms (>= 0).
        loss: probability that one transmission is lost, in ``[0, 1)``.
        rto_ms: extra delay per loss in reliable mode (200 ms: Linux's minimum RTO).
        queue_bytes: drop-tail queue limit in bytes, ``None`` for unlimited.
        seed: seed of the model's :class:`random.Random`.

    Raises:
        LinkError: an argument out of range.
    """

    def __init__(self, trace: TraceLike = None, delay_ms: float = 0.0, *, jitter_ms: float = 0.0,
                 loss: float = 0.0, rto_ms: float = 200.0, queue_bytes: int | None = None,
                 seed: int = 0) -> None:
        self.trace = _as_trace(trace)
        self.delay_ms = _number("delay_ms", delay_ms, hint="one-way delay in milliseconds; RTT = 2 x delay")
        self.jitter_ms = _number("jitter_ms", jitter_ms)
        self.loss = _number("loss", loss, hint="a probability in [0, 1)")
        if self.loss >= 1:
            raise LinkError(f"`loss` must be < 1, got {loss!r}. "
                            f"HINT: a dead link is an outage: LinkProxy.set_down")
        self.rto_ms = _number("rto_ms", rto_ms)
        if queue_bytes is not None and (isinstance(queue_bytes, bool) or not isinstance(queue_bytes, int)
                                        or queue_bytes < 1):
            raise LinkError(f"`queue_bytes` must be an int >= 1 or None (unlimited), got {queue_bytes!r}.")
        self.queue_bytes = queue_bytes
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise LinkError(f"`seed` must be an int, got {seed!r}.")
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        """Forget every message and restart the random draws and the clock (time 0, trace origin 0)."""
        self._rng = random.Random(self.seed)
        self._origin = 0.0
        self._busy_until = 0.0
        self._last_now = 0.0
        self._queue: deque[tuple[float, int]] = deque()  # (finish, nbytes) of messages not yet sent out
        self._queued = 0

    def clone(self, *, seed: int | None = None) -> LinkModel:
        """A fresh model with the same settings (and trace), ``seed`` if given."""
        return LinkModel(self.trace, self.delay_ms, jitter_ms=self.jitter_ms, loss=self.loss,
                         rto_ms=self.rto_ms, queue_bytes=self.queue_bytes,
                         seed=self.seed if seed is None else seed)

    def __repr__(self) -> str:
        rate = "unlimited" if self.trace is None else self.trace.name
        return (f"LinkModel({rate}, delay_ms={self.delay_ms:g}, jitter_ms={self.jitter_ms:g}, "
                f"loss={self.loss:g})")

    # ------------------------------------------------------------------ run-time changes
    def set_trace(self, trace: TraceLike, now: float | None = None) -> None:
        """Serialise from now on through ``trace`` (its time 0 at ``now``; default: the last time seen).

        Messages already accepted keep the times they were given.
        """
        new = _as_trace(trace)
        now = self._clock(now)
        self.trace, self._origin = new, now

    def set_delay(self, delay_ms: float) -> None:
        """Change the one-way delay for messages sent from now on."""
        self.delay_ms = _number("delay_ms", delay_ms, hint="one-way delay in milliseconds")

    # ------------------------------------------------------------------ queries
    @property
    def busy_until(self) -> float:
        """When the last accepted message has been fully sent (the link is free from then on)."""
        return self._busy_until

    def _clock(self, now: float | None) -> float:
        if now is None:
            return self._last_now
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise LinkError(f"`now` must be a finite number of seconds, got {now!r}.")
        if now < self._last_now - 1e-12:
            raise LinkError(f"time went backwards: `now` {now!r} s after {self._last_now!r} s. "
                            f"HINT: a LinkModel takes calls in time order; reset() starts over")
        self._last_now = max(self._last_now, float(now))
        while self._queue and self._queue[0][0] <= self._last_now:
            self._queued -= self._queue.popleft()[1]
        return self._last_now

    def _serialise(self, start: float, nbytes: int) -> float:
        if self.trace is None or nbytes <= 0:
            return start
        return self._origin + self.trace.finish_time(start - self._origin, 8.0 * nbytes)

    def backlog_bytes(self, now: float | None = None) -> int:
        """Bytes accepted and not yet fully sent at ``now`` (a message counts in full until its last bit).

        Like :meth:`transmit`, this moves the model's clock to ``now``.
        """
        self._clock(now)
        return self._queued

    def admit_time(self, nbytes: int, now: float | None = None) -> float:
        """The earliest time >= ``now`` at which ``nbytes`` fit in the queue (``inf`` if they never do).

        Like :meth:`transmit`, this moves the model's clock to ``now``.
        """
        now = self._clock(now)
        if self.queue_bytes is None or self._queued + nbytes <= self.queue_bytes:
            return now
        if nbytes > self.queue_bytes:
            return math.inf
        room = self._queued
        for finish, n in self._queue:
            room -= n
            if room + nbytes <= self.queue_bytes:
                return finish
        return self._busy_until  # not reached: the queue empties at busy_until

    def estimate(self, nbytes: int, now: float | None = None) -> float:
        """When ``nbytes`` sent at ``now`` would arrive, without loss or jitter; changes nothing.

        The queue limit is ignored (the answer is for a message that is let in). ``now``
        defaults to the last time seen and is not recorded.
        """
        if now is None:
            now = self._last_now
        elif isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise LinkError(f"`now` must be a finite number of seconds, got {now!r}.")
        return self._serialise(max(now, self._busy_until), nbytes) + self.delay_ms / 1e3

    # ------------------------------------------------------------------ sending
    def transmit(self, nbytes: int, now: float | None = None, *, reliable: bool = False) -> Transmission:
        """Send one message of ``nbytes`` at ``now``; returns when it starts, finishes and arrives.

        Args:
            nbytes: message size in bytes (>= 0).
            now: model time in seconds, not earlier than the previous call's; default the last one.
            reliable: a lost transmission is repeated (extra serialisation + ``rto_ms``) instead
                of losing the message, as TCP does.

        Raises:
            LinkError: ``nbytes`` < 0, or ``now`` earlier than a previous call's.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise LinkError(f"`nbytes` must be an int >= 0, got {nbytes!r}.")
        now = self._clock(now)
        if self.queue_bytes is not None and self._queued + nbytes > self.queue_bytes:
            return Transmission(nbytes, now, now, now, None, attempts=0, dropped=True)
        start = max(now, self._busy_until)
        finish = self._serialise(start, nbytes)
        attempts, lost = 1, False
        if self.loss > 0:
            if reliable:
                while attempts < MAX_ATTEMPTS and self._rng.random() < self.loss:
                    attempts += 1
                    finish = self._serialise(finish, nbytes)
            else:
                lost = self._rng.random() < self.loss
        jitter = self._rng.uniform(0.0, self.jitter_ms) if self.jitter_ms > 0 else 0.0
        self._busy_until = finish
        if finish > now:
            self._queue.append((finish, nbytes))
            self._queued += nbytes
        arrival = None if lost else finish + (self.delay_ms + jitter + (attempts - 1) * self.rto_ms) / 1e3
        return Transmission(nbytes, now, start, finish, arrival, attempts=attempts, lost=lost)

    def replay(self, sends: Iterable[tuple[float, int]], *, reliable: bool = False) -> list[Transmission]:
        """:meth:`transmit` for each ``(now, nbytes)`` in order (a whole schedule on the virtual clock)."""
        return [self.transmit(n, t, reliable=reliable) for t, n in sends]


# ====================================================================== the proxy
ModelLike = LinkModel | BandwidthTrace | float | int | None


def _as_model(model: ModelLike) -> LinkModel:
    return model if isinstance(model, LinkModel) else LinkModel(model)


@dataclass(frozen=True)
class LinkCounters:
    """Traffic through a :class:`LinkProxy` so far (bytes and packets delivered per direction).

    ``up`` is client -> target, ``down`` target -> client; ``retransmits`` counts the extra
    transmissions the loss model charged.
    """

    up_bytes: int
    down_bytes: int
    up_packets: int
    down_packets: int
    retransmits: int
    connections: int
    open_connections: int


class _Direction:
    """One direction of the proxy: its model and counters, shared by every connection."""

    def __init__(self, model: LinkModel) -> None:
        self.model = model
        self.bytes = 0
        self.packets = 0
        self.retransmits = 0


class _Pipe:
    """One connection's packets in one direction: scheduled, not yet written."""

    def __init__(self) -> None:
        self.items: deque[tuple[float, object]] = deque()  # (arrival in model time, bytes | _EOF)
        self.buffered = 0
        self.ready = asyncio.Event()  # items is not empty
        self.room = asyncio.Event()  # buffered went down


_EOF = object()


class LinkProxy:
    """A TCP proxy on 127.0.0.1 that delays each direction's bytes through a :class:`LinkModel`.

    Every connection accepted on ``listen_host:port`` is forwarded to ``target_host:target_port``.
    Bytes read from one side are cut into packets of at most ``packet_bytes``, each sent through
    that direction's model (reliable mode: loss costs retransmissions, never bytes) at the current
    model time, and written to the other side when the model says it arrives, in order (a late
    packet holds back the ones after it, as in TCP). All connections share the two models: the link
    is one bottleneck per direction. A side that closes its writing half has that EOF forwarded
    after its last byte; the connection is closed when both directions ended, and aborted on
    both sides when either side errors or resets.

    Backpressure: reading from a side pauses while ``buffer_bytes`` of it wait in the proxy, or
    while the model's queue (``queue_bytes``) is full, so the sender's socket buffers fill up.

    The model clock is ``loop.time()`` minus the start time minus time spent down: an outage
    (:meth:`set_down`) freezes the link, traces included, and it resumes where it stopped. With
    ``reset=True`` an outage instead aborts every connection and refuses new ones until it ends.

    Args:
        target_port: port of the server to forward to.
        uplink: client -> target link: a :class:`LinkModel`, a :class:`BandwidthTrace`, a rate
            in Mbit/s, or ``None`` (no shaping).
        downlink: target -> client link, same forms; default a clone of ``uplink`` (seed + 1).
            Passing the same :class:`LinkModel` as ``uplink`` makes one half-duplex link.
        target_host: host of the server (127.0.0.1).
        listen_host: address to listen on (127.0.0.1).
        listen_port: port to listen on; 0 picks a free one (:attr:`port` after :meth:`start`).
        packet_bytes: the unit the models see (1500, an Ethernet MTU, as mahimahi).
        buffer_bytes: most bytes of one connection and direction held by the proxy.

    Raises:
        LinkError: an argument out of range.

    Example:
        >>> async def main():
        ...     async with LinkProxy(9, uplink=LinkModel(8.0, delay_ms=20.0)) as proxy:
        ...         return proxy.port > 0
        >>> asyncio.run(main())
        True
    """

    def __init__(self, target_port: int, uplink: ModelLike = None, downlink: ModelLike = None, *,
                 target_host: str = "127.0.0.1", listen_host: str = "127.0.0.1", listen_port: int = 0,
                 packet_bytes: int = 1500, buffer_bytes: int = 1 << 20) -> None:
        for name, value, low in (("target_port", target_port, 1), ("listen_port", listen_port, 0),
                                 ("packet_bytes", packet_bytes, 1), ("buffer_bytes", buffer_bytes, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LinkError(f"`{name}` must be an int >= {low}, got {value!r}.")
        if target_port > 65535 or listen_port > 65535:
            raise LinkError(f"ports must be <= 65535, got {target_port} and {listen_port}.")
        self.target_host, self.target_port = target_host, target_port
        self.listen_host, self.listen_port = listen_host, listen_port
        self.packet_bytes, self.buffer_bytes = packet_bytes, max(buffer_bytes, packet_bytes)
        up = _as_model(uplink)
        if downlink is None:
            down = up.clone(seed=up.seed + 1)
        else:
            down = _as_model(downlink)
        for model in (up, down):
            if model.queue_bytes is not None and model.queue_bytes < packet_bytes:
                raise LinkError(f"`queue_bytes` {model.queue_bytes} of {model!r} is smaller than one packet "
                                f"({packet_bytes} bytes). HINT: raise queue_bytes or lower packet_bytes")
        self._uplink, self._downlink = _Direction(up), _Direction(down)
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._connections = 0
        self._t0 = 0.0
        self._paused = 0.0  # seconds spent down, before the current outage
        self._down_since: float | None = None
        self._reset_while_down = False
        self._up_event: asyncio.Event | None = None
        self._outage_timer: asyncio.TimerHandle | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Listen; returns the port (also :attr:`port`). Resets both models (their clocks restart at 0)."""
        if self._server is not None:
            raise LinkError("this LinkProxy is already started. HINT: one start() per stop()")
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        self._up_event = asyncio.Event()
        self._up_event.set()
        self._t0 = self._loop.time()
        self._paused, self._down_since, self._reset_while_down = 0.0, None, False
        for d in (self._uplink, self._downlink):
            d.model.reset()  # model time restarts at 0 with the proxy
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and abort every open connection (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        if self._outage_timer is not None:
            self._outage_timer.cancel()
            self._outage_timer = None
        self._abort_all()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> LinkProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def run_in_thread(self) -> LinkProxyThread:
        """Start this proxy in a background thread with its own event loop (see :class:`LinkProxyThread`)."""
        return LinkProxyThread(self).start()

    # ------------------------------------------------------------------ control (any thread)
    def _call(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the proxy's loop: directly from its thread, else through the loop and wait."""
        if self._server is None or self._thread_id == threading.get_ident() or self._loop.is_closed():
            return fn()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the calling thread
                done.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return done.result(timeout=30)

    def _directions(self, direction: str) -> list[_Direction]:
        if direction not in ("both", "up", "down"):
            raise LinkError(f"`direction` must be 'both', 'up' or 'down', got {direction!r}.")
        pairs = (("up", self._uplink), ("down", self._downlink))
        return [d for name, d in pairs if direction in (name, "both")]

    @property
    def uplink(self) -> LinkModel:
        """The client -> target model."""
        return self._uplink.model

    @property
    def downlink(self) -> LinkModel:
        """The target -> client model."""
        return self._downlink.model

    def set_trace(self, trace: TraceLike, direction: str = "both") -> None:
        """Serialise from now on through ``trace`` (a trace, a rate in Mbit/s, or ``None``: unlimited).

        Packets already scheduled keep their times; the trace's time 0 is now. Thread-safe.
        """
        trace = _as_trace(trace)
        targets = self._directions(direction)

        def apply() -> None:
            now = self._now()
            for d in targets:
                d.model.set_trace(trace, now)

        self._call(apply)

    def set_rate(self, mbps: float | None, direction: str = "both") -> None:
        """A fixed rate in Mbit/s from now on (``None``: unlimited). Thread-safe."""
        self.set_trace(mbps, direction)

    def set_delay(self, delay_ms: float, direction: str = "both") -> None:
        """A new one-way delay for packets sent from now on. Thread-safe."""
        _number("delay_ms", delay_ms)
        targets = self._directions(direction)
        self._call(lambda: [d.model.set_delay(delay_ms) for d in targets])

    @property
    def down(self) -> bool:
        """Whether an outage is on."""
        return self._down_since is not None

    def set_down(self, down: bool = True, *, reset: bool = False) -> None:
        """Start (``down=True``) or end an outage. Thread-safe.

        Args:
            down: start or end the outage.
            reset: on start, abort every open connection (both sides get a reset) and refuse new
                ones until the outage ends; otherwise the link stalls: nothing is read, sent or
                delivered, and everything resumes when it ends (a client's deadline may expire).
        """
        self._call(lambda: self._set_down(bool(down), reset))

    def outage(self, seconds: float, *, reset: bool = False) -> None:
        """An outage that ends by itself after ``seconds`` (see :meth:`set_down`). Thread-safe."""
        seconds = _number("seconds", seconds)

        def begin() -> None:
            self._set_down(True, reset)
            self._outage_timer = self._loop.call_later(seconds, self._set_down, False, False)

        self._call(begin)

    def _set_down(self, down: bool, reset: bool) -> None:
        if self._loop is None:
            raise LinkError("the LinkProxy is not started. HINT: start() (or run_in_thread()) first")
        if self._outage_timer is not None:
            self._outage_timer.cancel()
            self._outage_timer = None
        now = self._loop.time()
        if down:
            if self._down_since is None:
                self._down_since = now
                self._up_event.clear()
            self._reset_while_down = self._reset_while_down or reset
            if reset:
                self._abort_all()
        elif self._down_since is not None:
            self._paused += now - self._down_since
            self._down_since = None
            self._reset_while_down = False
            self._up_event.set()

    def counters(self) -> LinkCounters:
        """Bytes and packets delivered per direction, and connections. Thread-safe (a snapshot)."""
        up, down = self._uplink, self._downlink
        return LinkCounters(up.bytes, down.bytes, up.packets, down.packets,
                            up.retransmits + down.retransmits, self._connections,
                            len(self._writers) // 2)

    # ------------------------------------------------------------------ clock
    def _now(self) -> float:
        """Model time: seconds since start, not counting outages (frozen during one)."""
        if self._loop is None:
            return 0.0
        t = self._loop.time() if self._down_since is None else self._down_since
        return max(0.0, t - self._t0 - self._paused)

    # ------------------------------------------------------------------ connections
    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            if self._down_since is not None and self._reset_while_down:
                client_writer.transport.abort()  # refused while the link is down
                return
            try:
                server_reader, server_writer = await asyncio.open_connection(self.target_host,
                                                                             self.target_port)
            except OSError:
                client_writer.transport.abort()
                return
            self._connections += 1
            self._writers.update((client_writer, server_writer))
            try:
                await self._relay(client_reader, client_writer, server_reader, server_writer)
            finally:
                self._writers.discard(client_writer)
                self._writers.discard(server_writer)
        except asyncio.CancelledError:  # stop(); ending cancelled trips asyncio's stream callback (3.11)
            client_writer.transport.abort()
        finally:
            self._tasks.discard(task)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                     server_reader: asyncio.StreamReader, server_writer: asyncio.StreamWriter) -> None:
        pumps = [asyncio.ensure_future(self._pump(client_reader, server_writer, self._uplink)),
                 asyncio.ensure_future(self._pump(server_reader, client_writer, self._downlink))]
        clean = False
        try:
            pending, failed = set(pumps), False
            while pending and not failed:  # both directions end (EOF), or one fails and takes the other down
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = any(p.cancelled() or p.exception() is not None for p in done)
            clean = not failed
        finally:
            for p in pumps:
                p.cancel()
            for writer in (client_writer, server_writer):
                if clean:
                    writer.close()
                else:
                    writer.transport.abort()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Direction) -> None:
        """Read from ``src``, schedule packets through ``link``, write them to ``dst`` when they arrive."""
        pipe = _Pipe()
        deliver = asyncio.ensure_future(self._deliver(pipe, dst, link))
        me = asyncio.current_task()
        # the writing side failed (reset, closed): stop reading too, wherever the reader waits
        deliver.add_done_callback(lambda d: None if d.cancelled() or d.exception() is None else me.cancel())
        try:
            while True:
                await self._up_event.wait()  # an outage stalls reading too
                data = await src.read(max(self.packet_bytes, 1 << 16))
                if not data:
                    break
                view = memoryview(data)
                for off in range(0, len(view), self.packet_bytes):
                    packet = view[off:off + self.packet_bytes]
                    await self._admit(pipe, link.model, len(packet))
                    tx = link.model.transmit(len(packet), self._now(), reliable=True)
                    link.retransmits += tx.attempts - 1
                    pipe.buffered += len(packet)
                    pipe.items.append((tx.arrival, packet))
                    pipe.ready.set()
            pipe.items.append((self._now(), _EOF))  # after the last packet, whatever its time
            pipe.ready.set()
            await deliver
        finally:
            deliver.cancel()

    async def _admit(self, pipe: _Pipe, model: LinkModel, nbytes: int) -> None:
        """Wait for the link to be up, for room in this connection's buffer and in the model's queue."""
        while True:
            if not self._up_event.is_set():
                await self._up_event.wait()
                continue
            if pipe.buffered and pipe.buffered + nbytes > self.buffer_bytes:
                pipe.room.clear()
                await pipe.room.wait()
                continue
            now = self._now()
            at = model.admit_time(nbytes, now)
            if at <= now:
                return
            await asyncio.sleep(at - now)

    async def _deliver(self, pipe: _Pipe, dst: asyncio.StreamWriter, link: _Direction) -> None:
        while True:
            if not pipe.items:
                pipe.ready.clear()
                await pipe.ready.wait()
                continue
            if not self._up_event.is_set():
                await self._up_event.wait()
                continue
            now = self._now()
            if pipe.items[0][0] > now:
                await asyncio.sleep(pipe.items[0][0] - now)
                continue  # an outage may have begun meanwhile: look again
            # everything due by now goes out in one write; a packet due later holds back those after it
            batch, nbytes, eof = [], 0, False
            while pipe.items and pipe.items[0][0] <= now:
                _, packet = pipe.items.popleft()
                if packet is _EOF:
                    eof = True
                    break
                batch.append(packet)
                nbytes += len(packet)
            if batch:
                link.bytes += nbytes  # delivered: handed to the receiving socket (counted first: the
                link.packets += len(batch)  # receiver may see the bytes before this thread runs again)
                dst.write(b"".join(batch))
                await dst.drain()
                pipe.buffered -= nbytes
                pipe.room.set()
            if eof:
                if dst.can_write_eof():
                    dst.write_eof()
                    await dst.drain()
                return


class LinkProxyThread:
    """Runs a :class:`LinkProxy` in a daemon thread with its own event loop, for synchronous code.

    The proxy's control methods (:meth:`LinkProxy.set_rate`, :meth:`LinkProxy.set_down`, ...)
    are thread-safe, so the caller keeps using ``handle.proxy``.

    Example:
        >>> with LinkProxy(9, uplink=8.0).run_in_thread() as handle:
        ...     handle.port > 0
        True
    """

    def __init__(self, proxy: LinkProxy) -> None:
        self.proxy = proxy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        if self.proxy.port is None:
            raise LinkError("the proxy thread is not started. HINT: start() first")
        return self.proxy.port

    def start(self, timeout: float = 10.0) -> LinkProxyThread:
        """Start the thread and the proxy; returns once it listens.

        Raises:
            LinkError: it did not start within ``timeout`` seconds, or ``start()`` failed.
        """
        if self._thread is not None:
            raise LinkError("this LinkProxyThread is already started.")
        self._thread = threading.Thread(target=self._run, name=f"LinkProxy->{self.proxy.target_port}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise LinkError(f"the link proxy did not start within {timeout} s.")
        if self._error is not None:
            raise LinkError(f"the link proxy failed to start: {self._error}") from self._error
        return self

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self.proxy.start())
            except BaseException as e:  # noqa: BLE001 - reported by start()
                self._error = e
                return
            finally:
                self._ready.set()
            loop.run_forever()
            loop.run_until_complete(self.proxy.stop())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the proxy (aborting open connections) and join the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:  # closed in between
                pass
        thread.join(timeout)

    def __enter__(self) -> LinkProxyThread:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
