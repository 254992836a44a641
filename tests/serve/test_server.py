"""The gRPC tail server and the device client over real sockets on 127.0.0.1 (issue 22).

Every frame must be answered (DESIGN invariant 8): when the server process is killed, when
requests are dropped or refused, when deadlines expire. A bad request gets an error status and
the server stays up; a cancelled request does no further server work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import nestflex.deploy as nd  # noqa: E402
from nestflex.deploy.split.client import SplitError, TailClient
from nestflex.deploy.codec import encode, fake_quantize  # noqa: E402
from nestflex.deploy.split.offload import Offloader, SplitConfig
from nestflex.deploy.split.network import NetworkProfiler
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime, split_names
from nestflex.deploy.split.wire import RUN_METHOD, request_metadata
from nestflex.deploy.bundle.loader import bundle_id
from nestflex.serve import TailServer  # noqa: E402
from nestflex.serve.server import resolve_providers
from tests.deploy.split_bundle import write_split_bundle  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_split_bundle(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def bundle(path):
    return nd.load(path)


@pytest.fixture(scope="module")
def server(bundle):
    with TailServer(bundle, max_wait_ms=1.0).run_in_thread() as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server, bundle):
    with TailClient(server.address, bundle) as c:
        yield c


def _x(n=1, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


def _send(client, rt, head, bits=None, thresholds=None, deadline_s=5.0):
    frame = encode(list(head.crossing), bits=bits)
    return client.submit(frame, split=rt.split, exit_set="exits", n=int(head.rest.size), num_exits=rt.num_exits,
                         thresholds=thresholds, deadline_s=deadline_s)


def test_device_head_plus_server_tail_answers_the_bundles_logits_at_every_split(bundle, client):
    x = _x(6)
    thr = [1.0, 1.0]  # every sample crosses, so every split is exercised on all of them
    ref = nd.ProgressiveRuntime(bundle, exit_set="exits")(x, thresholds=thr)
    for name in split_names(bundle):
        rt = SplitRuntime(bundle, name, "exits")
        head = rt.head(x, thr)
        reply = _send(client, rt, head, thresholds=thr).result()
        out = rt.combine(head, reply.result)
        np.testing.assert_allclose(out.logits, ref.logits, atol=1e-5, rtol=0, err_msg=name)
        np.testing.assert_array_equal(out.answer_index, ref.answer_index, err_msg=name)
        assert reply.bytes_sent > 0 and reply.rtt_ms >= reply.server_ms > 0


def test_a_quantised_frame_is_answered_as_the_fake_quantised_tensors_would_be(bundle, client):
    x = _x(4, seed=1)
    rt = SplitRuntime(bundle, "features.relu3", "exits")
    head = rt.head(x, [1.0, 1.0])
    reply = _send(client, rt, head, bits=4, thresholds=[1.0, 1.0]).result()
    local = rt.tail([fake_quantize(t, 4) for t in head.crossing], [1.0, 1.0])
    np.testing.assert_allclose(reply.result.logits, local.logits, atol=1e-5, rtol=0)


def _wait_for(condition, timeout=60.0):
    """Wait until ``condition()`` holds (a server counter reaching its value): ordering by the
    server's own counters, not by sleeping a guessed time. ``timeout`` only bounds a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.002)


def _hold_compute(handle):
    """Occupy the server's one compute thread until the returned event is set: requests then wait
    in its queue for as long as the test needs, whatever the machine's speed."""
    gate = threading.Event()
    handle.server._compute.submit(gate.wait)
    return gate


def _raw_call(server, body, metadata, timeout=5.0):
    import grpc

    with grpc.insecure_channel(server.address) as ch:
        return ch.unary_unary(RUN_METHOD)(body, metadata=metadata, timeout=timeout)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "wrong_frame_version", "wrong_protocol", "wrong_bundle",
                                  "wrong_shape", "wrong_split", "too_many_thresholds", "oversized"])
