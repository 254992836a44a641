"""The tail server as a Ray Serve deployment: replicas, autoscaling and batching from Ray Serve itself.

The same stateless tail as :class:`nestflex.serve.TailServer` (one
:class:`~nestflex.serve.server.TailCore` per replica: check, decode, batch-run), scaled out by an
existing engine instead of a home-made cluster manager: Ray Serve places the replicas, routes each
request to one of them, scales their number on ongoing requests (``autoscaling_config`` with
``target_ongoing_requests``) and batches concurrent requests (``serve.batch``). The messages are
the wire format of :mod:`nestflex.deploy.split.wire`: a request is ``(body, metadata)``, the codec frame
and the string pairs (``nf-protocol``, ``nf-bundle``, ``nf-split``, ``nf-exits``,
``nf-thresholds``); the answer is ``(response body, trailing metadata)`` with ``nf-server-ms``,
``nf-queue-ms`` and ``nf-batch``.

* :func:`build` binds the application (``serve.run(build("bundle.nfx", num_replicas=2))``);
  :func:`app_builder` is the same for ``serve run nestflex.serve.ray:app_builder bundle=...``
  and Serve config files.
* :class:`TailDeployment` is the replica class (``__call__(body, metadata)`` answers one request).
* :class:`RayTailClient` is the caller's side over a ``DeploymentHandle``, with the API of
  :class:`~nestflex.deploy.split.client.TailClient` (``submit`` returns a
  :class:`~nestflex.deploy.split.client.TailCall`), so :class:`~nestflex.deploy.split.offload.Offloader`
  takes either.

Ray is an optional dependency, imported on first use: ``pip install "nestflex[ray]"`` (neither
``import nestflex.serve`` nor this module's import loads it). The gRPC
:class:`~nestflex.serve.TailServer` (``nestflex serve``) stays the single-machine path; a handle
needs its caller to be a driver of the Ray cluster (``ray.init(address=...)``), so devices outside
the cluster reach a tail over gRPC.

Example::

    from ray import serve
    from nestflex.serve.ray import RayTailClient, build

    app = build("bundle.nfx", autoscaling={"min_replicas": 1, "max_replicas": 4,
                                           "target_ongoing_requests": 32})
    handle = serve.run(app, name="tail")
    client = RayTailClient(handle, nd.load("bundle.nfx"))
    reply = client.submit(frame, split="features.relu4", exit_set="exits", n=1, num_exits=3).result()
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.split.client import SplitError, _LoopClient
from nestflex.deploy.codec import CodecError
from nestflex.deploy.exits import ExitError
from nestflex.deploy.split.wire import Request, WireError, encode_response, parse_request_metadata
from nestflex.errors import NestflexError
from nestflex.serve.server import TailCore

__all__ = ["TailDeployment", "RayTailClient", "build", "app_builder", "DEPLOYMENT"]

log = logging.getLogger(__name__)

#: the deployment's name in its application (``serve.get_deployment_handle(DEPLOYMENT, app_name)``)
DEPLOYMENT = "TailDeployment"

#: what a replica raises for a bad request (to its caller alone)
_BAD_REQUEST = (WireError, CodecError, ExitError, BundleError)


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise NestflexError("the Ray Serve tail needs Ray Serve. HINT: pip install \"nestflex[ray]\" "
                            "(or use the gRPC tail: nestflex serve BUNDLE)") from None
    return serve


def _check_batching(max_batch_size: Any, batch_wait_timeout_s: Any) -> None:
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise NestflexError(f"`max_batch_size` must be an int >= 1 (samples in one batch), "
                            f"got {max_batch_size!r}")
    if isinstance(batch_wait_timeout_s, bool) or not isinstance(batch_wait_timeout_s, (int, float)) or \
            not (math.isfinite(batch_wait_timeout_s) and batch_wait_timeout_s >= 0):
        raise NestflexError(f"`batch_wait_timeout_s` must be a number >= 0, got {batch_wait_timeout_s!r}")


@dataclass(eq=False)
class _Item:
    """One checked, decoded request waiting in a replica's batch queue."""

    request: Request
    tensors: list[np.ndarray]
    n: int
    arrived: float = field(default_factory=time.perf_counter)


def _samples(items: Sequence[_Item]) -> int:
    """``serve.batch``'s batch size: samples, not requests (one request may carry several)."""
    return sum(item.n for item in items)


