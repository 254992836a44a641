"""The tail server: runs the rest of a bundle's network for any split point, over gRPC (asyncio).

Stateless: every request carries its split, exit set and thresholds (:mod:`nestflex.deploy.split.wire`),
so any replica that loaded the same bundle can answer it. Concurrent requests for the same
split and policy are batched: one dispatcher takes the oldest waiting request's group (up to
``max_batch`` samples, after at most ``max_wait_ms``), runs it on one compute thread
(onnxruntime releases the GIL, the event loop keeps accepting), and answers each request with its rows.

The tails run on onnxruntime (numpy, no torch), like the device's heads. Where the tail runs
(``providers``): ``"auto"`` takes onnxruntime's CUDA provider when this install lists it
(``onnxruntime.get_available_providers()``: the ``onnxruntime-gpu`` wheel on a machine with a
GPU), with the CPU for what CUDA does not run, and the CPU alone otherwise. Why the GPU by default
where there is one: a tail server batches many devices' requests, the case a GPU serves best, and
a CPU-only install behaves as before. The price: a GPU's kernels round differently from the
device's CPU kernels, so the split answer agrees with the unsplit model to float32 rounding
rather than exactly; pass ``providers="cpu"`` for the device's own arithmetic.

What the server guarantees (each a test in tests/serve/):

* a malformed, truncated, oversized or wrong-version request gets an error status
  (``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ``RESOURCE_EXHAUSTED``) and the server stays up;
  decompression is capped by the frame's declared size and ``max_batch`` x the split's crossing size;
* a request cancelled by its client (or past its deadline) before its batch starts does no
  further work: it is taken out of its group;
* more than ``max_queue`` waiting samples: new requests are refused (``RESOURCE_EXHAUSTED``),
  never silently dropped.

Example::

    from nestflex.serve import TailServer
    server = TailServer(nd.load("bundle.nfx"))
    port = await server.start(port=0)      # or: handle = server.run_in_thread()
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from nestflex.deploy.bundle.loader import Bundle, bundle_id
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.codec import CodecError, decode
from nestflex.deploy.exits import ExitError
from nestflex.deploy.split.runtime import CPU, SplitRuntime, TailResult
from nestflex.deploy.split.wire import (INFO_METHOD, PROTOCOL, RUN_METHOD, SERVICE, Request, WireError,
                                        encode_response, parse_request_metadata)
from nestflex.errors import NestflexError

__all__ = ["TailServer", "ServerHandle", "TailCore", "resolve_providers"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    request: Request
    tensors: list[np.ndarray]
    n: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: bool = False


def resolve_providers(providers: str | Sequence[str] = "auto") -> tuple[str, ...]:
    """The onnxruntime execution providers a tail runs on, in order of preference.

    Args:
        providers: ``"auto"`` (CUDA then CPU when onnxruntime lists ``CUDAExecutionProvider``, else
            the CPU alone; see the module's notes), ``"cpu"``, or provider names, each one that
            ``onnxruntime.get_available_providers()`` lists.

    Raises:
        NestflexError: a name this onnxruntime install does not have.

    Examples:
        >>> resolve_providers("cpu")
        ('CPUExecutionProvider',)
    """
    if isinstance(providers, str) and providers in ("auto", "cpu"):
        if providers == "cpu":
            return CPU
        import onnxruntime as ort

        return ("CUDAExecutionProvider", *CPU) if "CUDAExecutionProvider" in ort.get_available_providers() else CPU
    import onnxruntime as ort

    available = ort.get_available_providers()
    names = [providers] if isinstance(providers, str) else list(providers)
    bad = [p for p in names if not isinstance(p, str) or p not in available]
    if not names or bad:
        raise NestflexError(f"`providers` must be \"auto\", \"cpu\" or onnxruntime providers this install has "
                            f"({', '.join(available)}), got {providers!r}. HINT: the CUDA provider comes with the "
                            f"onnxruntime-gpu wheel")
    return tuple(names)


class TailCore:
    """What every tail replica does, transport aside: check, decode and batch-run requests.

    Shared by :class:`TailServer` (gRPC) and the Ray Serve deployment (:mod:`nestflex.serve.ray`).
    Each (split, exit set) pair gets its :class:`~nestflex.deploy.split.SplitRuntime` on first use:
    onnxruntime sessions on ``providers``, numpy in and out.

    Args:
        bundle: the loaded bundle.
        max_batch: most samples in one batch (bounds every decoded frame too).
        slowdown: >= 1; each batch takes ``slowdown`` x its compute time (the extra slept), to model
            a slower server in benchmarks on one machine.
        threads: intra-op threads of each onnxruntime session.
        providers: where the tails run (:func:`resolve_providers`): ``"auto"`` (CUDA when onnxruntime
            has it, else the CPU), ``"cpu"``, or provider names.

    Attributes:
        providers: the providers resolved.
    """

    def __init__(self, bundle: Bundle, max_batch: int = 32, slowdown: float = 1.0, *, threads: int = 1,
                 providers: str | Sequence[str] = "auto") -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise NestflexError(f"`max_batch` must be an int >= 1, got {max_batch!r}")
        if not (isinstance(slowdown, (int, float)) and math.isfinite(slowdown) and slowdown >= 1):
            raise NestflexError(f"`slowdown` must be a number >= 1 (1: as fast as this machine), got {slowdown!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise NestflexError(f"`threads` must be an int >= 1, got {threads!r}")
        self.bundle, self.id, self.max_batch, self.slowdown = bundle, bundle_id(bundle), max_batch, float(slowdown)
        self.threads, self.providers = threads, resolve_providers(providers)
        self._runtimes: dict[tuple[str, str | None], SplitRuntime] = {}

    def info(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "bundle": self.id, "splits": [s.name for s in self.bundle.spec.splits],
                "exit_sets": list(self.bundle.exit_sets), "max_batch": self.max_batch}

    # -- runtimes ------------------------------------------------------------------------------

    def runtime(self, split: str, exit_set: str | None) -> SplitRuntime:
        """The tail for ``split`` and ``exit_set`` (built once, its sessions kept)."""
        key = (split, exit_set)
        if key not in self._runtimes:
            if exit_set is not None and exit_set not in self.bundle.exit_sets:
                raise WireError(f"the bundle has no exit set {exit_set!r} (it has: "
                                f"{', '.join(self.bundle.exit_sets) or 'none'})")
            self._runtimes[key] = SplitRuntime(self.bundle, split, exit_set, threads=self.threads,
                                               providers=self.providers)
        return self._runtimes[key]

    def prepare(self, request: Request, body: bytes) -> tuple[list[np.ndarray], int]:
        """Decode and check one request: the crossing arrays (float32) and their batch size.

        Raises:
            WireError, CodecError, ExitError, BundleError: a bad request (the caller answers it with an error).
        """
        if request.bundle != self.id:
            raise BundleError(f"the client ran bundle {request.bundle[:16]}..., this server serves "
                              f"{self.id[:16]}.... HINT: load the same bundle on both ends")
        rt = self.runtime(request.split, request.exit_set)
        per_sample = sum(math.prod(s) for s in rt.crossing_shapes)
        arrays = decode(body, max_elements=max(1, per_sample * self.max_batch), max_tensors=len(rt.crossing_shapes))
        shapes = [tuple(a.shape[1:]) for a in arrays]
        if shapes != rt.crossing_shapes or len({a.shape[0] for a in arrays}) != 1 or arrays[0].shape[0] < 1:
            raise WireError(f"split {rt.split!r} takes per-sample shapes {rt.crossing_shapes} with one batch size "
                            f">= 1, got {[tuple(a.shape) for a in arrays]}")
        if request.thresholds is not None and len(request.thresholds) != rt.num_exits - 1:
            raise WireError(f"exit set {request.exit_set!r} has {rt.num_exits - 1} early exits, got "
                            f"{len(request.thresholds)} thresholds")
        return [np.ascontiguousarray(a, dtype=np.float32) for a in arrays], int(arrays[0].shape[0])

    def run_batch(self, batch: Sequence[Any]) -> tuple[TailResult, float]:
        """Run requests of one group (same split and policy; items with ``.request``, ``.tensors``) as one batch.

        Returns:
            the tail's result for all rows, in order, and the batch's time in ms.
        """
        start = time.perf_counter()
        req = batch[0].request
        rt = self.runtime(req.split, req.exit_set)
        crossing = [np.concatenate([p.tensors[i] for p in batch]) if len(batch) > 1 else batch[0].tensors[i]
                    for i in range(len(rt.crossing_shapes))]
        result = rt.tail(crossing, req.thresholds)
        took = time.perf_counter() - start
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * took)
        return result, (time.perf_counter() - start) * 1000

    @staticmethod
    def split_result(result: TailResult, sizes: Sequence[int]) -> list[TailResult]:
        """The rows of each request of a batch, in order."""
        out, row = [], 0
        for n in sizes:
            out.append(TailResult(*(t[row:row + n] for t in (result.logits, result.exit_index, result.answer_index,
                                                             result.confidence, result.passed))))
            row += n
        return out


class TailServer:
    """A gRPC tail server for one bundle.

    Args:
        bundle: the loaded bundle (the same one the devices run their heads from).
        max_batch: most samples in one batch.
        max_wait_ms: longest a request waits for others to join its batch.
        max_queue: most samples waiting; beyond it requests are refused.
        max_message_bytes: largest request accepted (gRPC refuses larger ones).
        threads: intra-op threads of each onnxruntime session.
        slowdown: >= 1; each batch takes ``slowdown`` x its compute time (the extra slept), to
            model a slower server in benchmarks on one machine.
        drop_rate: fault injection: the share of requests never answered (their deadline ends them).
        seed: the seed of the drops.
        providers: where the tails run: ``"auto"`` (CUDA when onnxruntime has it, else the CPU; see
            the module's notes), ``"cpu"``, or onnxruntime provider names.

    Attributes:
        stats: counters: requests, samples computed, batches, refused, cancelled before compute.
    """

    def __init__(self, bundle: Bundle, *, max_batch: int = 32, max_wait_ms: float = 2.0, max_queue: int = 1024,
                 max_message_bytes: int = 64 * 2**20, threads: int = 1, slowdown: float = 1.0,
                 drop_rate: float = 0.0, seed: int = 0, providers: str | Sequence[str] = "auto") -> None:
        for name, v, lo in (("max_queue", max_queue, 1), ("max_message_bytes", max_message_bytes, 1024),
                            ("threads", threads, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise NestflexError(f"`{name}` must be an int >= {lo}, got {v!r}")
        for name, v, lo, hi in (("max_wait_ms", max_wait_ms, 0, math.inf), ("drop_rate", drop_rate, 0, 1)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi):
                raise NestflexError(f"`{name}` must be a number in [{lo}, {hi}], got {v!r}")
        self.core = TailCore(bundle, max_batch, slowdown, threads=threads, providers=providers)
        self.bundle, self.max_batch = bundle, max_batch
        self.max_wait, self.max_queue = max_wait_ms / 1000, max_queue
        self.max_message_bytes, self.threads = max_message_bytes, threads
        self.drop_rate, self._rng = float(drop_rate), random.Random(seed)
        self.stats = {"requests": 0, "samples": 0, "batches": 0, "refused": 0, "cancelled": 0, "errors": 0,
                      "dropped": 0}
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="nestflex-tail")
        # decoding has its own thread: a request is checked while a batch computes, and a bad one is
        # answered without waiting behind it
        self._decode = ThreadPoolExecutor(1, thread_name_prefix="nestflex-decode")
        self._groups: dict[tuple, list[_Pending]] = {}
        self._waiting = 0
        self._wake: asyncio.Event | None = None
        self._server: Any = None
        self._dispatcher: asyncio.Task | None = None
        self.port: int | None = None

    # -- gRPC ----------------------------------------------------------------------------------

    async def _run(self, body: bytes, context: Any) -> bytes:
        import grpc

        self.stats["requests"] += 1
        try:
            request = parse_request_metadata(tuple(context.invocation_metadata() or ()))
            loop = asyncio.get_running_loop()
            tensors, n = await loop.run_in_executor(self._decode, self.core.prepare, request, body)
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            raise
        except (WireError, CodecError, ExitError, BundleError) as e:
            self.stats["errors"] += 1
            code = grpc.StatusCode.FAILED_PRECONDITION if isinstance(e, BundleError) else \
                grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, f"{type(e).__name__}: {e}"[:1000])
        if self.drop_rate and self._rng.random() < self.drop_rate:  # fault injection: a lost request
            self.stats["dropped"] += 1
            await asyncio.Event().wait()  # never answered; the client's deadline ends the call
        if self._waiting + n > self.max_queue:
            self.stats["refused"] += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self._waiting} samples waiting (limit {self.max_queue}); retry later or elsewhere")
        pending = _Pending(request, tensors, n, asyncio.get_running_loop().create_future())
        self._groups.setdefault(request.key(), []).append(pending)
        self._waiting += n
        self._wake.set()
        try:
            body, md = await pending.future
        except asyncio.CancelledError:  # the client cancelled, or its deadline passed
            # cancelling this task cancels the future it awaited: not answered means not computed yet
            if pending.future.cancelled() or not pending.future.done():
                pending.cancelled = True
                self.stats["cancelled"] += 1
            raise
        context.set_trailing_metadata(md)
        return body

    async def _info(self, body: bytes, context: Any) -> bytes:
        return json.dumps(self.core.info()).encode()

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._groups:
                # the group of the oldest waiting request; give others max_wait to join it
                key = min(self._groups, key=lambda k: self._groups[k][0].arrived)
                wait = self._groups[key][0].arrived + self.max_wait - time.perf_counter()
                if wait > 0 and sum(p.n for p in self._groups[key]) < self.max_batch:
                    await asyncio.sleep(wait)
                group = self._groups.get(key, [])
                batch, size = [], 0
                while group and (not batch or size + group[0].n <= self.max_batch):
                    p = group.pop(0)
                    self._waiting -= p.n
                    if p.cancelled or p.future.done():
                        continue
                    batch.append(p)
                    size += p.n
                if not group:
                    self._groups.pop(key, None)
                if not batch:
                    continue
                queued = (time.perf_counter() - batch[0].arrived) * 1000
                try:
                    result, ms = await loop.run_in_executor(self._compute, self.core.run_batch, batch)
                except Exception as e:  # a bug, not bad input: answer every request of the batch, keep serving
                    log.exception("tail batch failed")
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(e)
                    continue
                self.stats["batches"] += 1
                self.stats["samples"] += size
                for p, part in zip(batch, self.core.split_result(result, [p.n for p in batch])):
                    if not p.future.done():
                        md = (("nf-server-ms", f"{ms:.3f}"), ("nf-queue-ms", f"{queued:.3f}"), ("nf-batch", str(size)))
                        p.future.set_result((encode_response(part), md))

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start serving; returns the port (an ephemeral one for ``port=0``)."""
        import grpc

        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Run": grpc.unary_unary_rpc_method_handler(self._run),
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
        })
        assert RUN_METHOD.endswith("/Run") and INFO_METHOD.endswith("/Info")
        opts = [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes)]
        self._server = grpc.aio.server(options=opts)
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise NestflexError(f"cannot listen on {host}:{port}. HINT: the port is taken; pass another or 0")
        self._wake = asyncio.Event()
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        await self._server.start()
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        """Stop accepting, let in-flight calls finish for ``grace`` seconds, stop the dispatcher."""
        if self._server is not None:
            await self._server.stop(grace)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        self._compute.shutdown(wait=False)
        self._decode.shutdown(wait=False)

    async def wait(self) -> None:
        """Serve until the process is stopped."""
        await self._server.wait_for_termination()

    def run_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> ServerHandle:
        """Serve from a background thread with its own event loop (tests, benchmarks, notebooks)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="nestflex-serve", daemon=True)
        thread.start()
        bound = asyncio.run_coroutine_threadsafe(self.start(host, port), loop).result(30)
        return ServerHandle(self, loop, thread, host, bound)


class ServerHandle:
    """A :class:`TailServer` running in a background thread; :meth:`stop` ends it.

    Built by :meth:`TailServer.run_in_thread`, not by users; it is also a context manager that
    stops the server on exit.

    Args:
        server: the running server.
        loop: the event loop the server runs on.
        thread: the background thread running ``loop``.
        host: the address the server listens on.
        port: the port the server is bound to (the actual one when ``0`` was asked for).
    """

    def __init__(self, server: TailServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 host: str, port: int) -> None:
        self.server, self.loop, self.thread, self.host, self.port = server, loop, thread, host, port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
