"""The device's connection to a tail server: one gRPC channel, calls with deadlines and cancellation.

:class:`TailClient` owns a ``grpc.aio`` channel on a background event loop, so synchronous device
code gets :class:`TailCall` futures: :meth:`TailCall.result` waits (up to the deadline),
:meth:`TailCall.cancel` cancels the request on the server too (a request cancelled before its
batch starts costs the server nothing). Network failures, refusals and deadlines all surface as
:class:`SplitError` with the gRPC status name, so callers fall back on one exception type.

gRPC is an optional dependency of the device side: ``pip install "nestflex[serve]"``.

Example::

    client = TailClient("10.0.0.2:50051", bundle)
    call = client.submit(frame, split="features.relu4", exit_set="exits", deadline_s=0.2)
    reply = call.result()          # TailReply: .result (TailResult), .rtt_ms, .server_ms, ...
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from nestflex.deploy.bundle.loader import Bundle, bundle_id
from nestflex.deploy.split.runtime import TailResult
from nestflex.deploy.split.wire import INFO_METHOD, RUN_METHOD, decode_response, request_metadata
from nestflex.errors import NestflexError

__all__ = ["TailClient", "TailCall", "TailReply", "SplitError"]


class SplitError(NestflexError, RuntimeError):
    """A split request failed: server unreachable, refused, cancelled or past its deadline.

    Args:
        message: what failed, for people.
        code: the gRPC status name, or ``BAD_REPLY`` (see ``code`` below).

    Attributes:
        code: the gRPC status name (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``INVALID_ARGUMENT``,
            ``RESOURCE_EXHAUSTED``, ``CANCELLED``, ...) or ``BAD_REPLY``.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _grpc() -> Any:
    try:
        import grpc
        import grpc.aio  # noqa: F401
    except ImportError:
        raise NestflexError("split inference needs gRPC. HINT: pip install \"nestflex[serve]\"") from None
    return grpc


@dataclass(frozen=True)
class TailReply:
    """A server's answer to one request.

    Attributes:
        result: the tail's :class:`~nestflex.deploy.split.TailResult` for the request's samples.
        bytes_sent: request body bytes; ``bytes_received``: response body bytes.
        rtt_ms: submit to answer, on the device's clock.
        server_ms: compute time of the server's batch (piggybacked); ``queue_ms``: its wait there.
        batch: samples in the server's batch.
    """

    result: TailResult
    bytes_sent: int
    bytes_received: int
    rtt_ms: float
    server_ms: float
    queue_ms: float
    batch: int

    @property
    def network_ms(self) -> float:
        """Round trip minus the server's own time: what the link took."""
        return max(0.0, self.rtt_ms - self.server_ms - self.queue_ms)


class TailCall:
    """One in-flight request (a future)."""

    def __init__(self, future: Future, bytes_sent: int) -> None:
        self._future, self.bytes_sent = future, bytes_sent

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        """Cancel the request (locally and on the server). Returns False when it already finished."""
        return self._future.cancel()

    def result(self, timeout: float | None = None) -> TailReply:
        """The reply. Raises :class:`SplitError` (failure, refusal, deadline, cancellation, timeout)."""
        try:
            return self._future.result(timeout)
        except CancelledError:
            raise SplitError("the request was cancelled", "CANCELLED") from None
        except FutureTimeout:
            raise SplitError(f"no reply within {timeout} s", "DEADLINE_EXCEEDED") from None


_Client = TypeVar("_Client", bound="_LoopClient")


