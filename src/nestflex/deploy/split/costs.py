"""What each split point costs on this device and on the wire, and what its quantisation costs in
accuracy: the inputs of the split scheduler (SPINN, DynO).
"""

from __future__ import annotations

from typing import Sequence

import torch

from nestflex.deploy.bundle.loader import Bundle
from nestflex.deploy.bundle.program import cut_program
from nestflex.deploy.runtime.capacity import CapacityRuntime
from nestflex.deploy.split.runtime import SERVER_ONLY, SplitRuntime, State, _Segment, split_names

__all__ = ["measure_costs", "measure_bytes", "accuracy_drops"]

def measure_costs(bundle: Bundle, exit_set: str | None = "exits", repeats: int = 10, x: torch.Tensor | None = None):
    """Median time (ms, batch 1, this machine) of every segment between exit taps and split nodes,
    and of every exit head: the device's :class:`~nestflex.deploy.scheduler.split.SplitCosts`.

    The server's are the same table divided by its speed-up (the scheduler's ``server_speedup``).
    ``frame_ms`` is the fixed cost of a frame: the head of the server-only split (input checks)
    and packing the input at 8 bits.
    """
    from nestflex.deploy.codec import encode
    from nestflex.deploy.scheduler.split import SplitCosts
    from nestflex.deploy.timing import median_ms

    rt = SplitRuntime(bundle, SERVER_ONLY, exit_set)
    nodes = rt.capacity.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    taps = tuple(rt._prog.spec.taps) if rt._prog is not None else ()
    split_at = {SERVER_ONLY: None, **{s.name: s.node for s in bundle.spec.splits}}
    cuts = sorted(set(taps) | {v for v in split_at.values() if v is not None}, key=index.__getitem__)
    tap_exit = {t: k for k, t in enumerate(taps)}
    state: State = (torch.zeros(1, *bundle.spec.input.shape) if x is None else x[:1],)
    segment_ms, head_ms = [], {}
    for (ins, body, outs), cut in zip(cut_program(nodes, cuts), [*cuts, None]):
        seg = _Segment(ins, body, outs, None)
        segment_ms.append(median_ms(lambda: rt._stage(seg, state), repeats))
        state = rt._stage(seg, state)
        if cut in tap_exit:
            k = tap_exit[cut]
            head_ms[k] = median_ms(lambda: rt._heads[k](state), repeats)
    x1 = torch.zeros(1, *bundle.spec.input.shape) if x is None else x[:1]
    frame_ms = median_ms(lambda: encode([rt.head(x1, [1.0] * (rt.num_exits - 1)).crossing[0]], 8), repeats)
    return SplitCosts(tuple(cuts), tuple(segment_ms), head_ms, {c: tap_exit[c] for c in cuts if c in tap_exit},
                      split_at, rt.num_exits, frame_ms)


def measure_bytes(bundle: Bundle, samples: torch.Tensor, bits: Sequence[int | None] = (None, 8),
                  codec: str = "blosc_lz4") -> dict[tuple[str, int | None], float]:
    """Mean request-frame bytes per ``(split, bits)`` over ``samples`` (normalised inputs, one frame
    per sample, as the device sends them); ``bits=None`` is lossless float32."""
    from nestflex.deploy.codec import encode

    out: dict[tuple[str, int | None], float] = {}
    cap = CapacityRuntime(bundle, bundle.num_levels - 1, plan=None)
    for name in split_names(bundle):
        rt = SplitRuntime(bundle, name, None, capacity=cap)
        crossing = rt.head(samples, thresholds=[]).crossing
        for b in bits:
            sizes = [len(encode([t[i:i + 1] for t in crossing], bits=b, codec=codec)) for i in range(samples.shape[0])]
            out[(name, b)] = sum(sizes) / len(sizes)
    return out


def accuracy_drops(bundle: Bundle) -> dict[tuple[str, int | None], float]:
    """Accuracy lost (fraction) by quantising each split at each profiled bitwidth, from the bundle's
    split quantisation profile: float accuracy minus accuracy at ``bits`` (never below 0)."""
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
