"""Network emulation (nestflex.testing.link): the link model on a virtual clock, trace files, and the
TCP proxy on real loopback sockets (plain asyncio streams, a threaded client, gRPC)."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import socketserver
import statistics
import threading
import time
from pathlib import Path

import pytest

from nestflex.testing.link import BandwidthTrace, LinkError, LinkModel, LinkProxy, Transmission
from nestflex.errors import NestflexError

TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-12)


# ====================================================================== the model, virtual clock
@pytest.mark.parametrize("nbytes, mbps, delay_ms", [
    (1, 1.0, 0.0), (200_000, 8.0, 20.0), (1_000_000, 100.0, 5.0), (12_345, 0.3, 150.0), (0, 5.0, 7.0)])
def test_constant_rate_takes_8n_over_r_microseconds_plus_the_delay(nbytes, mbps, delay_ms):
    link = LinkModel(mbps, delay_ms=delay_ms)
    tx = link.transmit(nbytes, now=3.0)
    assert tx.start == 3.0 and tx.finish == approx(3.0 + 8 * nbytes / mbps / 1e6)
    assert tx.arrival == approx(3.0 + 8 * nbytes / mbps / 1e6 + delay_ms / 1e3)
    assert tx.delivered and tx.attempts == 1 and not tx.lost and not tx.dropped
    assert LinkModel(None, delay_ms=delay_ms).transmit(nbytes, 3.0).arrival == approx(3.0 + delay_ms / 1e3)


def test_a_zero_rate_interval_holds_delivery_until_it_ends():
    trace = BandwidthTrace([0.0, 1.0, 2.0], [8.0, 0.0, 8.0])  # period 3 s: the last sample lasts 1 s
    assert trace.period == 3.0 and trace.rate(1.5) == 0.0 and trace.mean_mbps == approx(16 / 3)
    link = LinkModel(trace, delay_ms=10.0)
    # 8 Mbit from t=0.5: 4 Mbit by t=1, nothing in [1, 2), the other 4 Mbit by t=2.5
    tx = link.transmit(1_000_000, now=0.5)
    assert tx.finish == approx(2.5) and tx.arrival == approx(2.51)
    # sent inside the silent interval of the next loop: waits for t=5, then 1 ms
    tx = link.transmit(1000, now=4.2)
    assert tx.start == 4.2 and tx.finish == approx(5.001)
    # a message that ends exactly where a silent interval begins is not pushed past it
    assert LinkModel(trace).transmit(1_000_000, now=0.0).finish == approx(1.0)


def test_fifo_a_message_waits_for_the_ones_before_it():
    link = LinkModel(8.0, delay_ms=20.0)
    txs = link.replay([(0.0, 10_000), (0.0, 20_000), (0.005, 10_000)])
    assert [t.start for t in txs] == [0.0, approx(0.01), approx(0.03)]
    assert [t.finish for t in txs] == [approx(0.01), approx(0.03), approx(0.04)]
    assert [t.arrival for t in txs] == [approx(0.03), approx(0.05), approx(0.06)]
    assert link.busy_until == approx(0.04) and link.backlog_bytes(0.02) == 30_000
    idle = link.transmit(1000, now=1.0)  # the link is idle again: no waiting
    assert idle.start == 1.0 and idle.finish == approx(1.001)


def test_the_trace_loops_past_its_end():
    trace = BandwidthTrace([0.0, 1.0], [1.0, 3.0], period=2.0)  # 4 Mbit per period
    assert [trace.rate(t) for t in (0.5, 1.5, 4.5, 5.5, 2000.2, 2001.2)] == [1.0, 3.0, 1.0, 3.0, 1.0, 3.0]
    assert trace.bits_until(4.0) == approx(8e6) and trace.bits_until(5.5) == approx(10.5e6)
    # 10 Mbit from t=0: two whole periods (8 Mbit by t=4), 1 Mbit in [4, 5), 1 Mbit at 3 Mbit/s
    assert LinkModel(trace).transmit(1_250_000, now=0.0).finish == approx(5 + 1 / 3)
    assert trace.finish_time(3.5, 0) == 3.5
    # the last sample lasts as long as the gap before it
    assert BandwidthTrace([0.0, 1.0, 3.0], [1.0, 1.0, 1.0]).period == 5.0


def test_loss_and_jitter_are_deterministic_under_a_seed():
    def run(seed, reliable):
        link = LinkModel(10.0, delay_ms=5.0, jitter_ms=4.0, loss=0.2, rto_ms=100.0, seed=seed)
        return link.replay([(i * 0.01, 1500) for i in range(300)], reliable=reliable)

    a, b, c = run(7, False), run(7, False), run(8, False)
    assert a == b and a != c
    lost = sum(t.lost for t in a)
    assert 30 < lost < 90  # ~20 % of 300
    for t in a:
        if t.delivered:
            assert t.finish + 0.005 <= t.arrival <= t.finish + 0.009 + 1e-12  # jitter in [0, 4] ms
    r = run(7, True)
    assert r == run(7, True) and all(t.delivered for t in r) and sum(t.attempts - 1 for t in r) > 30
    for t in r:  # each loss costs one more serialisation (1.2 ms) and one RTO
        assert t.finish - t.start == approx(t.attempts * 1500 * 8 / 10e6)
        extra = t.arrival - t.finish - 0.005 - (t.attempts - 1) * 0.1
        assert -1e-9 <= extra <= 0.004 + 1e-9
    assert LinkModel(10.0, loss=0.2, seed=3).clone().replay([(0, 10)] * 50) == \
        LinkModel(10.0, loss=0.2, seed=3).replay([(0, 10)] * 50)


def test_drop_tail_queue_and_admission_time():
    link = LinkModel(8.0, queue_bytes=3000)  # 1500 bytes take 1.5 ms
    first, second, third = link.replay([(0.0, 1500), (0.0, 1500), (0.0, 1500)])
    assert first.delivered and second.delivered
    assert third.dropped and third.arrival is None and third.attempts == 0
    assert link.busy_until == approx(0.003)  # the dropped one did not use the link
    assert link.admit_time(1500, 0.0) == approx(0.0015)  # the first one has left by then
    assert link.admit_time(3001, 0.0) == float("inf")
    assert link.transmit(1500, 0.0016).start == approx(0.003)


def test_trace_and_delay_change_at_run_time_and_estimate_changes_nothing():
    link = LinkModel(1.0, delay_ms=50.0)
    assert link.estimate(125_000, 0.0) == approx(1.05)
    assert link.backlog_bytes(0.0) == 0 and link.busy_until == 0.0  # estimate sent nothing
    link.transmit(125_000, 0.0)  # 1 s at 1 Mbit/s
    link.set_trace(BandwidthTrace([0.0, 0.25], [0.0, 10.0], period=10.0), now=0.5)
    link.set_delay(0.0)
    # the accepted message keeps its time; the next starts at 1.0, i.e. 0.5 s into the new trace
    assert link.transmit(12_500, 0.6).finish == approx(1.01)
    with pytest.raises(LinkError, match="backwards"):
        link.transmit(10, 0.1)


@pytest.mark.parametrize("kwargs, match", [
    ({"delay_ms": -1.0}, "delay_ms"), ({"loss": 1.0}, "loss"), ({"jitter_ms": float("nan")}, "jitter_ms"),
    ({"queue_bytes": 0}, "queue_bytes"), ({"trace": "fast"}, "BandwidthTrace"),
    ({"trace": 0.0}, "constant rate"),
])
def test_bad_model_arguments_say_what_to_fix(kwargs, match):
    with pytest.raises(LinkError, match=match):
        LinkModel(**kwargs)


def test_bad_trace_arguments():
    with pytest.raises(LinkError, match="every rate is 0"):
        BandwidthTrace([0.0, 1.0], [0.0, 0.0])
    with pytest.raises(LinkError, match="first sample"):
        BandwidthTrace([1.0], [1.0])
    with pytest.raises(LinkError, match="period"):
        BandwidthTrace([0.0, 2.0], [1.0, 1.0], period=2.0)
    assert issubclass(LinkError, NestflexError)


# ====================================================================== trace files
def test_trace_file_round_trip_comments_and_shift(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# a comment\n10.0\t2.5\n\n10.5 0.0  # silent\n11.0\t4\n")
    trace = BandwidthTrace.load(path)
    assert trace.times == (0.0, 0.5, 1.0) and trace.mbps == (2.5, 0.0, 4.0) and trace.period == 1.5
    assert str(path) in repr(trace) and len(trace) == 3
    assert BandwidthTrace.load(path, period=4.0).period == 4.0
    assert trace.scaled(2.0).mbps == (5.0, 0.0, 8.0)


@pytest.mark.parametrize("text, line, words", [
    ("0\t1\n1\t2\t3\n", 2, ["2 columns", "'1\\t2\\t3'"]),
    ("0\t1\n1\tfast\n", 2, ["not two numbers", "fast"]),
    ("0\t1\n1\t-2.5\n", 2, ["throughput -2.5", "negative"]),
    ("-1\t1\n", 1, ["time -1", "negative"]),
    ("0\t1\n2\t1\n2\t3\n", 3, ["time 2 s", "not later"]),
    ("0\t1\n3\t1\n2\t3\n", 3, ["time 2 s", "not later"]),
    ("0\tinf\n", 1, ["not finite"]),
])
def test_malformed_trace_lines_name_file_line_value_and_fix(tmp_path, text, line, words):
    path = tmp_path / "bad_trace"
    path.write_text(text)
    with pytest.raises(LinkError) as e:
        BandwidthTrace.load(path)
    msg = str(e.value)
    assert f"{path}:{line}:" in msg and "HINT:" in msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize("text, words", [("", "no samples"), ("# only a comment\n\n", "no samples"),
                                         ("0\t0\n1\t0\n", "every rate is 0")])
def test_empty_or_silent_trace_files(tmp_path, text, words):
    path = tmp_path / "empty"
    path.write_text(text)
    with pytest.raises(LinkError, match=words) as e:
        BandwidthTrace.load(path)
    assert str(path) in str(e.value) and "HINT:" in str(e.value)


def test_missing_trace_file(tmp_path):
    with pytest.raises(LinkError, match="cannot read") as e:
        BandwidthTrace.load(tmp_path / "nope")
    assert "nope" in str(e.value) and "HINT:" in str(e.value)


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/data/traces is not there")
def test_the_shared_traces_parse_and_replay():
    files = sorted(p for p in TRACES.glob("*/*") if p.is_file() and p.name != "README.md")
    assert {p.parent.name for p in files} >= {"norway", "fcc"}
    zeros = 0
    for path in files:
        trace = BandwidthTrace.load(path)
        assert len(trace) > 10 and trace.period > 60 and 0 < trace.mean_mbps < 100, path
        zeros += trace.mbps.count(0.0)
        # a 1 MB frame sent every 10 s over two loops of the trace: every one arrives, in order
        link = LinkModel(trace, delay_ms=40.0)
        txs = link.replay([(float(t), 1_000_000) for t in range(0, int(2 * trace.period), 10)])
        assert all(t.delivered for t in txs)
        assert all(b.arrival > a.arrival for a, b in itertools.pairwise(txs))
    assert zeros > 0  # the FCC traces have 0 Mbit/s samples


# ====================================================================== the proxy, real sockets
def run(coro, timeout=30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def echo_server():
    async def handle(reader, writer):
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def echo_through(port, payload):
    """Send ``payload`` through the proxy to the echo server; seconds until all of it came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()

    async def send():
        writer.write(payload)
        await writer.drain()

    sender = asyncio.ensure_future(send())
    back = await reader.readexactly(len(payload))
    elapsed = time.perf_counter() - start
    await sender
    assert back == payload
    writer.close()
    return elapsed