def test_abuse_gets_an_error_status_and_the_server_stays_up(bundle, server, client, kind):
    import grpc

    rt = SplitRuntime(bundle, "features.relu2", "exits")
    head = rt.head(_x(2), [1.0, 1.0])
    frame = encode(list(head.crossing), bits=8)
    md = dict(request_metadata(bundle_id(bundle), rt.split, "exits"))
    body, want = frame, grpc.StatusCode.INVALID_ARGUMENT
    if kind == "garbage":
        body = os.urandom(300)
    elif kind == "truncated":
        body = frame[: len(frame) // 2]
    elif kind == "wrong_frame_version":
        body = frame[:4] + bytes([frame[4] + 1]) + frame[5:]
    elif kind == "wrong_protocol":
        md["nf-protocol"] = "99"
    elif kind == "wrong_bundle":
        md["nf-bundle"] = "0" * 64
        want = grpc.StatusCode.FAILED_PRECONDITION
    elif kind == "wrong_shape":
        body = encode([np.zeros((1, 3, 32, 32), np.float32)], bits=8)
    elif kind == "wrong_split":
        md["nf-split"] = "features.nope"
        want = grpc.StatusCode.FAILED_PRECONDITION
    elif kind == "too_many_thresholds":
        md["nf-thresholds"] = "0.5,0.5,0.5"
    elif kind == "oversized":
        body = b"\0" * (server.server.max_message_bytes + 1)
        want = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(server, body, tuple(md.items()))
    assert err.value.code() == want, err.value.details()
    # still serving
    assert np.isfinite(_send(client, rt, head, bits=8).result().result.logits).all()


def test_a_cancelled_request_does_no_further_server_work(bundle):
    rt = SplitRuntime(bundle, "features.relu2", "exits")
    head = rt.head(_x(1), [1.0, 1.0])
    # one sample per batch, and the compute thread held: both requests wait until the test lets go
    with TailServer(bundle, max_batch=1, max_wait_ms=0.0).run_in_thread() as h, \
            TailClient(h.address, bundle) as c:
        gate = _hold_compute(h)
        first = _send(c, rt, head, thresholds=[1.0, 1.0], deadline_s=60)
        # the first is in its batch (taken off the queue, waiting for the held thread) before the
        # second is sent: two requests sent together may reach the server in either order, and the
        # one batched first is computed whatever its client does next
        _wait_for(lambda: h.server._compute._work_queue.qsize() == 1)  # its batch waits behind the gate
        second = _send(c, rt, head, thresholds=[1.0, 1.0], deadline_s=60)
        _wait_for(lambda: h.server.stats["requests"] == 2 and h.server._waiting == 1)  # queued, not computed
        assert second.cancel()
        _wait_for(lambda: h.server.stats["cancelled"] == 1)  # the server saw the cancellation
        gate.set()
        assert first.result().batch == 1
        with pytest.raises(SplitError) as err:
            second.result()
        assert err.value.code == "CANCELLED"
        # a third request of the same group queues behind where the second was: once it is
        # answered, the dispatcher has passed the second, and computed it or not
        third = _send(c, rt, head, thresholds=[1.0, 1.0], deadline_s=60).result()
        np.testing.assert_allclose(third.result.logits, rt.tail(list(head.crossing), [1.0, 1.0]).logits,
                                   atol=1e-5, rtol=0)
        assert h.server.stats["samples"] == 2 and h.server.stats["batches"] == 2  # first and third only
        assert h.server.stats["cancelled"] == 1


def test_deadlines_drops_and_refusals_are_answered_locally(bundle):
    frames = [_x(1, seed=i) for i in range(12)]
    prof = NetworkProfiler()
    with TailServer(bundle, drop_rate=0.4, seed=1, max_queue=1).run_in_thread() as h, \
            TailClient(h.address, bundle) as c:
        off = Offloader(bundle, c, SplitConfig("features.relu4", bits=8, deadline_ms=300, continue_locally=False),
                        profiler=prof)
        answers = list(off.stream(frames, depth=3))
        assert h.server.stats["dropped"] > 0
    assert len(answers) == 12 and all(a.result.logits.shape == (1, 10) for a in answers)
    where = {a.where for a in answers}
    assert "fallback" in where and "server" in where | {"device"}
    assert all(a.error and a.error.split(":")[0] in ("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
               for a in answers if a.where == "fallback")
    assert prof.failure_rate() > 0 and prof.stats()["failures"]


def test_the_device_cancels_when_its_next_exit_is_confident(bundle):
    rt_split = "features.relu4"  # exit 1 (relu5) is the first exit after the split
    with TailServer(bundle, slowdown=200.0, max_batch=1).run_in_thread() as h, TailClient(h.address, bundle) as c:
        off = Offloader(bundle, c, SplitConfig(rt_split, bits=8, thresholds=(1.0, 0.0), deadline_ms=5000))
        a = off.infer(_x(1))
        assert a.where == "local" and a.result.exit_index.tolist() == [1]
        # whatever reached the server has been dealt with: cancelled, or computed had it started
        # (a request the device cancelled in flight may never arrive: then there is nothing to wait for)
        st = h.server.stats
        _wait_for(lambda: st["cancelled"] + st["batches"] >= st["requests"])
        assert st["batches"] <= 1 and st["errors"] == 0
    np.testing.assert_array_equal(a.result.logits, nd.ProgressiveRuntime(bundle, exit_set="exits").exit_logits(_x(1), 1))


def test_pipelining_answers_the_same_frames_in_order(bundle, client):
    frames = [_x(1, seed=i) for i in range(8)]
    cfg = SplitConfig("features.relu3", bits=None, thresholds=(1.0, 1.0))
    one = [a.result.logits for a in Offloader(bundle, client, cfg).stream(frames, depth=1)]
    three = [a.result.logits for a in Offloader(bundle, client, cfg).stream(frames, depth=3)]
    for a, b in zip(one, three):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


#: every split and policy mixed in the bursts below: all samples cross ([1, 1]), or only those no
#: early exit is confident about ([0.15, 0.2] on this untrained bundle: most leave at exit 0, after
#: features.relu2, so splits after it send part of the batch)
SPLITS = ("features.relu2", "features.relu4", "features.relu6")
POLICIES = ((1.0, 1.0), (0.15, 0.2))


def _unsplit(bundle, x, thresholds):
    return nd.ProgressiveRuntime(bundle, exit_set="exits")(x, thresholds=list(thresholds))


def test_a_burst_of_mixed_splits_and_policies_batches_per_group_and_matches_the_unsplit_bundle(bundle):
    """Concurrent clients, three splits x two policies, three requests each: every request's logits
    equal the unsplit bundle's for its input, each (split, policy) group runs as one batch of all
    its requests, and no batch mixes groups. The compute thread is held while the burst arrives,
    so the grouping does not depend on how fast this machine is."""
    jobs = []  # (split, thresholds, x, head): three requests per group, each with something to send
    for split in SPLITS:
        for thr in POLICIES:
            rt, seed, found = SplitRuntime(bundle, split, "exits"), 100, 0
            while found < 3:  # the first seeds (deterministic) whose head leaves a sample to the server
                x = _x(4, seed=seed)
                head = rt.head(x, list(thr))
                seed += 1
                if head.rest.size:
                    jobs.append((split, thr, x, head))
                    found += 1
    crossing = [int(h.rest.size) for *_, h in jobs]
    assert all(n > 0 for n in crossing)
    assert any(0 < n < 4 for n in crossing), "no request crosses in part: the policy needs other thresholds"
    total = sum(crossing)
    replies = [None] * len(jobs)
    with TailServer(bundle, max_batch=256, max_wait_ms=1.0).run_in_thread() as h:
        gate = _hold_compute(h)
        # a lone request of its own group is taken first and waits at the held compute thread; the
        # burst then queues behind it, all of it, before anything runs
        rt0 = SplitRuntime(bundle, "features.relu1", "exits")
        with TailClient(h.address, bundle) as c0:
            lone = _send(c0, rt0, rt0.head(_x(1), [1.0, 1.0]), thresholds=[1.0, 1.0], deadline_s=60)
            _wait_for(lambda: h.server._compute._work_queue.qsize() == 1)  # its batch waits behind the gate
            start = threading.Barrier(len(jobs))

            def run(i):
                split, thr, _, head = jobs[i]
                with TailClient(h.address, bundle) as c:
                    start.wait(30)
                    replies[i] = _send(c, SplitRuntime(bundle, split, "exits"), head, thresholds=list(thr),
                                       deadline_s=60).result()

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
            for t in threads:
                t.start()
            _wait_for(lambda: h.server._waiting == total)  # every request decoded and queued
            gate.set()
            for t in threads:
                t.join(60)
            assert lone.result().batch == 1
        stats = dict(h.server.stats)
    assert all(r is not None for r in replies)
    groups = {}
    for (split, thr, *_), n in zip(jobs, crossing):
        groups[(split, thr)] = groups.get((split, thr), 0) + n
    assert stats["batches"] == 1 + len(groups) and stats["samples"] == 1 + total
    for (split, thr, x, head), reply in zip(jobs, replies):
        assert reply.batch == groups[(split, thr)], (split, thr, reply.batch)  # its group, whole and alone
        out = SplitRuntime(bundle, split, "exits").combine(head, reply.result)
        want = _unsplit(bundle, x, thr)
        np.testing.assert_allclose(out.logits, want.logits, atol=1e-5, rtol=0, err_msg=f"{split} {thr}")
        np.testing.assert_array_equal(out.exit_index, want.exit_index)
        np.testing.assert_array_equal(out.answer_index, want.answer_index)


def test_concurrent_clients_lose_nothing_and_get_the_unsplit_bundles_answers(bundle, server):
    """16 clients for 3 s over real sockets, each on its own split and policy: every frame is
    answered, by the device's head or by the server, never by a fallback, with the unsplit
    bundle's logits."""
    seconds, clients = 3.0, 16
    results: dict[int, tuple[int, int, set, list]] = {}

    def run(i):
        split, thr = SPLITS[i % len(SPLITS)], POLICIES[(i // len(SPLITS)) % len(POLICIES)]
        with TailClient(server.address, bundle) as c:
            off = Offloader(bundle, c, SplitConfig(split, bits=None, thresholds=thr, deadline_ms=30000,
                                                   continue_locally=False))
            sent = answered = 0
            where, wrong = set(), []
            end = time.perf_counter() + seconds
            k = 0
            while time.perf_counter() < end or sent == 0:
                x = _x(1, seed=1000 * i + k % 4)
                a = off.infer(x)
                sent += 1
                answered += a.result.logits.shape == (1, 10)
                where.add(a.where)
                want = _unsplit(bundle, x, thr)
                if not (np.allclose(a.result.logits, want.logits, atol=1e-5, rtol=0)
                        and np.array_equal(a.result.exit_index, want.exit_index)):
                    wrong.append(k)
                k += 1
            results[i] = (sent, answered, where, wrong)

    before = dict(server.server.stats)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(clients))
    for i, (sent, answered, where, wrong) in results.items():
        assert sent == answered > 0 and not wrong, (i, sent, answered, wrong)
        assert where <= {"server", "device"}, (i, where)  # never a fallback
    assert all("server" in where for i, (*_, where, _w) in results.items()
               if POLICIES[(i // len(SPLITS)) % len(POLICIES)] == (1.0, 1.0))  # everything crosses there
    assert any("server" in where for i, (*_, where, _w) in results.items()
               if POLICIES[(i // len(SPLITS)) % len(POLICIES)] != (1.0, 1.0)), "no partial crossing"
    stats = server.server.stats
    assert stats["errors"] == before["errors"] and stats["refused"] == before["refused"]


def test_nestflex_serve_process_killed_mid_stream_every_frame_is_answered(path, bundle):
    proc = subprocess.Popen([sys.executable, "-m", "nestflex", "serve", str(path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, proc.stderr.read()
        address = line.split("listening on ")[1].split(" ")[0]
        with TailClient(address, bundle) as c:
            off = Offloader(bundle, c, SplitConfig("features.relu4", bits=8, thresholds=(1.0, 1.0), deadline_ms=2000))
            answers = []
            for i in range(20):
                if i == 8:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                answers.append(off.infer(_x(1, seed=i)))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(answers) == 20 and all(a.result.logits.shape == (1, 10) for a in answers)
    assert [a.where for a in answers[:8]] == ["server"] * 8
    assert all(a.where == "fallback" and a.error.startswith("UNAVAILABLE") for a in answers[9:])


def test_server_only_split_without_a_server_still_answers(bundle):
    with TailServer(bundle).run_in_thread() as h:
        address = h.address
    with TailClient(address, bundle) as c:  # nothing listens there any more
        a = Offloader(bundle, c, SplitConfig(SERVER_ONLY, bits=8, deadline_ms=500)).infer(_x(1))
    assert a.where == "fallback"
    # torch.testing.assert_close's float32 tolerances
    np.testing.assert_allclose(a.result.logits, nd.ProgressiveRuntime(bundle, exit_set="exits")(_x(1)).logits,
                               rtol=1.3e-6, atol=1e-5)


def test_the_tail_runs_on_onnxruntimes_cpu_or_cuda_provider(bundle, monkeypatch):
    import onnxruntime as ort

    assert resolve_providers("cpu") == ("CPUExecutionProvider",)
    with pytest.raises(nd.NestflexError, match="`providers` must be"):
        resolve_providers(["NoSuchExecutionProvider"])
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert resolve_providers("auto") == ("CPUExecutionProvider",)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert resolve_providers("auto") == ("CUDAExecutionProvider", "CPUExecutionProvider")
    monkeypatch.undo()
    server = TailServer(bundle)  # this machine's onnxruntime: CUDA first only where it has the provider
    assert server.core.providers[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in server.core.providers) == ("CUDAExecutionProvider" in
                                                                  ort.get_available_providers())