class _LoopClient:
    """What a tail client does, transport aside: calls from a background event loop, replies checked.

    Synchronous device code gets :class:`TailCall` futures (cancelling one cancels the coroutine,
    which cancels the request). A transport implements :meth:`_request`; :class:`TailClient`
    (gRPC) and :class:`nestflex.serve.ray.RayTailClient` (a Ray Serve handle) share the rest.
    """

    address: str

    def __init__(self, bundle: Bundle, thread_name: str) -> None:
        self.bundle, self.bundle_id = bundle, bundle_id(bundle)
        self.num_classes = int(bundle.spec.num_classes)
        import asyncio  # here, not at import: `import nestflex.deploy` should not pay for it (~20 ms)

        self._asyncio = asyncio
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=thread_name, daemon=True)
        self._thread.start()

    async def _request(self, body: bytes, metadata: tuple[tuple[str, str], ...],
                       timeout: float) -> tuple[bytes, dict[str, str]]:
        """Send one request; the response body and trailing metadata. Raises :class:`SplitError`."""
        raise NotImplementedError

    async def _call(self, body: bytes, metadata: tuple[tuple[str, str], ...], timeout: float, n: int,
                    num_exits: int) -> TailReply:
        start = time.perf_counter()
        reply, trailing = await self._request(body, metadata, timeout)
        rtt = (time.perf_counter() - start) * 1000
        try:
            result = decode_response(reply, n, self.num_classes, num_exits)
            server_ms, queue_ms = float(trailing.get("nf-server-ms", 0)), float(trailing.get("nf-queue-ms", 0))
            batch = int(trailing.get("nf-batch", n))
        except (NestflexError, ValueError) as e:
            raise SplitError(f"tail server {self.address} sent a bad reply: {e}", "BAD_REPLY") from None
        return TailReply(result, len(body), len(reply), rtt, server_ms, queue_ms, batch)

    def submit(self, frame: bytes, *, split: str, exit_set: str | None, n: int, num_exits: int,
               thresholds: Sequence[float] | None = None, deadline_s: float = 1.0) -> TailCall:
        """Send one request: ``frame`` (a codec frame of the crossing tensors of ``n`` samples).

        Args:
            split: the split point the server continues from (see :mod:`nestflex.deploy.split.wire`).
            exit_set: the exit set the server runs, or ``None`` for the backbone alone.
            n: samples in the frame.
            num_exits: exits of the set (to check the reply).
            thresholds: the early exits' thresholds the server applies; ``None``: the bundle's.
            deadline_s: the request's deadline; the server stops working on the request after it.
        """
        md = request_metadata(self.bundle_id, split, exit_set, thresholds)
        fut = self._asyncio.run_coroutine_threadsafe(self._call(frame, md, deadline_s, n, num_exits), self._loop)
        return TailCall(fut, len(frame))

    def _same_bundle(self, info: dict[str, Any]) -> dict[str, Any]:
        if info.get("bundle") != self.bundle_id:
            raise SplitError(f"tail server {self.address} serves another bundle ({str(info.get('bundle'))[:16]}...). "
                             f"HINT: serve the bundle this device runs", "FAILED_PRECONDITION")
        return info

    def info(self, timeout: float = 5.0) -> dict[str, Any]:
        """The server's bundle, splits and exit sets. Raises :class:`SplitError`."""
        raise NotImplementedError

    def ping_ms(self, timeout: float = 5.0) -> float:
        """One empty round trip, in ms (the link's latency without payload)."""
        start = time.perf_counter()
        self.info(timeout)
        return (time.perf_counter() - start) * 1000

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def close(self) -> None:
        if self._loop.is_running():
            self._stop_loop()

    def __enter__(self: _Client) -> _Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TailClient(_LoopClient):
    """A channel to one tail server for one bundle.

    Args:
        address: ``host:port`` of a :class:`nestflex.serve.TailServer` (``nestflex serve``).
        bundle: the bundle the device runs (its identity is checked by the server).
        max_message_bytes: largest request/response.

    Raises:
        NestflexError: gRPC is not installed.
    """

    def __init__(self, address: str, bundle: Bundle, *, max_message_bytes: int = 64 * 2**20) -> None:
        grpc = _grpc()
        super().__init__(bundle, "nestflex-client")
        self.address = address
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes)]

        async def connect() -> Any:
            return grpc.aio.insecure_channel(address, options=opts)

        self._channel = self._asyncio.run_coroutine_threadsafe(connect(), self._loop).result(30)
        self._run = self._channel.unary_unary(RUN_METHOD)
        self._info = self._channel.unary_unary(INFO_METHOD)
        self._grpc = grpc

    async def _request(self, body: bytes, metadata: tuple[tuple[str, str], ...],
                       timeout: float) -> tuple[bytes, dict[str, str]]:
        call = self._run(body, metadata=tuple(metadata), timeout=timeout)  # the gRPC deadline
        try:
            return await call, dict(await call.trailing_metadata() or ())
        except self._asyncio.CancelledError:
            call.cancel()
            raise
        except self._grpc.aio.AioRpcError as e:
            raise SplitError(f"tail server {self.address}: {e.code().name}: {e.details()}", e.code().name) from None

    def info(self, timeout: float = 5.0) -> dict[str, Any]:
        """The server's bundle, splits and exit sets; also a round trip with an empty body (latency probe).

        Raises:
            SplitError: unreachable, or another bundle than this client's.
        """
        async def go() -> bytes:
            try:
                return await self._info(b"", timeout=timeout)
            except self._grpc.aio.AioRpcError as e:
                raise SplitError(f"tail server {self.address}: {e.code().name}: {e.details()}", e.code().name) \
                    from None

        info = self._asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout + 1)
        return self._same_bundle(json.loads(info))

    def close(self) -> None:
        if self._loop.is_running():
            self._asyncio.run_coroutine_threadsafe(self._channel.close(), self._loop).result(10)
            self._stop_loop()