class TailDeployment:
    """One replica of the tail: loads the bundle, checks and decodes each request, batches them.

    Ray Serve constructs it once per replica (``serve.deployment(TailDeployment)``, see
    :func:`build`); it needs a replica around it (``serve.batch`` reads the replica's context, so
    neither a plain object nor Ray Serve's ``_local_testing_mode`` runs it, as of Ray 2.60). A
    request is checked and decoded as it arrives, so a bad one raises to its caller alone and
    never enters a batch. The good ones go through ``serve.batch`` (``max_batch_size`` samples,
    ``batch_wait_timeout_s``); a batch is grouped by split and policy
    (:meth:`~nestflex.deploy.split.wire.Request.key`) and each group runs as one tail batch on the
    replica's compute thread, so the replica's event loop keeps accepting. A request cancelled by
    its caller before its batch starts is dropped from the batch (no further work).

    Args:
        bundle_path: the bundle (each replica loads it with :func:`nestflex.deploy.load`; use a
            path every node of the cluster can read).
        max_batch_size: most samples in one batch (also bounds every decoded frame).
        batch_wait_timeout_s: longest the first request of a batch waits for others.
        threads: intra-op threads of the replica's onnxruntime sessions (reserve as many CPUs in
            ``ray_actor_options``).
        providers: where the replica's tails run (:func:`~nestflex.serve.server.resolve_providers`):
            ``"auto"`` (CUDA when the replica's onnxruntime has it and sees a GPU, e.g.
            ``ray_actor_options={"num_gpus": 1}``; else the CPU), ``"cpu"`` or provider names.
        slowdown: >= 1; each batch takes ``slowdown`` x its compute time (benchmarks on one machine).

    Attributes:
        core: the replica's :class:`~nestflex.serve.server.TailCore`.
        stats: counters: requests, samples computed, batches, bad requests.

    Raises:
        BundleError: the bundle cannot be loaded.
        NestflexError: an argument is out of range.
    """

    def __init__(self, bundle_path: str | os.PathLike, *, max_batch_size: int = 32,
                 batch_wait_timeout_s: float = 0.002, threads: int = 1, slowdown: float = 1.0,
                 providers: str | Sequence[str] = "auto") -> None:
        from nestflex.deploy import load

        serve = _serve()
        _check_batching(max_batch_size, batch_wait_timeout_s)
        self.core = TailCore(load(bundle_path), max_batch_size, slowdown, threads=threads, providers=providers)
        self.stats = {"requests": 0, "samples": 0, "batches": 0, "errors": 0}
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="nestflex-tail")
        self._wait = float(batch_wait_timeout_s)
        # serve.batch on this replica's bound method: the queue and its limits are the replica's own
        self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=self._wait,
                                    batch_size_fn=_samples)(self._run_batches)

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """Ray Serve's ``user_config`` hook: change ``max_batch_size`` / ``batch_wait_timeout_s`` live.

        Raises:
            NestflexError: an unknown key or a value out of range.
        """
        unknown = set(config) - {"max_batch_size", "batch_wait_timeout_s"}
        if unknown:
            raise NestflexError(f"`user_config` takes max_batch_size and batch_wait_timeout_s, "
                                f"got {sorted(unknown)}")
        size = config.get("max_batch_size", self.core.max_batch)
        wait = config.get("batch_wait_timeout_s", self._wait)
        _check_batching(size, wait)
        self.core.max_batch, self._wait = size, float(wait)
        self._batched.set_max_batch_size(size)
        self._batched.set_batch_wait_timeout_s(self._wait)

    async def __call__(self, body: bytes,
                       metadata: Sequence[tuple[str, str]] | Mapping[str, str]) -> tuple[bytes, tuple]:
        """Answer one request.

        Args:
            body: the codec frame of the crossing tensors.
            metadata: the request's metadata pairs (:func:`~nestflex.deploy.split.wire.request_metadata`).

        Returns:
            the response body (:func:`~nestflex.deploy.split.wire.encode_response`) and the trailing
            metadata pairs ``nf-server-ms``, ``nf-queue-ms``, ``nf-batch``.

        Raises:
            WireError, CodecError, ExitError: a malformed request (the client says ``INVALID_ARGUMENT``).
            BundleError: another bundle, or a split it does not have (``FAILED_PRECONDITION``).
        """
        arrived = time.perf_counter()
        self.stats["requests"] += 1
        try:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise WireError(f"a request body must be bytes (a codec frame), got {type(body).__name__}")
            request = parse_request_metadata(metadata)
            loop = asyncio.get_running_loop()
            tensors, n = await loop.run_in_executor(self._compute, self.core.prepare, request, bytes(body))
        except _BAD_REQUEST:
            self.stats["errors"] += 1
            raise
        reply = await self._batched(_Item(request, tensors, n, arrived))
        if isinstance(reply, BaseException):  # its group failed (a bug, logged); the others were answered
            raise reply
        return reply

    async def _run_batches(self, items: list[_Item]) -> list[Any]:
        """``serve.batch``'s handler: group by split and policy, one tail batch per group."""
        groups: dict[tuple, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item.request.key(), []).append(i)
        out: list[Any] = [None] * len(items)
        loop = asyncio.get_running_loop()
        for rows in groups.values():
            group = [items[i] for i in rows]
            try:
                start = time.perf_counter()
                replies = await loop.run_in_executor(self._compute, self._run_group, group, start)
            except Exception as e:  # a bug, not bad input: fail this group's requests, keep the others
                log.exception("tail batch failed")
                replies = [e] * len(group)
            for i, reply in zip(rows, replies):
                out[i] = reply
        return out

    def _run_group(self, group: list[_Item], start: float) -> list[tuple[bytes, tuple]]:
        result, ms = self.core.run_batch(group)
        size = sum(item.n for item in group)
        self.stats["batches"] += 1
        self.stats["samples"] += size
        replies = []
        for item, part in zip(group, self.core.split_result(result, [item.n for item in group])):
            queued = (start - item.arrived) * 1000
            trailing = (("nf-server-ms", f"{ms:.3f}"), ("nf-queue-ms", f"{queued:.3f}"),
                        ("nf-batch", str(size)))
            replies.append((encode_response(part), trailing))
        return replies

    def info(self) -> dict[str, Any]:
        """The bundle, splits, exit sets and batch limit this replica serves, its id and its counters."""
        return {**self.core.info(), "replica": _serve().get_replica_context().replica_id.unique_id,
                "stats": dict(self.stats)}