class _Recording(LinkModel):
    """A LinkModel that keeps every transmission the proxy asked it for: the proxy's schedule can then
    be checked on the model's virtual clock, where a busy machine changes nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[Transmission] = []

    def transmit(self, nbytes, now=None, *, reliable=False):
        tx = super().transmit(nbytes, now, reliable=reliable)
        self.sent.append(tx)
        return tx


async def _until(condition, timeout=10.0):
    """Wait for ``condition()`` (a counter reaching its value) instead of sleeping a guessed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def _ceiling(model_s, overhead_s):
    """The one wall-clock upper bound the proxy tests keep: 10x (the model's time + the median time
    the same bytes took with no shaping, measured in the same test). A proxy that holds data for
    good, or for several times its model's delay, fails it; a slow or busy machine, which slows the
    calibration too, does not."""
    return 10.0 * (model_s + overhead_s)


async def _median_echo_s(port, nbytes, runs=3):
    return statistics.median([await echo_through(port, os.urandom(nbytes)) for _ in range(runs)])


def _check_schedule(sent, nbytes, mbps, packet_bytes):
    """On the virtual clock: the bytes went in packets, each serialised at the model's rate, in FIFO order."""
    assert sum(t.nbytes for t in sent) == nbytes and all(0 < t.nbytes <= packet_bytes for t in sent)
    for t in sent:
        assert t.finish - t.start == approx(8 * t.nbytes / mbps / 1e6)
    for a, b in itertools.pairwise(sent):
        assert b.start >= a.finish - 1e-12  # one packet on the wire at a time
    return sent[-1].finish - sent[0].start


