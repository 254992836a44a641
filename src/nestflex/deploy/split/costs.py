"""What each split point costs on this device and on the wire, and what its quantisation costs in
accuracy: the inputs of the split scheduler (SPINN, DynO). Measured on what the device runs: the
onnxruntime sessions of :class:`~nestflex.deploy.split.SplitRuntime`, numpy in and out.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.codec import encode
from nestflex.deploy.runtime.capacity import check_input
from nestflex.deploy.scheduler.split import SplitCosts
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime, State, _segments, split_names
from nestflex.deploy.timing import median_ms

__all__ = ["measure_costs", "measure_bytes", "accuracy_drops"]


def measure_costs(bundle: Bundle, exit_set: str | None = "exits", repeats: int = 10, x: Any = None,
                  threads: int = 1) -> SplitCosts:
    """Median time (ms, batch 1, this machine) of every segment between exit taps and split nodes,
    and of every exit head: the device's :class:`~nestflex.deploy.scheduler.split.SplitCosts`.

    Each segment runs in its own onnxruntime session with ``threads`` intra-op threads, as
    :class:`~nestflex.deploy.split.SplitRuntime` runs them. The server's costs are the same table
    divided by its speed-up (the scheduler's ``server_speedup``). ``frame_ms`` is the fixed cost of
    a frame: the head of the server-only split (input checks) and packing the input at 8 bits.

    Args:
        bundle: the loaded bundle.
        exit_set: the exit set whose heads are timed (``"exits"``/``"flex_exits"`` or their
            kinds), or ``None`` for the backbone alone.
        repeats: timed runs of each segment and head; the median is kept.
        x: a normalised input batch (numpy or torch) whose first sample is timed; zeros if ``None``.
        threads: intra-op threads of each onnxruntime session.

    Returns:
        The device's :class:`~nestflex.deploy.scheduler.split.SplitCosts`.
    """
    rt = SplitRuntime(bundle, SERVER_ONLY, exit_set, threads=threads)  # the exit heads and the policy
    index = {n.name: i for i, n in enumerate(bundle.spec.capacity.program.nodes)}
    split_at = {SERVER_ONLY: None, **{s.name: s.node for s in bundle.spec.splits}}
    cuts = sorted(set(rt.taps) | {v for v in split_at.values() if v is not None}, key=index.__getitem__)
    tap_exit = {t: k for k, t in enumerate(rt.taps)}
    x1 = np.zeros((1, *bundle.spec.input.shape), np.float32) if x is None else \
        check_input(x, bundle.input_spec, "measure_costs")[:1]
    state: State = (x1,)
    segment_ms, head_ms = [], {}
    for seg, cut in zip(_segments(bundle, cuts, tap_exit, rt.num_exits, threads, None), [*cuts, None]):
        segment_ms.append(median_ms(lambda seg=seg, state=state: seg.run(*state), repeats))
        state = seg.run(*state)
        if cut in tap_exit:
            k = tap_exit[cut]
            head_ms[k] = median_ms(lambda k=k, state=state: rt._heads[k](state), repeats)
    frame_ms = median_ms(lambda: encode([rt.head(x1, [1.0] * (rt.num_exits - 1)).crossing[0]], 8), repeats)
    return SplitCosts(tuple(cuts), tuple(segment_ms), head_ms, {c: tap_exit[c] for c in cuts if c in tap_exit},
                      split_at, rt.num_exits, frame_ms)


def measure_bytes(bundle: Bundle, samples: Any, bits: Sequence[int | None] = (None, 8),
                  codec: str = "blosc_lz4") -> dict[tuple[str, int | None], float]:
    """Mean request-frame bytes per ``(split, bits)`` over ``samples``, one frame per sample, as the
    device sends them.

    Args:
        bundle: the loaded bundle.
        samples: normalised inputs ``(N, ...)``, numpy or torch.
        bits: the bitwidths to measure; ``None`` is lossless float32.
        codec: the codec frames are compressed with (:func:`~nestflex.deploy.codec.list_codecs`).

    Returns:
        Mean frame size in bytes, keyed by ``(split name, bits)``.
    """
    out: dict[tuple[str, int | None], float] = {}
    for name in split_names(bundle):
        crossing = SplitRuntime(bundle, name, None).head(samples, thresholds=[]).crossing
        n = crossing[0].shape[0]
        for b in bits:
            sizes = [len(encode([t[i:i + 1] for t in crossing], bits=b, codec=codec)) for i in range(n)]
            out[(name, b)] = sum(sizes) / len(sizes)
    return out


def accuracy_drops(bundle: Bundle) -> dict[tuple[str, int | None], float]:
    """Accuracy lost (fraction) by quantising each split at each profiled bitwidth, from the bundle's
    split quantisation profile: float accuracy minus accuracy at ``bits`` (never below 0).

    Args:
        bundle: the loaded bundle; splits without a quantisation profile are left out.

    Returns:
        The accuracy drop in [0, 1], keyed by ``(split name, bits)`` (``bits=None``: float).
    """
    out: dict[tuple[str, int | None], float] = {}
    for s in bundle.spec.splits:
        q = s.quantization
        if q is None or not q.per_bits:
            continue
        ref = next((r.accuracy for r in q.per_bits if r.bits is None), None)
        if ref is None:
            ref = max(r.accuracy for r in q.per_bits)
        for r in q.per_bits:
            out[(s.name, r.bits)] = max(0.0, ref - r.accuracy)
    return out
