"""FlexDNN early-exit architecture search (top-down), on a frozen backbone.

1. **Over-parameterised exits.** At every candidate location (a split point whose activation is a
   coupled channel group) ``M`` exits are inserted; exit ``k`` reads the top ``ceil(k N / M)``
   filters of the layer's collective ranking (:func:`~nestflex.exits.flexdnn.fine_grained.exit_filter_counts`)
   and starts with four conv blocks, each with twice the filters of the previous
   (:class:`~nestflex.exits.flexdnn.fine_grained.CompactHead`).
2. **Training with emphasis on important filters:** all ``L x M`` exits train together on the
   frozen backbone (one backbone pass per batch, cut after the last location), each behind a
   :class:`~nestflex.exits.flexdnn.fine_grained.RankedDropout` whose rate grows with a filter's rank.
3. **Pruning while the exit rate holds:** an exit's *exit rate* is the share of validation samples
   whose confidence passes its lossless threshold against the final exit (the exit standing
   alone). Blocks are removed from the deepest while the rate stays within ``rate_tolerance`` of
   the full exit's; then the last block's filters are halved (lowest collective rank first) while
   it still holds. Every variant's classifier is refitted (multinomial logistic regression,
   L-BFGS) on the pooled features of a fit subset, cached once: the search never runs the
   backbone again. Depth 0 is a pooled linear probe on the selected backbone filters.

Choices the seed leaves open (docs/flexdnn.md): exits are evaluated standalone; the classifier of
every variant, the full one included, is refitted the same way so variants compare fairly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from nestflex.deploy.exits import ExitError, get_confidence
from nestflex.exits._stages import build_stages
from nestflex.exits.calibration import fit_lossless_thresholds
from nestflex.exits.flexdnn.fine_grained import CompactHead, FilterSubsetExit, RankedDropout, exit_filter_counts
from nestflex.graph import SplitPoint, StructureGraph

__all__ = ["Candidate", "SearchedExit", "location_groups", "build_candidates", "train_candidates",
           "collect_exit_features", "refit_linear", "exit_rate", "prune_candidate"]


@dataclass
class Candidate:
    """One over-parameterised exit: location ``point``, the ``k``-th of ``M`` there."""

    point: SplitPoint
    location: int
    k: int
    module: FilterSubsetExit


@dataclass
class SearchedExit:
    """A pruned exit and what the search measured on it (validation split)."""

    point: SplitPoint
    location: int
    k: int
    module: FilterSubsetExit
    depth: int
    widths: list[int]
    filters: list[int]
    rate: float
    full_rate: float
    threshold: float
    val_logits: torch.Tensor = field(repr=False)
    history: list[dict[str, Any]] = field(default_factory=list)


def location_groups(graph: StructureGraph, points: Sequence[SplitPoint]) -> list[Any]:
    """The coupled channel group whose response each exit location taps.

    Raises:
        ExitError: a location whose activation belongs to no channel group.
    """
    out = []
    for p in points:
        g = next((g for g in graph.groups if p.node in graph.response_nodes(g)), None)
        if g is None:
            raise ExitError(f"exit location `{p.name}` is not the response of a channel group (FlexDNN ranks a "
                            f"layer's filters, so an exit must read a layer's output). HINT: pick a layer's "
                            f"activation, or locations=('all',) for every one")
        out.append(g)
    return out


def build_candidates(
    points: Sequence[SplitPoint],
    orders: Sequence[torch.Tensor],
    num_classes: int,
    exits_per_location: int = 3,
    base_width: int = 8,
    blocks: int = 4,
    p_max: float = 0.5,
    input_size: int | None = None,
) -> list[Candidate]:
    """``M`` over-parameterised exits per location (see the module docstring, step 1).

    Args:
        points: the locations.
        orders: per location, its filters ranked most important first.
        num_classes: logits per exit.
        exits_per_location: ``M``.
        base_width: filters of each exit's first block; block ``b`` has ``base_width * 2^b``.
        blocks: blocks per exit before pruning (FlexDNN: 4).
        p_max: ranked dropout rate of each exit's lowest-ranked filter.
        input_size: exits average-pool a tapped map whose smaller side is at least twice this by
            ``side // input_size`` (down to about this size) before their first block
            (:class:`~nestflex.exits.flexdnn.fine_grained.CompactHead`'s ``stem_pool``); ``None``: never.

    Raises:
        ExitError: a layer with fewer filters than ``M``, or a bad width or input size.
    """
    if isinstance(base_width, bool) or not isinstance(base_width, int) or base_width < 1:
        raise ExitError(f"`base_width` must be a positive int, got {base_width!r}")
    if input_size is not None and (isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1):
        raise ExitError(f"`input_size` must be a positive int or None (no pooling), got {input_size!r}")
    out = []
    if len(points) != len(orders):
        raise ExitError(f"`orders` must hold one filter order per location: {len(points)} locations, "
                        f"{len(orders)} orders")
    for loc, (p, order) in enumerate(zip(points, orders)):
        shape = next(s for n, s in p.tensors if n == p.node)
        stem_pool = max(1, min(shape[1:]) // input_size) if input_size and len(shape) == 3 else 1  # (C, H, W)
        try:
            counts = exit_filter_counts(int(order.numel()), exits_per_location)
        except ExitError as e:
            raise ExitError(f"location `{p.name}`: {e}") from None
        for k, n_filters in enumerate(counts):
            widths = [base_width * 2**b for b in range(blocks)]
            head = CompactHead(n_filters, widths, num_classes, shape[1:], stem_pool)
            module = FilterSubsetExit(order[:n_filters], head, RankedDropout(n_filters, p_max))
            out.append(Candidate(p, loc, k, module))
    return out


def _taps(graph: StructureGraph, points: Sequence[SplitPoint]):
    """Stages up to the last location (the tail is not needed) and each location's tap index."""
    order = sorted(set(points), key=lambda p: p.index)
    stages = build_stages(graph, order)
    taps = {p.node: (i, [n for n, _ in p.tensors].index(p.node)) for i, p in enumerate(order)}
    return stages, taps


def _run_taps(stages, taps, x, final: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    state: tuple = (x,)
    out = {}
    last = max(i for i, _ in taps.values())
    by_stage: dict[int, list[tuple[str, int]]] = {}
    for node, (i, t) in taps.items():
        by_stage.setdefault(i, []).append((node, t))
    for i, stage in enumerate(stages):
        if i > last and not final:
            break
        state = stage(*state)
        if isinstance(state, torch.Tensor):
            state = (state,)
        for node, t in by_stage.get(i, []):
            out[node] = state[t]
    return out, (state[0] if final else None)


def train_candidates(
    graph: StructureGraph,
    candidates: Sequence[Candidate],
    batches: Iterable,
    epochs: int = 2,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Train every candidate jointly on the frozen backbone (eval mode): cross-entropy per exit.

    Returns:
        ``{"epochs", "steps", "last_loss"}``.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ExitError(f"`epochs` must be a positive int, got {epochs!r}")
    stages, taps = _taps(graph, [c.point for c in candidates])
    for s in stages:
        s.eval()
    params = [p for c in candidates for p in c.module.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    steps, loss_value = 0, float("nan")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for c in candidates:
            c.module.train()
        for _ in range(epochs):
            for batch in batches:
                x, y = batch[0], batch[1]
                with torch.no_grad():
                    feats, _ = _run_taps(stages, taps, x)
                loss = sum(F.cross_entropy(c.module(feats[c.point.node]), y) for c in candidates)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
                loss_value = float(loss.detach()) / len(candidates)
    for c in candidates:
        c.module.eval()
    return {"epochs": epochs, "steps": steps, "last_loss": loss_value}


@torch.no_grad()
def collect_exit_features(
    graph: StructureGraph,
    candidates: Sequence[Candidate],
    batches: Iterable,
    max_samples: int | None = None,
    final: bool = False,
    name: str = "validation",
) -> dict[str, Any]:
    """Pooled features of every candidate at every depth ``0..blocks`` (eval mode), cached.

    Returns:
        ``{"features": [per candidate: [depth 0..B: (n, C_d)]], "labels", "final_logits"}``
        (``final_logits`` only with ``final=True``).

    Raises:
        ExitError: the split is empty.
    """
    stages, taps = _taps(graph, [c.point for c in candidates])
    feats: list[list[list[torch.Tensor]]] = [[[] for _ in range(len(c.module.head.widths) + 1)] for c in candidates]
    labels, finals, n = [], [], 0
    for batch in batches:
        x, y = batch[0], batch[1]
        if max_samples is not None:
            x, y = x[: max_samples - n], y[: max_samples - n]
        tapped, logits = _run_taps(stages, taps, x, final=final)
        for ci, c in enumerate(candidates):
            h = c.module.head.stem(tapped[c.point.node].index_select(1, c.module.index))
            feats[ci][0].append(torch.flatten(c.module.head.pool(h), 1))
            for d, block in enumerate(c.module.head.blocks):
                h = block(h)
                feats[ci][d + 1].append(torch.flatten(c.module.head.pool(h), 1))
        labels.append(torch.as_tensor(y).long())
        if final:
            finals.append(logits.float())
        n += x.shape[0]
        if max_samples is not None and n >= max_samples:
            break
    if n == 0:
        raise ExitError(f"the {name} split is empty (0 samples). HINT: pass a non-empty {name} DataLoader")
    return {
        "features": [[torch.cat(f).double() for f in per] for per in feats],
        "labels": torch.cat(labels),
        "final_logits": torch.cat(finals) if final else None,
    }


def refit_linear(features: torch.Tensor, labels: torch.Tensor, num_classes: int, weight_decay: float = 1e-4,
                 max_iter: int = 100) -> nn.Linear:
    """Multinomial logistic regression on pooled features (L-BFGS), as an ``nn.Linear``."""
    mean = features.mean(0)
    std = features.std(0, unbiased=False).clamp_min(1e-6)
    x = (features - mean) / std  # standardised for a well-conditioned solve; folded back below
    w = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ w.T + b, labels) + weight_decay * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    lin = nn.Linear(x.shape[1], num_classes)
    with torch.no_grad():
        lin.weight.copy_((w / std).float())
        lin.bias.copy_((b - (w * (mean / std)).sum(1)).float())
    return lin


def exit_rate(exit_logits: torch.Tensor, final_logits: torch.Tensor, labels: torch.Tensor,
              confidence: str = "entropy") -> tuple[float, float]:
    """``(exit rate, lossless threshold)`` of one exit standing alone before the final exit."""
    fn = get_confidence(confidence)
    conf = torch.stack([fn(exit_logits), fn(final_logits)]).double()
    correct = torch.stack([exit_logits.argmax(1) == labels, final_logits.argmax(1) == labels])
    t = fit_lossless_thresholds(conf, correct)[0]
    return float((conf[0] > t).double().mean()), t


def _logits(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return lin(x.float())


def prune_candidate(
    cand: Candidate,
    fit: dict[str, Any],
    val: dict[str, Any],
    num_classes: int,
    rate_tolerance: float = 0.02,
    confidence: str = "entropy",
    refit_iters: int = 100,
) -> SearchedExit:
    """Step 3: remove blocks, then halve the last block's filters, while the exit rate holds.

    ``fit`` and ``val`` come from :func:`collect_exit_features` (``val`` with ``final=True``),
    restricted to this candidate: ``{"features": [depth 0..B], "labels", "final_logits"}``.
    ``refit_iters`` bounds the L-BFGS iterations of each classifier refit.
    """
    from nestflex.pruning.collective import collective_ranking  # pruning must not import exits

    head = cand.module.head
    full_depth = len(head.widths)
    fy, vy, final = fit["labels"], val["labels"], val["final_logits"]

    def measure(depth: int, keep: torch.Tensor) -> tuple[float, float, nn.Linear, torch.Tensor]:
        lin = refit_linear(fit["features"][depth][:, keep], fy, num_classes, max_iter=refit_iters)
        logits = _logits(lin, val["features"][depth][:, keep])
        rate, t = exit_rate(logits, final, vy, confidence)
        return rate, t, lin, logits

    all_of = lambda d: torch.arange(fit["features"][d].shape[1])  # noqa: E731
    rate0, t0, lin0, logits0 = measure(full_depth, all_of(full_depth))
    best = (full_depth, all_of(full_depth), rate0, t0, lin0, logits0)
    history = [{"depth": full_depth, "filters": int(best[1].numel()), "rate": rate0, "accepted": True}]
    for depth in range(full_depth - 1, -1, -1):
        rate, t, lin, logits = measure(depth, all_of(depth))
        ok = rate >= rate0 - rate_tolerance
        history.append({"depth": depth, "filters": int(all_of(depth).numel()), "rate": rate, "accepted": ok})
        if not ok:
            break
        best = (depth, all_of(depth), rate, t, lin, logits)
    depth = best[0]
    ranking = collective_ranking(
        fit["features"][depth][:, :, None], fy, val["features"][depth][:, :, None], vy,
        stop_fraction=0.0, num_classes=num_classes,
    )
    k = int(best[1].numel()) // 2
    while k >= 1:
        keep = ranking.order[:k].sort().values
        rate, t, lin, logits = measure(depth, keep)
        ok = rate >= rate0 - rate_tolerance
        history.append({"depth": depth, "filters": k, "rate": rate, "accepted": ok})
        if not ok:
            break
        best = (depth, keep, rate, t, lin, logits)
        k //= 2
    depth, keep, rate, t, lin, logits = best
    module = _materialise(cand.module, depth, keep, lin)
    return SearchedExit(
        point=cand.point, location=cand.location, k=cand.k, module=module, depth=depth,
        widths=list(module.head.widths), filters=module.index.tolist(), rate=rate, full_rate=rate0, threshold=t,
        val_logits=logits, history=history,
    )


def _materialise(ex: FilterSubsetExit, depth: int, keep: torch.Tensor, lin: nn.Linear) -> FilterSubsetExit:
    """A compact exit: the first ``depth`` blocks, the last one (or the input filters) cut to ``keep``."""
    head = ex.head
    index = ex.index
    if depth == 0:
        index = index[keep]
        widths: list[int] = []
    else:
        widths = head.widths[: depth - 1] + [int(keep.numel())]
    new = CompactHead(int(index.numel()), widths, lin.out_features, head.in_hw, head.stem_pool)
    with torch.no_grad():
        for d in range(depth):
            src, dst = head.blocks[d], new.blocks[d]
            rows = keep if d == depth - 1 else torch.arange(src[0].out_channels)
            dst[0].weight.copy_(src[0].weight[rows])
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(dst[1], name).copy_(getattr(src[1], name)[rows])
            dst[1].num_batches_tracked.copy_(src[1].num_batches_tracked)
        new.linear.load_state_dict(copy.deepcopy(lin.state_dict()))
    return FilterSubsetExit(index.clone(), new).eval()