def test_proxy_shapes_a_200kb_echo_at_8_mbits_and_20ms():
    async def main():
        server, port = await echo_server()
        async with server:
            async with LinkProxy(port, None, None) as plain:  # the machine's own overhead, now
                overhead = await _median_echo_s(plain.port, 200_000)
            up, down = _Recording(8.0, delay_ms=20.0), _Recording(8.0, delay_ms=20.0)
            async with LinkProxy(port, up, down) as proxy:
                payload = os.urandom(200_000)
                elapsed = await echo_through(proxy.port, payload)
                # the model: the last byte is up after 8n/R + delay; the echo of the last packet needs
                # one more packet time and delay on the way down (both directions run concurrently)
                model = LinkModel(8.0, 20.0)
                expected = model.estimate(200_000) + model.estimate(proxy.packet_bytes)
                assert expected == approx(0.2 + 0.02 + 0.0015 + 0.02)
                # on the virtual clock: 200 kB took 0.2 s of the uplink and of the downlink
                for sent in (up.sent, down.sent):
                    assert _check_schedule(sent, 200_000, 8.0, proxy.packet_bytes) >= 0.2 - 1e-9
                    assert all(t.arrival == approx(t.finish + 0.02) for t in sent)
                # on the wall clock: never earlier than the model allows (a busy machine only adds);
                # later only within the calibrated ceiling
                assert elapsed >= 0.8 * expected, (elapsed, expected)
                assert elapsed <= _ceiling(expected, overhead), (elapsed, expected, overhead)
                await _until(lambda: proxy.counters().open_connections == 0)
                c = proxy.counters()
                assert (c.up_bytes, c.down_bytes) == (200_000, 200_000) and c.connections == 1
                assert c.up_packets == c.down_packets and c.up_packets >= 200_000 // 1500
                # open_connections reached 0: the client closed, the server followed, the proxy closed both

    run(main())