def build(bundle_path: str | os.PathLike, *, num_replicas: int = 1,
          autoscaling: Mapping[str, Any] | None = None, max_batch_size: int = 32,
          batch_wait_timeout_s: float = 0.002, max_ongoing_requests: int | None = None,
          max_queued_requests: int = 1024, threads: int = 1, slowdown: float = 1.0,
          providers: str | Sequence[str] = "auto",
          ray_actor_options: Mapping[str, Any] | None = None, name: str = DEPLOYMENT) -> Any:
    """The tail as a bound Ray Serve application, ready for ``serve.run``.

    Args:
        bundle_path: the bundle every replica loads (made absolute here; on a multi-node cluster,
            a path every node can read).
        num_replicas: a fixed number of replicas (leave it at 1 with ``autoscaling``).
        autoscaling: Ray Serve's ``autoscaling_config``, e.g. ``{"min_replicas": 1,
            "max_replicas": 4, "target_ongoing_requests": 32}``: replicas scale on ongoing requests.
        max_batch_size: most samples in one batch of a replica.
        batch_wait_timeout_s: longest the first request of a batch waits for others.
        max_ongoing_requests: requests one replica holds at once; default ``2 * max_batch_size``,
            so one batch can fill while the previous one computes (Ray's own default, 5, would
            cap batches at 5 requests).
        max_queued_requests: requests a caller's router queues when every replica is full; beyond
            it calls are refused (``RESOURCE_EXHAUSTED``), never dropped; ``-1``: no limit.
        threads: intra-op threads of each replica's onnxruntime sessions.
        slowdown: >= 1; each batch takes ``slowdown`` x its compute time (benchmarks).
        providers: where each replica's tails run: ``"auto"`` (CUDA when the replica's onnxruntime
            has it, else the CPU), ``"cpu"``, or onnxruntime provider names
            (:func:`~nestflex.serve.server.resolve_providers`).
        ray_actor_options: per-replica resources, e.g. ``{"num_cpus": 1}`` (Ray's default; add
            ``"num_gpus"`` for a replica on a GPU).
        name: the deployment's name.

    Returns:
        the bound application (``ray.serve.Application``).

    Raises:
        NestflexError: an argument is out of range, or Ray Serve is not installed.
    """
    serve = _serve()
    if not isinstance(bundle_path, (str, os.PathLike)):
        raise NestflexError(f"`bundle_path` must be a path to a bundle, got {type(bundle_path).__name__}")
    _check_batching(max_batch_size, batch_wait_timeout_s)
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise NestflexError(f"`num_replicas` must be an int >= 1, got {num_replicas!r}")
    if autoscaling is not None and num_replicas != 1:
        raise NestflexError("pass either `num_replicas` or `autoscaling`, not both. HINT: autoscaling sets "
                            "the replica range itself (min_replicas, max_replicas)")
    opts: dict[str, Any] = {"name": name, "max_queued_requests": max_queued_requests,
                            "max_ongoing_requests": 2 * max_batch_size if max_ongoing_requests is None
                            else max_ongoing_requests}
    if autoscaling is not None:
        opts["autoscaling_config"] = dict(autoscaling)
    else:
        opts["num_replicas"] = num_replicas
    if ray_actor_options is not None:
        opts["ray_actor_options"] = dict(ray_actor_options)
    deployment = serve.deployment(TailDeployment).options(**opts)
    return deployment.bind(os.path.abspath(os.fspath(bundle_path)), max_batch_size=max_batch_size,
                           batch_wait_timeout_s=batch_wait_timeout_s, threads=threads, slowdown=slowdown,
                           providers=providers)


