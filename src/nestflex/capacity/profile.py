"""Per-level profiles of a multi-capacity model, its memory, and the cost of switching levels.

Memory (NestDNN Table 3): the multi-capacity model stores every tensor once, so its size is
the largest level plus the smaller levels' own BatchNorms; ``K`` independent models store the
sum of the ``K`` architectures.

Switching (Tables 4-5): a level is *resident* when every tensor entry it computes with is in
memory. Going from level ``a`` to level ``b`` pages in the entries ``b`` uses and ``a`` does
not, and pages out the entries ``a`` uses and ``b`` does not; both are counted exactly from the
nested layout (:func:`paging_bytes`). Independent models page in all of ``b`` and out all of
``a``. The measured switch time loads exactly those bytes from an in-memory serialised buffer
(``torch.load(weights_only=True)``) and writes them into place, for both.
"""

from __future__ import annotations

import io
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from nestflex.capacity.nested import extract_level, get_level, level_regions, num_levels, set_level
from nestflex.deploy.timing import median_ms
from nestflex.graph import checked_batches, input_shape_of, trace
from nestflex.pruning.evaluate import accuracy

__all__ = [
    "MB",
    "state_bytes",
    "used_masks",
    "memory_report",
    "paging_bytes",
    "switching_table",
    "latency_ms",
    "profile_levels",
]

#: bytes per MB in every report (decimal, as the paper's tables)
MB = 1e6


def state_bytes(model: nn.Module) -> int:
    """Bytes of every tensor in ``model.state_dict()`` (parameters and buffers)."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def used_masks(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Per state-dict tensor, per level, the boolean mask of entries that level computes with."""
    K = num_levels(model)
    regions = level_regions(model)
    out: dict[str, list[torch.Tensor]] = {}
    for name, t in model.state_dict().items():
        masks = []
        for k in range(K):
            if name in regions:
                region = regions[name][k]
            elif ".levels." in name:  # a switchable-BN buffer belongs to its level only
                region = (slice(None),) if f".levels.{k}." in f".{name}" else None
            else:
                region = (slice(None),)
            m = torch.zeros(t.shape, dtype=torch.bool)
            if region is not None:
                m[region if t.dim() else ...] = True
            masks.append(m)
        out[name] = masks
    return out


def memory_report(model: nn.Module) -> dict[str, Any]:
    """Bytes of the multi-capacity model vs the same ``K`` architectures stored independently."""
    K = num_levels(model)
    per_level = [state_bytes(extract_level(model, k)) for k in range(K)]
    multi = state_bytes(model)
    return {
        "multi_capacity_bytes": multi, "independent_bytes": sum(per_level), "level_bytes": per_level,
        "multi_capacity_mb": round(multi / MB, 4), "independent_mb": round(sum(per_level) / MB, 4),
        "largest_level_mb": round(max(per_level) / MB, 4), "ratio_to_largest": round(multi / max(per_level), 4),
    }


def paging_bytes(model: nn.Module, masks: dict[str, list[torch.Tensor]] | None = None) -> dict[tuple[int, int], dict[str, int]]:
    """Exact page-in / page-out bytes of every ordered pair of levels, nested vs independent."""
    masks = masks if masks is not None else used_masks(model)
    state = model.state_dict()
    K = num_levels(model)
    level_total = [sum(int(m[k].sum()) * state[n].element_size() for n, m in masks.items()) for k in range(K)]
    out = {}
    for a in range(K):
        for b in range(K):
            if a == b:
                continue
            pin = sum(int((m[b] & ~m[a]).sum()) * state[n].element_size() for n, m in masks.items())
            pout = sum(int((m[a] & ~m[b]).sum()) * state[n].element_size() for n, m in masks.items())
            out[(a, b)] = {"page_in": pin, "page_out": pout,
                           "independent_page_in": level_total[b], "independent_page_out": level_total[a]}
    return out


def _serialise(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


def switching_table(model: nn.Module, repeats: int = 5) -> list[dict[str, Any]]:
    """Page-in/page-out bytes and measured switch time for every ordered pair of levels.

    Nested: deserialise the page-in entries of ``b`` and write them into the shared tensors,
    then ``set_level(b)``. Independent: deserialise ``b``'s whole state dict and load it into a
    prebuilt model of ``b``'s architecture. Times are medians of ``repeats`` runs (ms).
    """
    K = num_levels(model)
    start_level = get_level(model)
    masks = used_masks(model)
    pages = paging_bytes(model, masks)
    plain = [extract_level(model, k) for k in range(K)]
    blobs = [_serialise(p.state_dict()) for p in plain]
    targets = [extract_level(model, k) for k in range(K)]
    state = model.state_dict()
    rows = []
    for (a, b), p in pages.items():
        idx = {n: torch.nonzero((m[b] & ~m[a]).flatten()).flatten() for n, m in masks.items()}
        idx = {n: i for n, i in idx.items() if i.numel()}
        blob = _serialise({n: state[n].flatten()[i].clone() for n, i in idx.items()})

        def nested_switch() -> None:
            delta = torch.load(io.BytesIO(blob), weights_only=True)
            with torch.no_grad():
                for n, i in idx.items():
                    state[n].view(-1)[i] = delta[n]
            set_level(model, b)

        def independent_switch() -> None:
            targets[b].load_state_dict(torch.load(io.BytesIO(blobs[b]), weights_only=True))

        rows.append({
            "from": a, "to": b, "kind": "upgrade" if b > a else "downgrade", **p,
            "nested_ms": round(median_ms(nested_switch, repeats), 4),
            "independent_ms": round(median_ms(independent_switch, repeats), 4),
        })
    set_level(model, start_level)
    return rows


@torch.no_grad()
def latency_ms(model: nn.Module, batch_size: int, repeats: int = 10, input_shape: Sequence[int] | None = None) -> float:
    """Median CPU forward time (ms) of ``model`` in eval mode at ``batch_size``.

    ``input_shape``: per-sample shape of the random input; default the model's own
    (:func:`nestflex.graph.input_shape_of`).
    """
    was = model.training
    model.eval()
    x = torch.randn(batch_size, *input_shape_of(model, input_shape))
    try:
        return median_ms(lambda: model(x), repeats)
    finally:
        model.train(was)


def profile_levels(
    model: nn.Module,
    loader: Iterable | None,
    batch_sizes: Iterable[int] = (1, 64),
    repeats: int = 10,
    max_batches: int | None = None,
    input_shape: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Accuracy, params, MACs, weight memory and CPU latency of every level (NestDNN §3.4).

    Latency is timed on the plain extract of each level (what a deployment would run). Levels
    are traced and timed at ``input_shape``, by default the model's own
    (:func:`nestflex.graph.input_shape_of`); a ``loader`` of another shape raises ``GraphError``.
    """
    input_shape = input_shape_of(model, input_shape)
    K = num_levels(model)
    start = get_level(model)
    rows = []
    for k in range(K):
        set_level(model, k)
        plain = extract_level(model, k)
        graph = trace(plain, input_shape)
        row: dict[str, Any] = {"level": k}
        row["accuracy"] = None if loader is None else round(
            accuracy(model, checked_batches(loader, input_shape, "profile_levels"), max_batches=max_batches), 4)
        row.update(params=graph.params(), macs=graph.macs(), memory_mb=round(state_bytes(plain) / MB, 4),
                   latency_ms={str(b): round(latency_ms(plain, b, repeats, input_shape), 3) for b in batch_sizes})
        rows.append(row)
    set_level(model, start)
    return rows
