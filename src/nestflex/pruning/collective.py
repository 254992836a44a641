"""Collective importance (FlexDNN): rank a layer's filters by sequential backward selection.

FlexDNN ranks the filters of a layer *together*: starting from all of them, drop each remaining
filter in turn, attach an early exit fed by the others, fine-tune it and measure its validation
accuracy; the filter whose loss hurts least is the least important. Repeat on what is left. A
filter that duplicates another is worthless *once the other is kept*, which independent criteria
(L1/L2 norms, TRR) cannot see: two copies of one filter get the same norm.

**How the O(N^2) fine-tunings are avoided.** The literal algorithm fine-tunes ``N + (N-1) + ...``
exits per layer. Here the exit is a *linear probe* on the layer's pooled responses (each filter's
activation map average-pooled to ``pool x pool``, ``d = pool^2`` features per filter, standardised
on the fit split) fitted in closed form by ridge regression to one-hot labels. Dropping a filter
removes a block ``S`` of ``d`` features, and the ridge solution without it follows from the full
one without refitting (block inverse):

    P = (X^T X + lam I)^-1,   W = P X^T Y
    W_without_S = W - P[:, S] P[S, S]^-1 W[S]

so one step scores *every* remaining candidate at once, as a batched ``d x d`` solve and one
einsum over the validation logits; the chosen filter is then downdated out of ``P``, ``W`` and the
validation projections in ``O(D d (n + D))``. A whole layer costs one ``D x D`` inverse plus
``N`` cheap steps: ``benchmarks/exits/collective_cost.py`` measures it against the naive estimate.

Candidates are compared by validation accuracy; ties (frequent: accuracy moves in steps of
``1/n``) are broken by the validation squared error, which moves continuously. Following the
paper the selection stops when fewer than ``stop_fraction`` of the filters remain: those are
equally important and share the top score (:attr:`CollectiveRanking.order` still continues the
backward selection, so top-k exits get a strict order).

Examples:
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.randint(0, 2, (200,), generator=g)
    >>> signal = y[:, None, None].double() + 0.1 * torch.randn(200, 1, 1, generator=g)
    >>> feats = torch.cat([signal, signal, torch.randn(200, 1, 1, generator=g)], dim=1)
    >>> r = collective_ranking(feats[:100], y[:100], feats[100:], y[100:], stop_fraction=0.0)
    >>> sorted(r.order[:1].tolist()) in ([0], [1])   # one copy of the informative filter on top
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.utils.data import DataLoader, Dataset, Subset

from nestflex.errors import PruningError
from nestflex.graph import ChannelGroup, StructureGraph
from nestflex.pruning.importance import Importance, Reduce, register_importance

__all__ = [
    "CollectiveImportance",
    "CollectiveRanking",
    "collective_ranking",
    "exit_accuracy_curve",
    "min_filters",
    "pooled_activations",
    "pooled_responses",
]


@dataclass(frozen=True)
class CollectiveRanking:
    """The result of sequential backward selection on one layer.

    Attributes:
        order: filter indices, most important first (the reverse of the removal order).
        scores: ``(N,)`` float64, higher = more important; the survivors of the paper's stopping
            rule (the first count strictly below ``stop_fraction * N``, at least one) share the top
            score.
        kept_accuracy: ``kept_accuracy[k - 1]``: validation accuracy of the probe fed by the top
            ``k`` filters of ``order``, for ``k = 1..N``.
        fits: closed-form exit fits the selection evaluated (candidates scored); the naive
            algorithm fine-tunes this many exits.
    """

    order: torch.Tensor
    scores: torch.Tensor
    kept_accuracy: torch.Tensor
    fits: int


def _check_features(name: str, feats: torch.Tensor, labels: torch.Tensor) -> None:
    if feats.ndim != 3 or labels.ndim != 1 or feats.shape[0] != labels.shape[0]:
        raise PruningError(
            f"`{name}` features must be (n, filters, d) with labels (n,), got {tuple(feats.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if feats.shape[0] == 0:
        raise PruningError(
            f"the {name} split is empty (0 samples). HINT: collective ranking fits exits on a fit split and "
            "scores them on a validation split; pass non-empty data for both"
        )


def _check_pair(fit: torch.Tensor, fit_labels: torch.Tensor, name: str, other: torch.Tensor,
                other_labels: torch.Tensor) -> None:
    _check_features("fit", fit, fit_labels)
    _check_features(name, other, other_labels)
    if other.shape[1:] != fit.shape[1:]:
        raise PruningError(
            f"fit and {name} features differ in shape: {tuple(fit.shape[1:])} vs {tuple(other.shape[1:])}. "
            "HINT: collect both from the same layer with the same pooling"
        )


class _RidgePath:
    """Ridge probe on blocks of features, with exact block removal (see the module docstring)."""

    def __init__(self, fit_x, fit_y, val_x, val_y, num_classes: int, ridge: float) -> None:
        n, self.filters, self.d = fit_x.shape
        mean = fit_x.mean(0, keepdim=True)
        std = fit_x.std(0, keepdim=True, unbiased=False).clamp_min(1e-6)
        # standardised so one ridge strength suits any layer; the bias column is never removed
        x = torch.cat([((fit_x - mean) / std).reshape(n, -1), torch.ones(n, 1, dtype=torch.float64)], 1)
        nv = val_x.shape[0]
        xv = torch.cat([((val_x - mean) / std).reshape(nv, -1), torch.ones(nv, 1, dtype=torch.float64)], 1)
        y = F.one_hot(fit_y, num_classes).double()
        self.yv = val_y
        self.yv_hot = F.one_hot(val_y, num_classes).double()
        a = x.T @ x + ridge * n * torch.eye(x.shape[1], dtype=torch.float64)
        self.p = torch.linalg.inv(a)
        self.w = self.p @ (x.T @ y)
        self.z = xv @ self.p  # validation projections: logits of any downdate follow from them
        self.logits = xv @ self.w
        self.alive = torch.ones(self.filters, dtype=torch.bool)

    def _blocks(self, filters: torch.Tensor) -> torch.Tensor:
        return filters[:, None] * self.d + torch.arange(self.d)[None]  # (F, d) feature indices

    def correct(self) -> torch.Tensor:
        return self.logits.argmax(1) == self.yv

    def accuracy(self) -> float:
        return self.correct().double().mean().item()

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(alive filters, accuracy, mse)`` of the probe without each alive filter, batched."""
        alive = self.alive.nonzero().flatten()
        s = self._blocks(alive)
        pss = self.p[s[:, :, None], s[:, None, :]]  # (F, d, d)
        m = torch.linalg.solve(pss, self.w[s])  # (F, d, C)
        delta = torch.einsum("nfd,fdc->fnc", self.z[:, s], m)
        logits = self.logits[None] - delta
        acc = (logits.argmax(-1) == self.yv[None]).double().mean(1)
        mse = (logits - self.yv_hot[None]).pow(2).mean((1, 2))
        return alive, acc, mse

    def remove(self, f: int) -> None:
        s = self._blocks(torch.tensor([f]))[0]
        k = torch.linalg.inv(self.p[s][:, s])
        ps, ws, zs = self.p[:, s], self.w[s], self.z[:, s]
        self.logits = self.logits - zs @ k @ ws
        self.w = self.w - ps @ k @ ws
        self.z = self.z - zs @ k @ self.p[s]
        self.p = self.p - ps @ k @ self.p[s]
        self.alive[f] = False