def _mapping(value: Any) -> dict:
    """A dict, or its JSON text (``serve run`` passes every argument as a string)."""
    value = json.loads(value) if isinstance(value, str) else value
    if not isinstance(value, Mapping):
        raise TypeError(type(value).__name__)
    return dict(value)


_KINDS = {str: "a string", int: "an int", float: "a number", _mapping: "a JSON object"}
_BUILDER_ARGS = {"bundle": str, "num_replicas": int, "autoscaling": _mapping, "max_batch_size": int,
                 "batch_wait_timeout_s": float, "max_ongoing_requests": int, "max_queued_requests": int,
                 "threads": int, "slowdown": float, "ray_actor_options": _mapping, "providers": str}


def app_builder(args: Mapping[str, Any]) -> Any:
    """Ray Serve's application builder: ``serve run nestflex.serve.ray:app_builder bundle=model.nfx``.

    Takes :func:`build`'s arguments, ``bundle`` being the path, from a Serve config file's
    ``args:`` or as ``key=value`` strings on the command line (``autoscaling`` and
    ``ray_actor_options`` then as JSON). A config file's ``deployments:`` section may also set
    ``user_config`` (``max_batch_size``, ``batch_wait_timeout_s``: changed live, see
    :meth:`TailDeployment.reconfigure`).

    Raises:
        NestflexError: no ``bundle``, an unknown argument or a value that does not parse.
    """
    if "bundle" not in args or set(args) - set(_BUILDER_ARGS):
        raise NestflexError(f"the tail's builder takes bundle=PATH and optionally "
                            f"{', '.join(list(_BUILDER_ARGS)[1:])}; got {sorted(args)}. "
                            f"HINT: serve run nestflex.serve.ray:app_builder bundle=model.nfx")
    kwargs = {}
    for k, v in args.items():
        try:
            kwargs[k] = _BUILDER_ARGS[k](v)
        except (TypeError, ValueError):
            raise NestflexError(f"argument {k}={v!r:.200} must be {_KINDS[_BUILDER_ARGS[k]]}") from None
    return build(kwargs.pop("bundle"), **kwargs)


