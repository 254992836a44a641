"""The proxy: a TCP proxy on 127.0.0.1 that applies one :class:`LinkModel` per direction to the
real byte stream, cut into packets, on the monotonic clock; :class:`LinkProxyThread` runs one in a
background thread for synchronous code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nestflex.testing.link.errors import LinkError, check_number
from nestflex.testing.link.model import LinkModel
from nestflex.testing.link.trace import BandwidthTrace, TraceLike, as_trace

__all__ = ["LinkCounters", "LinkProxy", "LinkProxyThread", "ModelLike"]

ModelLike = LinkModel | BandwidthTrace | float | int | None


def _as_model(model: ModelLike) -> LinkModel:
    return model if isinstance(model, LinkModel) else LinkModel(model)


@dataclass(frozen=True)
class LinkCounters:
    """Traffic through a :class:`LinkProxy` so far (bytes and packets delivered per direction).

    ``up`` is client -> target, ``down`` target -> client. Counts are totals since the proxy
    started, over every connection; :meth:`LinkProxy.counters` takes the snapshot.

    Attributes:
        up_bytes: payload bytes (TCP stream bytes, no headers) delivered to the target.
        down_bytes: payload bytes delivered to the client.
        up_packets: packets (of at most the proxy's ``packet_bytes``) delivered to the target.
        down_packets: packets delivered to the client.
        retransmits: extra transmissions the loss model charged, both directions together
            (a packet sent ``k`` times adds ``k - 1``); counted when the packet is scheduled.
        connections: client connections accepted and forwarded to the target (refused or failed
            ones not counted).
        open_connections: connections being relayed at the moment of the snapshot.
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

    Examples:
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
        trace = as_trace(trace)
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
        check_number("delay_ms", delay_ms)
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
        seconds = check_number("seconds", seconds)

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

    Args:
        proxy: the proxy to run, not yet started: :meth:`start` starts it on the thread's loop
            and :meth:`stop` stops it. :meth:`LinkProxy.run_in_thread` builds and starts the
            handle in one call.

    Attributes:
        proxy: the proxy this thread runs.

    Examples:
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