def _survivors(n_filters: int, stop_fraction: float) -> int:
    """Filters left when the paper's selection stops: removal goes on while at least
    ``stop_fraction * N`` remain, so it stops at the first count strictly below it (at least 1)."""
    if stop_fraction <= 0:
        return 1
    return max(1, math.ceil(stop_fraction * n_filters - 1e-9) - 1)


def collective_ranking(
    fit_features: torch.Tensor,
    fit_labels: torch.Tensor,
    val_features: torch.Tensor,
    val_labels: torch.Tensor,
    *,
    ridge: float = 1e-3,
    stop_fraction: float = 0.2,
    num_classes: int | None = None,
) -> CollectiveRanking:
    """Sequential backward selection of one layer's filters with closed-form exits.

    Args:
        fit_features: ``(n, N, d)`` pooled responses of the layer's ``N`` filters (``d`` values
            each) on the split the exits are fitted on.
        fit_labels: ``(n,)`` int labels.
        val_features: the same as ``fit_features`` on the split candidates are scored on.
        val_labels: ``(n,)`` int labels of that split.
        ridge: ridge strength, relative to the sample count (features are standardised).
        stop_fraction: the paper's stop: when fewer than this share of the filters remain they
            share the top score. 0 ranks every filter strictly.
        num_classes: number of classes (default: from the labels).

    Returns:
        a :class:`CollectiveRanking`.

    Raises:
        PruningError: an empty split, mismatched shapes, or an argument out of range.
    """
    _check_pair(fit_features, fit_labels, "validation", val_features, val_labels)
    if not (isinstance(ridge, (int, float)) and ridge > 0):
        raise PruningError(f"`ridge` must be a positive number, got {ridge!r}")
    if not (isinstance(stop_fraction, (int, float)) and 0.0 <= stop_fraction < 1.0):
        raise PruningError(
            f"`stop_fraction` must be in [0, 1), got {stop_fraction!r}. HINT: FlexDNN stops at 0.2 (1/5 of the filters)"
        )
    c = int(num_classes or int(max(fit_labels.max(), val_labels.max())) + 1)
    path = _RidgePath(
        fit_features.double(), fit_labels.long(), val_features.double(), val_labels.long(), c, float(ridge)
    )
    n_filters = path.filters
    kept = torch.zeros(n_filters, dtype=torch.float64)
    kept[n_filters - 1] = path.accuracy()
    removed: list[int] = []
    fits = 0
    tie = 0.5 / val_labels.shape[0]  # below one sample's worth of accuracy: breaks ties only
    for step in range(n_filters - 1):
        alive, acc, mse = path.candidates()
        fits += alive.numel()
        key = acc - tie * mse / (mse.max() + 1e-12)
        f = int(alive[int(key.argmax())])
        path.remove(f)
        removed.append(f)
        kept[n_filters - 2 - step] = path.accuracy()
    removed.append(int(path.alive.nonzero()[0, 0]))
    order = torch.tensor(removed[::-1], dtype=torch.long)
    scores = torch.empty(n_filters, dtype=torch.float64)
    scores[torch.tensor(removed)] = torch.arange(n_filters, dtype=torch.float64)
    top = _survivors(n_filters, stop_fraction)
    scores[order[:top]] = float(n_filters - 1)  # "equally important, on top"
    return CollectiveRanking(order=order, scores=scores, kept_accuracy=kept, fits=fits)