def test_proxy_without_shaping_charges_no_time_and_shapes_the_downlink_alone():
    async def main():
        server, port = await echo_server()
        up, down = _Recording(None), _Recording(4.0)
        async with server, LinkProxy(port, up, down) as proxy:  # shaped only on the way back
            assert proxy.uplink.trace is None and proxy.downlink.trace.mbps == (4.0,)
            elapsed = await echo_through(proxy.port, os.urandom(50_000))  # 0.1 s down
            # virtual clock: the uplink charged nothing, the downlink 8n/R = 0.1 s
            assert all(t.finish == t.start == t.sent and t.arrival == t.sent for t in up.sent)
            assert sum(t.nbytes for t in up.sent) == 50_000
            assert _check_schedule(down.sent, 50_000, 4.0, proxy.packet_bytes) >= 0.1 - 1e-9
            assert elapsed >= 0.08, elapsed  # held back on the wall clock too
            proxy.set_rate(None)
            n = len(down.sent)
            overhead = await _median_echo_s(proxy.port, 50_000)  # unshaped now: the machine's overhead
            assert len(down.sent) > n and all(t.finish == t.start == t.sent for t in down.sent[n:])
            assert elapsed <= _ceiling(0.1, overhead), (elapsed, overhead)

    run(main())


def test_outage_stalls_then_resumes_and_reset_refuses_connections():
    async def main():
        server, port = await echo_server()
        async with server, LinkProxy(port, LinkModel(None, delay_ms=5.0)) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"a" * 10_000)
            assert await reader.readexactly(10_000) == b"a" * 10_000
            proxy.set_down(True)
            assert proxy.down
            writer.write(b"b" * 10_000)
            pending = asyncio.ensure_future(reader.readexactly(10_000))
            done, _ = await asyncio.wait({pending}, timeout=0.3)
            assert not done  # nothing gets through while the link is down
            proxy.set_down(False)
            assert await asyncio.wait_for(pending, 10.0) == b"b" * 10_000  # resumes where it stopped
            start = time.perf_counter()
            proxy.outage(0.2)  # ends by itself
            writer.write(b"c")
            assert await asyncio.wait_for(reader.readexactly(1), 10.0) == b"c"
            assert time.perf_counter() - start >= 0.15 and not proxy.down  # held for the outage

            proxy.set_down(True, reset=True)  # open connections are cut, new ones refused
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await asyncio.wait_for(reader.readexactly(1), 10.0)
            r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                w2.write(b"x")
                await asyncio.wait_for(r2.readexactly(1), 10.0)
            proxy.set_down(False)
            assert await echo_through(proxy.port, b"back") > 0  # accepted again (and echoed: checked inside)

    run(main())


