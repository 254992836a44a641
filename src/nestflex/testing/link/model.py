"""The link model: one direction of a link as a pure, deterministic function of (virtual) time:
FIFO serialisation through a bandwidth trace, propagation delay, seeded jitter and loss, and an
optional drop-tail queue."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from nestflex.testing.link.errors import LinkError, check_number
from nestflex.testing.link.trace import TraceLike, as_trace

__all__ = ["MAX_ATTEMPTS", "Transmission", "LinkModel"]

#: Most transmissions of one message in reliable mode (loss < 1 ends sooner almost surely).
MAX_ATTEMPTS = 64


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
        self.trace = as_trace(trace)
        self.delay_ms = check_number("delay_ms", delay_ms, hint="one-way delay in milliseconds; RTT = 2 x delay")
        self.jitter_ms = check_number("jitter_ms", jitter_ms)
        self.loss = check_number("loss", loss, hint="a probability in [0, 1)")
        if self.loss >= 1:
            raise LinkError(f"`loss` must be < 1, got {loss!r}. "
                            f"HINT: a dead link is an outage: LinkProxy.set_down")
        self.rto_ms = check_number("rto_ms", rto_ms)
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
        new = as_trace(trace)
        now = self._clock(now)
        self.trace, self._origin = new, now

    def set_delay(self, delay_ms: float) -> None:
        """Change the one-way delay for messages sent from now on."""
        self.delay_ms = check_number("delay_ms", delay_ms, hint="one-way delay in milliseconds")

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
