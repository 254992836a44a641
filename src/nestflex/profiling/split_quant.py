"""Split quantisation profiler (DynO Fig. 8, SPINN's communication optimiser), training side.

For every candidate split point and bitwidth it measures what the runtime needs to choose a
``<split, bitwidth>`` pair: validation accuracy with ISQuant applied to the tensors crossing
that split only (the rest of the network stays float, no retraining), the bytes a sample costs
on the wire with the deploy codec (frame header and side information included), and pack /
unpack time. From these it derives the lowest bitwidth per split within 1, 2 and 5 points of the
float accuracy, and compares ISQuant's per-sample range with a fixed, offline-calibrated range
(DynO Fig. 5).

The head of each split runs once per batch; only the tail runs per bitwidth.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from nestflex.deploy.codec import decode, encode, fake_quantize, fixed_quantize, dequantize
from nestflex.errors import ProfileError
from nestflex.graph import split_model, trace

__all__ = ["DEFAULT_BITWIDTHS", "SCHEMA_VERSION", "profile_split_quantization", "lowest_bits"]

SCHEMA_VERSION = 1
#: ``None`` is the float (unquantised) transfer.
DEFAULT_BITWIDTHS: tuple[int | None, ...] = (2, 3, 4, 5, 6, 7, 8, 16, None)
DROP_BUDGETS = (1, 2, 5)


def _check_bitwidths(bitwidths: Sequence[int | None]) -> list[int | None]:
    out = []
    for b in bitwidths:
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= 16):
            raise ProfileError(
                f"`bitwidths` entries must be ints in [1, 16] or None (float), got {b!r}. "
                f"HINT: the default is {list(DEFAULT_BITWIDTHS)}"
            )
        out.append(b)
    if not out:
        raise ProfileError("`bitwidths` is empty")
    if None not in out:
        out.append(None)  # the float reference every drop is measured against
    return out


@torch.no_grad()
def profile_split_quantization(
    model: nn.Module,
    batches: Iterable,
    splits: Sequence[str] | None = None,
    bitwidths: Sequence[int | None] = DEFAULT_BITWIDTHS,
    codec: str = "blosc_lz4",
    max_samples: int = 2000,
    size_samples: int = 128,
    input_shape: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Profile accuracy, transfer size and codec time for every ``<split, bitwidth>``.

    Args:
        model: an image classifier (put in eval mode for the run, restored afterwards).
        batches: iterable of ``(images, labels, ...)`` batches, e.g. a validation DataLoader.
        splits: split point names (``StructureGraph.split_points``); ``None`` = all of them.
        bitwidths: ISQuant bitwidths in [1, 16]; ``None`` means float (always included).
        codec: deploy codec name used for the bytes and timing columns.
        max_samples: accuracy is measured on at most this many samples.
        size_samples: bytes and codec time are measured on this many samples (one frame each).
        input_shape: per-sample input shape for tracing (taken from the first batch if None).

    Returns:
        a JSON-ready dict (schema in docs/profiling.md).

    Raises:
        ProfileError: bad ``bitwidths``, ``max_samples`` or an empty ``batches``.
        GraphError: an unknown split name (the message lists the valid ones).
    """
    bits_list = _check_bitwidths(bitwidths)
    for arg, value in (("max_samples", max_samples), ("size_samples", size_samples)):
        if not isinstance(value, int) or value < 1:
            raise ProfileError(f"`{arg}` must be a positive int, got {value!r}")
    images, labels = _collect(batches, max_samples)
    was_training = model.training
    model.eval()
    try:
        graph = trace(model, input_shape=input_shape or tuple(images.shape[1:]))
        points = graph.split_points if splits is None else [graph.split_point(s) for s in splits]
        float_acc = _accuracy(model, images, labels)
        rows = [_profile_point(graph, p, images, labels, bits_list, codec, size_samples, float_acc) for p in points]
    finally:
        model.train(was_training)
    return {
        "schema_version": SCHEMA_VERSION,
        "codec": codec,
        "samples": int(images.shape[0]),
        "size_samples": min(size_samples, int(images.shape[0])),
        "float_accuracy": float_acc,
        "bitwidths": [b for b in bits_list],
        "splits": rows,
    }


