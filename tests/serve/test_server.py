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

pytest.importorskip("grpc")

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
    # a slow server, one sample per batch: the second request waits behind the first
    with TailServer(bundle, max_batch=1, max_wait_ms=0.0, slowdown=400.0).run_in_thread() as h, \
            TailClient(h.address, bundle) as c:
        first = _send(c, rt, head, thresholds=[1.0, 1.0])
        time.sleep(0.1)
        second = _send(c, rt, head, thresholds=[1.0, 1.0])
        time.sleep(0.1)
        assert second.cancel()
        first.result()
        time.sleep(0.2)
        assert h.server.stats["samples"] == 1 and h.server.stats["cancelled"] == 1
        with pytest.raises(SplitError) as err:
            second.result()
        assert err.value.code == "CANCELLED"


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
        time.sleep(0.3)
    np.testing.assert_array_equal(a.result.logits, nd.ProgressiveRuntime(bundle, exit_set="exits").exit_logits(_x(1), 1))


def test_pipelining_answers_the_same_frames_in_order(bundle, client):
    frames = [_x(1, seed=i) for i in range(8)]
    cfg = SplitConfig("features.relu3", bits=None, thresholds=(1.0, 1.0))
    one = [a.result.logits for a in Offloader(bundle, client, cfg).stream(frames, depth=1)]
    three = [a.result.logits for a in Offloader(bundle, client, cfg).stream(frames, depth=3)]
    for a, b in zip(one, three):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_concurrent_clients_lose_nothing(bundle, server):
    seconds, clients = 3.0, 16
    results: list[tuple[int, int, int]] = []

    def run(i):
        with TailClient(server.address, bundle) as c:
            off = Offloader(bundle, c, SplitConfig("features.relu2", bits=8, thresholds=(1.0, 1.0), deadline_ms=5000))
            sent = answered = served = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                a = off.infer(_x(1, seed=i))
                sent += 1
                answered += a.result.logits.shape == (1, 10)
                served += a.where == "server"
            results.append((sent, answered, served))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == clients
    assert all(sent == answered == served > 0 for sent, answered, served in results)


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