def exit_accuracy_curve(
    fit_features: torch.Tensor,
    fit_labels: torch.Tensor,
    eval_features: torch.Tensor,
    eval_labels: torch.Tensor,
    order: Sequence[int] | torch.Tensor,
    *,
    ridge: float = 1e-3,
    num_classes: int | None = None,
    return_correct: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Accuracy of the closed-form exit fed by the top ``k`` filters of ``order``, ``k = 1..N``.

    Any ranking works (collective, L2, ...): the exit is refitted on the fit split for every
    ``k`` (exactly, by block removal) and scored on ``eval_*``: pass a split the ranking never saw.

    Args:
        fit_features: ``(n, N, d)`` pooled responses of the layer's ``N`` filters (``d`` values
            each) on the split the exits are fitted on.
        fit_labels: ``(n,)`` int labels of that split.
        eval_features: the same as ``fit_features`` on the split the exits are scored on.
        eval_labels: ``(n,)`` int labels of that split.
        order: the ranking, most important filter first: a permutation of ``0..N-1``.
        ridge: ridge strength, relative to the sample count (features are standardised).
        num_classes: number of classes (default: from the labels).
        return_correct: also return the ``(N, n)`` bool per-sample correctness (row ``k - 1``:
            ``k`` filters), for paired standard errors of accuracy differences.

    Returns:
        ``(N,)`` float64; entry ``k - 1`` is the accuracy with ``k`` filters (and the correctness
        with ``return_correct``).

    Raises:
        PruningError: an empty split, mismatched shapes, or ``order`` not a permutation of the
            filters.
    """
    _check_pair(fit_features, fit_labels, "evaluation", eval_features, eval_labels)
    order = torch.as_tensor(order, dtype=torch.long)
    n_filters = fit_features.shape[1]
    if sorted(order.tolist()) != list(range(n_filters)):
        raise PruningError(f"`order` must be a permutation of the {n_filters} filters, got {order.tolist()}")
    c = int(num_classes or int(max(fit_labels.max(), eval_labels.max())) + 1)
    path = _RidgePath(
        fit_features.double(), fit_labels.long(), eval_features.double(), eval_labels.long(), c, float(ridge)
    )
    out = torch.zeros(n_filters, dtype=torch.float64)
    correct = torch.zeros(n_filters, eval_labels.shape[0], dtype=torch.bool)
    correct[-1] = path.correct()
    for k in range(n_filters - 1, 0, -1):
        path.remove(int(order[k]))
        correct[k - 1] = path.correct()
    out = correct.double().mean(1)
    return (out, correct) if return_correct else out


def min_filters(curve: torch.Tensor, tolerance: float = 0.0, rule: str = "all_larger") -> int:
    """Fewest top-ranked filters whose exit matches the all-filter exit (FlexDNN's minimum count).

    Args:
        curve: ``(N,)`` accuracy with the top ``k`` filters at entry ``k - 1``.
        tolerance: accuracy a count may lose against the all-filter exit and still match.
        rule: ``"all_larger"`` (the paper's procedure read literally: drop the lowest-ranked
            filters while accuracy holds, i.e. the smallest ``k`` such that *every* count
            ``>= k`` matches; one noisy dip near ``N`` stops it) or ``"first"`` (the smallest
            ``k`` that matches: robust to dips, which noise makes common on small splits).

    Raises:
        PruningError: a tolerance outside [0, 1) or an unknown rule.

    Examples:
        >>> min_filters(torch.tensor([0.5, 0.9, 0.88, 0.9]), tolerance=0.0)
        4
        >>> min_filters(torch.tensor([0.5, 0.9, 0.88, 0.9]), tolerance=0.0, rule="first")
        2
        >>> min_filters(torch.tensor([0.5, 0.9, 0.88, 0.9]), tolerance=0.02)
        2
    """
    if not (isinstance(tolerance, (int, float)) and 0.0 <= tolerance < 1.0):
        raise PruningError(f"`tolerance` is an accuracy fraction in [0, 1), got {tolerance!r}")
    ok = curve >= curve[-1] - tolerance - 1e-12
    if rule == "first":
        return int(ok.nonzero()[0, 0]) + 1  # ok[-1] always holds, so there is one
    if rule != "all_larger":
        raise PruningError(
            f"`rule` must be 'all_larger' or 'first', got {rule!r}. HINT: 'first' is robust to noisy dips"
        )
    k = curve.numel()
    while k > 1 and bool(ok[k - 2]):
        k -= 1
    return k


# --- responses ------------------------------------------------------------------------------


def _as_batches(data: Any, name: str, batch_size: int) -> Iterable:
    if isinstance(data, Dataset) and not isinstance(data, torch.utils.data.IterableDataset):
        if len(data) == 0:  # type: ignore[arg-type]
            raise PruningError(
                f"the {name} split is empty (0 samples). HINT: pass a non-empty {name} dataset or DataLoader"
            )
        return DataLoader(data, batch_size=batch_size, shuffle=False)
    if data is None:
        raise PruningError(f"the {name} split is None. HINT: pass a dataset, a DataLoader or a list of batches")
    return data


class _Collector(fx.Interpreter):
    """Runs the traced model and pools each watched node's output per filter."""

    def __init__(self, gm: fx.GraphModule, watch: set[str], pool: int) -> None:
        super().__init__(gm)
        self.watch, self.pool, self.out = watch, pool, {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.watch:
            t = out.float().movedim(n.meta.get("channel_dim", 1), 1)  # tokens / channels-last: channels to dim 1
            if t.ndim == 4:
                size = (min(self.pool, t.shape[2]), min(self.pool, t.shape[3]))
                t = F.adaptive_avg_pool2d(t, size).flatten(2)
            else:
                t = t.reshape(t.shape[0], t.shape[1], -1)
            self.out[n.name] = t.double().cpu()
        return out


@torch.no_grad()
def pooled_activations(
    model: nn.Module,
    graph: StructureGraph,
    nodes: Sequence[str],
    data: Any,
    *,
    pool: int = 2,
    max_samples: int | None = None,
    batch_size: int = 128,
    name: str = "ranking",
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each graph node's output, average-pooled to ``pool x pool`` per channel, in eval mode.

    Args:
        model: the model ``graph`` was traced from (its device and dtype are used; train/eval
            flags are restored afterwards).
        graph: the traced model.
        nodes: names of the graph nodes whose outputs are collected (e.g. split point nodes).
        data: a Dataset (batched by ``batch_size``, in order), a DataLoader, or an iterable of
            ``(inputs, labels)`` batches.
        pool: each channel's map is average-pooled to at most ``pool x pool`` (``d = pool^2``
            values); outputs that are not 4-D are kept whole.
        max_samples: stop after this many samples; ``None``: all of ``data``.
        batch_size: batch size used when ``data`` is a Dataset.
        name: what the data is called in error messages (e.g. ``"ranking"``, ``"validation"``).

    Returns:
        ``({node: (n, channels, d)}, labels (n,))``.

    Raises:
        PruningError: the data is empty, a node the graph does not have, ``max_samples`` < 1.
    """
    known = {n.name for n in graph.gm.graph.nodes}
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise PruningError(f"`nodes` {unknown} are not in the traced graph. HINT: use split point names, e.g. "
                           f"{[p.node for p in graph.split_points[:3]]}")
    bad_count = isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1
    if max_samples is not None and bad_count:
        raise PruningError(f"`max_samples` must be a positive int or None (all), got {max_samples!r}")
    watch = set(nodes)
    param = next(model.parameters())
    was_training = {m: m.training for m in model.modules()}
    model.eval()
    feats: dict[str, list[torch.Tensor]] = {node: [] for node in watch}
    labels, n = [], 0
    try:
        for batch in _as_batches(data, name, batch_size):
            x, y = batch[0], batch[1]
            if max_samples is not None:
                x, y = x[: max_samples - n], y[: max_samples - n]
            col = _Collector(graph.gm, watch, pool)
            col.run(x.to(param.device, param.dtype))
            for node in watch:
                feats[node].append(col.out[node])
            labels.append(torch.as_tensor(y).long().cpu())
            n += x.shape[0]
            if max_samples is not None and n >= max_samples:
                break
    finally:
        for m, flag in was_training.items():
            m.train(flag)
    if n == 0:
        raise PruningError(f"the {name} split is empty (0 samples). HINT: pass a non-empty {name} dataset or DataLoader")
    return {node: torch.cat(v) for node, v in feats.items()}, torch.cat(labels)


def pooled_responses(
    model: nn.Module,
    graph: StructureGraph,
    groups: Sequence[ChannelGroup],
    data: Any,
    *,
    pool: int = 2,
    max_samples: int | None = None,
    batch_size: int = 128,
    name: str = "ranking",
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Each group's responses, average-pooled to ``pool x pool`` per filter, in eval mode
    (:func:`pooled_activations` of its response nodes).

    Args:
        model: the model ``graph`` was traced from.
        graph: the traced model.
        groups: the channel groups whose responses are collected (duplicates are collected
            once).
        data: a Dataset (batched by ``batch_size``, in order), a DataLoader, or an iterable of
            ``(inputs, labels)`` batches.
        pool: each filter's map is average-pooled to at most ``pool x pool``.
        max_samples: stop after this many samples; ``None``: all of ``data``.
        batch_size: batch size used when ``data`` is a Dataset.
        name: what the data is called in error messages.

    Returns:
        ``({group id: (n, width, d)}, labels (n,))``; a residual group's blocks are summed.

    Raises:
        PruningError: the data is empty.
    """
    # one entry per group: several exit locations of a residual stage share one group
    groups = list({g.id: g for g in groups}.values())
    nodes = [node for g in groups for node in graph.response_nodes(g)]
    acts, labels = pooled_activations(model, graph, nodes, data, pool=pool, max_samples=max_samples,
                                      batch_size=batch_size, name=name)
    # an interleaved group's channel is one channel in each block: its features are all of them
    return {g.id: g.blocks(sum(acts[node] for node in graph.response_nodes(g))).transpose(1, 2).flatten(2)
            for g in groups}, labels


def _split(data: Any, val_fraction: float, seed: int) -> tuple[Any, Any]:
    def is_batch(b: Any) -> bool:
        return isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b)

    if isinstance(data, (tuple, list)) and (is_batch(data) or any(is_batch(b) for b in data)):
        # one list of (x, y) batches (two of them would otherwise pass for a (fit, validation) pair)
        raise PruningError(
            "`collective` got a list of (x, y) batches, i.e. one split. HINT: pass data=(fit, validation), each "
            "a Dataset, DataLoader or list of batches, or one Dataset to split by `val_fraction`"
        )
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    ds = data.dataset if isinstance(data, DataLoader) else data
    if not isinstance(ds, Dataset):
        raise PruningError(
            f"`collective` needs a (fit, validation) pair or one Dataset to split, got {type(data).__name__}"
        )
    n = len(ds)  # type: ignore[arg-type]
    n_val = int(round(n * val_fraction))
    if n_val < 1 or n - n_val < 1:
        raise PruningError(
            f"cannot split {n} samples into fit and validation parts with `val_fraction`={val_fraction}: the "
            "validation split would be empty. HINT: pass more data or a (fit, validation) pair"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return Subset(ds, perm[n_val:]), Subset(ds, perm[:n_val])


class CollectiveImportance(Importance):
    """FlexDNN collective importance: sequential backward selection with closed-form exits.

    Args:
        pool: each filter's map is average-pooled to ``pool x pool`` before the exit probe.
        ridge: ridge strength of the probe (relative to the sample count).
        stop_fraction: survivors below this share of the filters share the top score.
        max_samples: at most this many samples per split.
        val_fraction: when ``data`` is one dataset, the share held out to score candidates.
        seed: seed of that split.
        batch_size: images per forward pass while collecting responses.

    ``data`` is a ``(fit, validation)`` pair (Datasets, DataLoaders or lists of ``(x, y)``
    batches) or a single Dataset, split by ``val_fraction``. Ranking is deterministic, so every
    data-parallel rank computes the same scores on the same data (``reduce`` is not needed).

    Examples:
        >>> from nestflex.models import create_model
        >>> from nestflex.graph import trace
        >>> model = create_model("vgg11", width=0.125)
        >>> graph = trace(model)
        >>> g = torch.Generator().manual_seed(0)
        >>> batch = [(torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))]
        >>> from nestflex.pruning import get_importance
        >>> scores = get_importance("collective")(model, graph, graph.prunable_groups[:1], data=(batch, batch))
        >>> scores[0].shape
        torch.Size([8])
    """

    name = "collective"
    needs_data = True

    def __init__(
        self,
        pool: int = 2,
        ridge: float = 1e-3,
        stop_fraction: float = 0.2,
        max_samples: int = 2000,
        val_fraction: float = 0.3,
        seed: int = 0,
        batch_size: int = 128,
    ) -> None:
        for arg, v in (("pool", pool), ("max_samples", max_samples), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PruningError(f"`{arg}` must be a positive int, got {v!r}")
        if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0.0 < val_fraction < 1.0:
            raise PruningError(f"`val_fraction` must be in (0, 1), got {val_fraction!r}")
        if not (isinstance(stop_fraction, (int, float)) and 0.0 <= stop_fraction < 1.0):
            raise PruningError(
                f"`stop_fraction` must be in [0, 1), got {stop_fraction!r}. HINT: FlexDNN stops at 0.2"
            )
        if not (isinstance(ridge, (int, float)) and ridge > 0):
            raise PruningError(f"`ridge` must be a positive number, got {ridge!r}")
        self.pool, self.ridge, self.stop_fraction = pool, float(ridge), float(stop_fraction)
        self.max_samples, self.val_fraction, self.seed, self.batch_size = max_samples, val_fraction, seed, batch_size
        #: the last ranking per group id (order, kept accuracy, fits), for reports
        self.rankings: dict[int, CollectiveRanking] = {}

    def scores(
        self,
        model: nn.Module,
        graph: StructureGraph,
        groups: Sequence[ChannelGroup] | None = None,
        data: Any = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        reduce: Reduce | None = None,
    ) -> dict[int, torch.Tensor]:
        if data is None:
            raise PruningError(
                "`collective` needs labelled data to fit and score exits. HINT: pass data=(fit, validation)"
            )
        groups = list(groups) if groups is not None else graph.prunable_groups
        fit, val = _split(data, self.val_fraction, self.seed)
        kw = {"pool": self.pool, "max_samples": self.max_samples, "batch_size": self.batch_size}
        fit_x, fit_y = pooled_responses(model, graph, groups, fit, name="fit", **kw)
        val_x, val_y = pooled_responses(model, graph, groups, val, name="validation", **kw)
        c = int(max(fit_y.max(), val_y.max())) + 1
        out = {}
        for g in groups:
            r = collective_ranking(
                fit_x[g.id], fit_y, val_x[g.id], val_y, ridge=self.ridge, stop_fraction=self.stop_fraction,
                num_classes=c,
            )
            self.rankings[g.id] = r
            out[g.id] = r.scores
        return out


register_importance("collective", CollectiveImportance)