def test_stop_closes_open_connections():
    async def main():
        server, port = await echo_server()
        async with server:
            proxy = LinkProxy(port, 50.0)
            await proxy.start()
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"hello")
            assert await reader.readexactly(5) == b"hello"
            assert proxy.counters().open_connections == 1
            await proxy.stop()
            await proxy.stop()  # idempotent
            try:
                assert await asyncio.wait_for(reader.read(10), 10.0) == b""
            except ConnectionError:
                pass
            assert proxy.counters().open_connections == 0
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", proxy.port)

    run(main())


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


def _sync_echo(port, nbytes):
    payload = os.urandom(nbytes)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = time.perf_counter()
        threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
        got = bytearray()
        while len(got) < nbytes:
            chunk = s.recv(1 << 16)
            assert chunk
            got += chunk
        elapsed = time.perf_counter() - start
    assert bytes(got) == payload
    return elapsed


def test_thread_runner_for_synchronous_code_and_rate_switch():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up, down = _Recording(100.0), _Recording(100.0)
        with LinkProxy(server.server_address[1], up, down).run_in_thread() as handle:
            fast = statistics.median(_sync_echo(handle.port, 50_000) for _ in range(3))  # the model: ~8 ms
            assert _check_schedule(up.sent, 150_000, 100.0, handle.proxy.packet_bytes) >= 0.012 - 1e-9
            n_up, n_down = len(up.sent), len(down.sent)
            handle.proxy.set_rate(2.0)  # from this thread: marshalled onto the proxy's loop
            handle.proxy.set_delay(10.0, "down")
            assert handle.proxy.downlink.delay_ms == 10.0 and handle.proxy.uplink.delay_ms == 0.0
            slow = _sync_echo(handle.port, 50_000)  # the model: 0.2 s each way, concurrently (~216 ms)
            # the switch took effect on the virtual clock: 50 kB now take 0.2 s in each direction,
            # and the downlink adds its 10 ms
            assert _check_schedule(up.sent[n_up:], 50_000, 2.0, handle.proxy.packet_bytes) >= 0.2 - 1e-9
            assert _check_schedule(down.sent[n_down:], 50_000, 2.0, handle.proxy.packet_bytes) >= 0.2 - 1e-9
            assert all(t.arrival == approx(t.finish + 0.01) for t in down.sent[n_down:])
            # and on the wall clock: held at least the model's time, within the ceiling calibrated
            # on the fast echoes
            assert 0.16 <= slow <= _ceiling(0.216, fast), (fast, slow)
            c = handle.proxy.counters()
            assert c.up_bytes == c.down_bytes == 200_000
        assert handle.proxy.port is not None
        with pytest.raises(LinkError, match="direction"):
            handle.proxy.set_rate(1.0, "sideways")
    finally:
        server.shutdown()
        server.server_close()