def _collect(batches: Iterable, max_samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys, n = [], [], 0
    for batch in batches:
        x, y = batch[0], batch[1]
        xs.append(x)
        ys.append(y)
        n += x.shape[0]
        if n >= max_samples:
            break
    if not xs:
        raise ProfileError("`batches` yielded no data. HINT: pass a validation DataLoader after `setup()`")
    return torch.cat(xs)[:max_samples], torch.cat(ys)[:max_samples]


def _accuracy(fn, images: torch.Tensor, labels: torch.Tensor, chunk: int = 256) -> float:
    correct = 0
    for i in range(0, images.shape[0], chunk):
        correct += (fn(images[i : i + chunk]).argmax(1) == labels[i : i + chunk]).sum().item()
    return correct / images.shape[0]


def _profile_point(graph, point, images, labels, bits_list, codec, size_samples, float_acc) -> dict[str, Any]:
    head, tail = split_model(graph, point)
    chunk = 256
    heads = [head(images[i : i + chunk]) for i in range(0, images.shape[0], chunk)]
    # offline calibration of the fixed-range baseline: the global range over the profiled set
    lo = min(float(t.min()) for h in heads for t in h)
    hi = max(float(t.max()) for h in heads for t in h)
    float_bytes = sum(4 * int(torch.tensor(shape).prod()) for _, shape in point.tensors)
    per_bits = []
    for bits in bits_list:
        correct = 0
        for h, i in zip(heads, range(0, images.shape[0], chunk)):
            q = [fake_quantize(t, bits) for t in h] if bits is not None else list(h)
            correct += (tail(*q).argmax(1) == labels[i : i + chunk]).sum().item()
        acc = correct / images.shape[0]
        sizes, pack, unpack = _wire_cost(heads[0], bits, codec, size_samples)
        per_bits.append({
            "bits": bits,
            "accuracy": acc,
            "drop_points": round(100 * (float_acc - acc), 4),
            "bytes_mean": statistics.fmean(sizes),
            "bytes_p95": _percentile(sizes, 95),
            "ratio": float_bytes / statistics.fmean(sizes),
            "pack_ms": 1e3 * statistics.median(pack),
            "unpack_ms": 1e3 * statistics.median(unpack),
        })
    range_error = []
    for bits in (b for b in bits_list if b is not None):
        iso, fixed = [], []
        for h in heads:
            for t in h:
                iso.append((fake_quantize(t, bits) - t).abs().mean().item())
                fixed.append((dequantize(fixed_quantize(t, bits, lo, hi)) - t).abs().mean().item())
        range_error.append({"bits": bits, "isquant_mae": statistics.fmean(iso), "fixed_mae": statistics.fmean(fixed)})
    row = {
        "name": point.name,
        "macs_fraction": point.macs_fraction,
        "tensors": [{"name": n, "shape": list(s)} for n, s in point.tensors],
        "float_bytes_per_sample": float_bytes,
        "fixed_range": [lo, hi],
        "per_bits": per_bits,
        "range_error": range_error,
    }
    row["lowest_bits"] = {str(d): lowest_bits(row, d) for d in DROP_BUDGETS}
    return row


def _wire_cost(head_out, bits, codec, size_samples):
    sizes, pack, unpack = [], [], []
    n = min(size_samples, head_out[0].shape[0])
    for i in range(n):
        tensors = [t[i : i + 1] for t in head_out]
        start = time.perf_counter()
        frame = encode(tensors, bits=bits, codec=codec)
        mid = time.perf_counter()
        decode(frame)
        end = time.perf_counter()
        sizes.append(len(frame))
        pack.append(mid - start)
        unpack.append(end - mid)
    return sizes, pack, unpack


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return float(ordered[k])


def lowest_bits(split_row: dict[str, Any], max_drop_points: float) -> int | None:
    """Lowest bitwidth of a profiled split whose accuracy drop is within ``max_drop_points``.

    Args:
        split_row: one entry of a split-quantisation profile's ``"splits"`` list (its
            ``"per_bits"`` rows are read).
        max_drop_points: the accuracy drop budget, in percentage points below float transfer.

    Returns:
        The lowest bitwidth within the budget, or ``None`` when only float transfer meets it.
    """
    ok = [r["bits"] for r in split_row["per_bits"] if r["bits"] is not None and r["drop_points"] <= max_drop_points]
    return min(ok) if ok else None