class RayTailClient(_LoopClient):
    """The caller's side of a Ray Serve tail: :class:`~nestflex.deploy.split.client.TailClient`'s API on a handle.

    Calls go through a ``DeploymentHandle`` from a background event loop, so synchronous device
    code gets :class:`~nestflex.deploy.split.client.TailCall` futures (``submit``, ``info``, ``ping_ms``
    and ``close`` as on the gRPC client). The deadline is enforced here (Ray Serve's handles have
    none): past it, or on ``TailCall.cancel``, the response is cancelled
    (``DeploymentResponse.cancel``), so a request still waiting for its batch costs the replica
    nothing more. Failures surface as :class:`~nestflex.deploy.split.client.SplitError` with the codes of
    the gRPC client: ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION`` (another bundle, unknown split),
    ``DEADLINE_EXCEEDED``, ``CANCELLED``, ``RESOURCE_EXHAUSTED`` (every replica and the caller's
    queue full), ``UNAVAILABLE`` (no replica, a replica died), ``INTERNAL``; or ``BAD_REPLY``.

    Args:
        handle: the ``DeploymentHandle`` (``serve.run`` returns it), or the application's name
            (``serve.get_deployment_handle(DEPLOYMENT, app_name)``; needs ``ray.init`` first).
        bundle: the bundle the device runs (its identity is checked by the replicas).

    Raises:
        NestflexError: Ray Serve is not installed.
    """

    def __init__(self, handle: Any, bundle: Bundle) -> None:
        serve = _serve()
        if isinstance(handle, str):
            handle = serve.get_deployment_handle(DEPLOYMENT, handle)
        super().__init__(bundle, "nestflex-ray-client")
        self.handle = handle
        self.address = f"ray:{getattr(handle, 'app_name', '?')}/{getattr(handle, 'deployment_name', '?')}"

    async def _request(self, body: bytes, metadata: tuple[tuple[str, str], ...],
                       timeout: float) -> tuple[bytes, dict[str, str]]:
        reply = await self._remote(self.handle, (body, metadata), timeout)
        try:
            payload, trailing = reply
            return payload, dict(trailing)
        except (TypeError, ValueError) as e:
            raise SplitError(f"tail server {self.address} sent a bad reply: {e}", "BAD_REPLY") from None

    async def _remote(self, handle: Any, args: tuple, timeout: float) -> Any:
        async def wait(response: Any) -> Any:
            return await response

        response = None
        try:
            response = handle.remote(*args)
            return await asyncio.wait_for(wait(response), timeout)
        except asyncio.CancelledError:  # TailCall.cancel: cancel the request on the replica too
            if response is not None:
                response.cancel()
            raise
        except asyncio.TimeoutError:
            response.cancel()
            raise SplitError(f"tail server {self.address}: DEADLINE_EXCEEDED: no reply within {timeout} s",
                             "DEADLINE_EXCEEDED") from None
        except Exception as e:  # Ray's errors and the replica's own, wrapped by Ray
            code = _code(e)
            raise SplitError(f"tail server {self.address}: {code}: {_message(e)}", code) from None

    def info(self, timeout: float = 5.0) -> dict[str, Any]:
        """One replica's bundle, splits, exit sets and counters; also a round trip (latency probe).

        Raises:
            SplitError: no replica answered, or it serves another bundle than this client's.
        """
        call = self._remote(self.handle.options(method_name="info"), (), timeout)
        return self._same_bundle(asyncio.run_coroutine_threadsafe(call, self._loop).result(timeout + 1))


def _cause(e: BaseException) -> BaseException:
    """The replica's own exception inside Ray's wrapper (``RayTaskError(WireError)`` is both)."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def _code(e: BaseException) -> str:
    """The gRPC status name of a failed call, as :class:`~nestflex.deploy.split.client.TailClient` reports it."""
    from ray import exceptions as rex
    from ray.serve import exceptions as sex

    cause = _cause(e)
    if isinstance(cause, BundleError) or isinstance(e, BundleError):
        return "FAILED_PRECONDITION"
    if isinstance(cause, _BAD_REQUEST) or isinstance(e, _BAD_REQUEST):
        return "INVALID_ARGUMENT"
    if isinstance(e, sex.BackPressureError):
        return "RESOURCE_EXHAUSTED"
    if isinstance(e, (rex.TaskCancelledError, asyncio.CancelledError)):
        return "CANCELLED"
    if isinstance(e, TimeoutError):  # ray.exceptions.GetTimeoutError too
        return "DEADLINE_EXCEEDED"
    if isinstance(e, (sex.DeploymentUnavailableError, rex.RayActorError, rex.ActorUnavailableError,
                      rex.RaySystemError)):
        return "UNAVAILABLE"
    return "INTERNAL"


def _message(e: BaseException) -> str:
    cause = _cause(e)
    return f"{type(cause).__name__}: {cause}"[:1000]
