"""The split-inference wire format, shared by the device client and the tail server.

One unary call per request, method :data:`RUN_METHOD`. Messages are bytes (no protobuf, no
pickle: invariant 7): the body is a versioned codec frame (:mod:`nestflex.deploy.codec.frame`),
the routing fields are call metadata, so any transport that carries bytes and string pairs
(gRPC here, Ray Serve's handles for scale-out) can carry them.

Request::

    body      codec frame of the tensors that cross the cut (ISQuant at the scheduled bitwidth)
    metadata  nf-protocol  PROTOCOL          nf-bundle  the manifest's sha256 (same bundle both sides)
              nf-split     split name        nf-exits   exit set key, or "none"
              nf-thresholds  "0.9,0.8,..."   (optional: the bundle's shipped thresholds)

Response::

    body      codec frame, lossless: logits (m, C) float32 and info (m, 4) float64 whose columns
              are exit index, answer index, confidence, passed (1.0 when an exit passed its threshold)
    trailing  nf-server-ms (compute of the batch), nf-queue-ms (waiting), nf-batch (samples in it)

Every parse here raises :class:`WireError` with what was wrong, so a server answers a bad request
with an error status and stays up.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from nestflex.deploy.codec import decode, encode
from nestflex.deploy.split.runtime import TailResult
from nestflex.errors import NestflexError

__all__ = ["PROTOCOL", "SERVICE", "RUN_METHOD", "INFO_METHOD", "WireError", "Request", "request_metadata",
           "parse_request_metadata", "encode_response", "decode_response", "MAX_THRESHOLDS"]

PROTOCOL = "1"
SERVICE = "nestflex.Tail"
RUN_METHOD = f"/{SERVICE}/Run"
INFO_METHOD = f"/{SERVICE}/Info"
MAX_THRESHOLDS = 64  # far above any exit set (SPINN: 6 exits)
_MAX_FIELD = 256  # characters in one metadata value


class WireError(NestflexError, ValueError):
    """A request or response that does not follow the wire format."""


class Request:
    """The routing fields of one request, parsed and checked.

    Attributes:
        bundle: the manifest sha256 the client ran its head with.
        split: split name.
        exit_set: exit set key, or ``None`` for the backbone alone.
        thresholds: per early exit, or ``None`` for the bundle's own.
    """

    __slots__ = ("bundle", "split", "exit_set", "thresholds")

    def __init__(self, bundle: str, split: str, exit_set: str | None, thresholds: list[float] | None) -> None:
        self.bundle, self.split, self.exit_set, self.thresholds = bundle, split, exit_set, thresholds

    def key(self) -> tuple:
        """Requests with the same key can share one batch on the server."""
        return self.split, self.exit_set, None if self.thresholds is None else tuple(self.thresholds)


def request_metadata(bundle: str, split: str, exit_set: str | None,
                     thresholds: Sequence[float] | None = None) -> tuple[tuple[str, str], ...]:
    """The metadata pairs of a request."""
    md = [("nf-protocol", PROTOCOL), ("nf-bundle", bundle), ("nf-split", split), ("nf-exits", exit_set or "none")]
    if thresholds is not None:
        md.append(("nf-thresholds", ",".join(repr(float(t)) for t in thresholds)))
    return tuple(md)


def parse_request_metadata(metadata: Sequence[tuple[str, Any]] | Mapping[str, Any]) -> Request:
    """Check and parse a request's metadata. Raises :class:`WireError`."""
    md: dict[str, str] = {}
    for k, v in (metadata.items() if isinstance(metadata, Mapping) else metadata):
        if isinstance(v, bytes):
            raise WireError(f"metadata {k!r} must be text, got bytes")
        md[str(k)] = str(v)
    got = md.get("nf-protocol")
    if got != PROTOCOL:
        raise WireError(f"protocol version {got!r:.40}, this server speaks {PROTOCOL!r}. HINT: use a client and "
                        f"server from the same nestflex release")
    for k in ("nf-bundle", "nf-split", "nf-exits"):
        if not md.get(k) or len(md[k]) > _MAX_FIELD:
            raise WireError(f"metadata {k!r} must be a non-empty string of at most {_MAX_FIELD} characters, got "
                            f"{md.get(k)!r:.60}")
    thresholds = None
    if "nf-thresholds" in md:
        parts = md["nf-thresholds"].split(",")
        if len(parts) > MAX_THRESHOLDS:
            raise WireError(f"at most {MAX_THRESHOLDS} thresholds, got {len(parts)}")
        try:
            thresholds = [float(p) for p in parts]
        except ValueError:
            raise WireError(f"`nf-thresholds` must be comma-separated numbers, got {md['nf-thresholds']!r:.80}") from None
        if not all(math.isfinite(t) and 0.0 <= t <= 1.0 for t in thresholds):
            raise WireError(f"thresholds must lie in [0, 1], got {md['nf-thresholds']!r:.80}")
    exits = md["nf-exits"]
    return Request(md["nf-bundle"], md["nf-split"], None if exits == "none" else exits, thresholds)


def encode_response(result: TailResult) -> bytes:
    """The response body for a :class:`~nestflex.deploy.split.TailResult` (lossless frame)."""
    info = np.stack([np.asarray(result.exit_index, np.float64), np.asarray(result.answer_index, np.float64),
                     np.asarray(result.confidence, np.float64), np.asarray(result.passed, np.float64)], axis=1)
    return encode([np.asarray(result.logits, np.float32), info], bits=None, codec="raw")


def decode_response(body: bytes, n: int, num_classes: int, num_exits: int) -> TailResult:
    """Parse a response body for ``n`` samples into a :class:`~nestflex.deploy.split.TailResult` (numpy).

    Raises:
        WireError: the frame does not hold ``(n, num_classes)`` logits and ``(n, 4)`` info, or its exit
            indices are not exits of the set.
        CodecError: a bad frame.
    """
    arrays = decode(body, max_elements=max(1, n * (num_classes + 4)), max_tensors=2)
    if len(arrays) != 2 or tuple(arrays[0].shape) != (n, num_classes) or tuple(arrays[1].shape) != (n, 4):
        raise WireError(f"a response must hold logits ({n}, {num_classes}) and info ({n}, 4), got "
                        f"{[tuple(a.shape) for a in arrays]}")
    logits, info = arrays
    idx = info[:, :2]
    if not np.isfinite(info).all() or (idx != np.round(idx)).any() or (idx < 0).any() or (idx >= num_exits).any():
        raise WireError(f"a response's exit indices must be integers in [0, {num_exits - 1}]")
    return TailResult(logits.astype(np.float32, copy=False), info[:, 0].astype(np.int64), info[:, 1].astype(np.int64),
                      info[:, 2].astype(np.float32), info[:, 3] > 0.5)
