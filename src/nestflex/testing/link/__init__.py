"""Trace-driven network emulation in user space: a link model and a TCP proxy on 127.0.0.1.

Split inference (SPINN, DynO) is judged at given bandwidths and on real bandwidth traces, and the
kernel's traffic shaping (netem, tc) needs root. This package emulates the link in the process:

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

Modules: :mod:`.trace` (bandwidth traces), :mod:`.model` (the link model), :mod:`.proxy` (the
TCP proxy and its thread), :mod:`.errors` (:class:`LinkError`).

Examples:
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

from nestflex.testing.link.errors import LinkError
from nestflex.testing.link.model import MAX_ATTEMPTS, LinkModel, Transmission
from nestflex.testing.link.proxy import LinkCounters, LinkProxy, LinkProxyThread, ModelLike
from nestflex.testing.link.trace import BandwidthTrace, TraceLike

__all__ = [
    "LinkError",
    "BandwidthTrace",
    "Transmission",
    "LinkModel",
    "LinkCounters",
    "LinkProxy",
    "LinkProxyThread",
    "MAX_ATTEMPTS",
    "TraceLike",
    "ModelLike",
]