def test_proxy_arguments():
    with pytest.raises(LinkError, match="target_port"):
        LinkProxy(0)
    with pytest.raises(LinkError, match="queue_bytes"):
        LinkProxy(80, LinkModel(1.0, queue_bytes=1000))
    proxy = LinkProxy(80, LinkModel(1.0, loss=0.1, seed=4))
    assert proxy.downlink is not proxy.uplink and proxy.downlink.seed == 5 and proxy.downlink.loss == 0.1


def test_grpc_unary_echo_through_the_proxy():
    import grpc  # the serve extra (in dev) installs it: missing is a broken install, not a skip
    from grpc import aio

    async def echo(request, context):
        return request

    async def main():
        server = aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "nestflex.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with LinkProxy(port, LinkModel(8.0, delay_ms=10.0)) as proxy:
                async with aio.insecure_channel(f"127.0.0.1:{proxy.port}",
                                                     options=[("grpc.enable_http_proxy", 0)]) as channel:
                    call = channel.unary_unary("/nestflex.test.Echo/Echo")  # no serializers: bytes
                    await asyncio.wait_for(channel.channel_ready(), 30)
                    payload = os.urandom(100_000)
                    start = time.perf_counter()
                    assert await call(payload, timeout=30) == payload
                    elapsed = time.perf_counter() - start
                    expected = 2 * LinkModel(8.0, 10.0).estimate(100_000)  # 0.1 s + 10 ms each way
                    assert elapsed >= 0.8 * expected, (elapsed, expected)  # shaped: never faster
                    # the ceiling, calibrated on the same call straight to the server (no proxy)
                    async with aio.insecure_channel(f"127.0.0.1:{port}",
                                                    options=[("grpc.enable_http_proxy", 0)]) as direct:
                        plain = direct.unary_unary("/nestflex.test.Echo/Echo")
                        times = []
                        for _ in range(3):
                            t0 = time.perf_counter()
                            assert await plain(payload, timeout=30) == payload
                            times.append(time.perf_counter() - t0)
                    assert elapsed <= _ceiling(expected, statistics.median(times)), (elapsed, expected, times)
                    c = proxy.counters()
                    assert c.up_bytes > 100_000 and c.down_bytes > 100_000

                    proxy.set_down(True)  # a stalled link: the deadline expires
                    with pytest.raises(aio.AioRpcError) as e:
                        await call(b"lost?", timeout=0.3)
                    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    proxy.set_down(False)
                    assert await call(b"back", timeout=30) == b"back"

                    proxy.set_down(True, reset=True)  # connections cut: the call fails, not waits
                    with pytest.raises(aio.AioRpcError) as e:
                        await call(b"cut", timeout=20)
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                    proxy.set_down(False)
        finally:
            await server.stop(None)

    run(main())


def test_transmission_is_a_plain_record():
    tx = Transmission(10, 0.0, 0.0, 1.0, None, lost=True)
    assert not tx.delivered and tx.attempts == 1
