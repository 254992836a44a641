"""Triplet Response Residual (NestDNN): how well a filter separates classes.

For a triplet (anchor, positive of the same class, negative of another class) and filter i
with response F_i:

    TRR_i = sum over triplets of ||F_i(a) - F_i(n)||^2 - ||F_i(a) - F_i(p)||^2

**Which tensor is F_i.** The group's *response*: its activations (after BatchNorm and ReLU,
:meth:`StructureGraph.response_nodes`). The raw conv output would score a channel that BN then
scales to nothing, or that ReLU zeroes, as if the next layer saw it; after the activation the
values are what the rest of the network consumes. A residual group writes the same channels in
every block, so its TRR sums over every block's output activation.

**Cost.** The paper calls TRR far costlier than L1. Here it is one forward pass over the 3T
triplet images, in batches: every layer's response is reduced in place as the fx interpreter
produces it (nothing but the per-channel sums is kept), and the residual difference uses
two subtractions into reused buffers and one per-channel dot product each, vectorised over
channels.
``benchmarks/pruning/trr_cost.py`` measures it against a plain forward pass.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch
from torch import fx, nn
from torch.utils.data import DataLoader, Dataset, Subset

from nestflex.errors import PruningError
from nestflex.graph import ChannelGroup, StructureGraph
from nestflex.pruning.importance import Importance, Reduce, register_importance

__all__ = ["TRR", "sample_triplets", "dataset_targets"]


def dataset_targets(data: Dataset | DataLoader) -> torch.Tensor:
    """Labels of every sample of ``data`` (a Dataset, a Subset of one, or a DataLoader's dataset).

    Reads a ``targets`` attribute when there is one (torchvision, nestflex datasets); otherwise
    it indexes every sample, which decodes images and is slow on large sets.

    Args:
        data: a Dataset of ``(image, label)`` samples, a Subset of one, or a DataLoader over
            one.

    Returns:
        int64 tensor ``(N,)`` of labels, in the dataset's (or subset's) order.

    Raises:
        PruningError: the dataset is empty or its samples carry no integer label.
    """
    ds = data.dataset if isinstance(data, DataLoader) else data
    n = len(ds)
    if n == 0:
        raise PruningError("the ranking dataset is empty. HINT: TRR samples triplets from the training data")
    if isinstance(ds, Subset):
        return dataset_targets(ds.dataset)[torch.as_tensor(ds.indices, dtype=torch.long)]
    targets = getattr(ds, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets, dtype=torch.long)
    try:
        return torch.as_tensor([int(ds[i][1]) for i in range(n)], dtype=torch.long)
    except (TypeError, IndexError, ValueError) as e:
        raise PruningError(
            f"cannot read labels from {type(ds).__name__}: samples must be (image, int label) pairs ({e})"
        ) from e


def sample_triplets(targets: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """Class-balanced (anchor, positive, negative) index triplets, deterministic for a seed.

    Anchor classes take turns (in a seeded order), so every class anchors ``count / C``
    triplets give or take one; positives are another sample of the anchor's class, negatives
    a sample of a uniformly drawn other class.

    Classes with a single sample cannot anchor (there is no positive); they are left out as
    anchors with a warning and still serve as negatives.

    Args:
        targets: the label of every sample (1-D, integer; :func:`dataset_targets`).
        count: number of triplets to draw (``>= 1``).
        seed: seed of the draw.

    Returns:
        int64 tensor ``(count, 3)`` of dataset indices.

    Raises:
        PruningError: ``count`` < 1, fewer than two classes, or no class with two samples.

    Examples:
        >>> t = sample_triplets(torch.tensor([0, 0, 1, 1, 2]), 4, seed=0)
        >>> t.shape, bool((torch.tensor([0, 0, 1, 1, 2])[t[:, 0]] == torch.tensor([0, 0, 1, 1, 2])[t[:, 1]]).all())
        (torch.Size([4, 3]), True)
    """
    if not isinstance(count, int) or count < 1:
        raise PruningError(f"`triplets` must be a positive int, got {count!r}")
    targets = torch.as_tensor(targets, dtype=torch.long).flatten()
    classes, counts = torch.unique(targets, return_counts=True)
    if classes.numel() < 2:
        raise PruningError(
            f"triplets need at least two classes in the ranking data, found {classes.tolist()}. "
            "HINT: rank on the training split, not a single-class subset"
        )
    eligible = classes[counts >= 2]
    if eligible.numel() == 0:
        raise PruningError("no class has two samples, so no triplet has a positive. HINT: rank on more data")
    if eligible.numel() < classes.numel():
        lonely = classes[counts < 2].tolist()
        warnings.warn(f"classes {lonely} have a single sample: they never anchor a triplet (they can be negatives)")
    gen = torch.Generator().manual_seed(int(seed))
    members = {int(c): torch.nonzero(targets == c).flatten() for c in classes}
    order = eligible[torch.randperm(eligible.numel(), generator=gen)]
    anchor_cls = order[torch.arange(count) % order.numel()]
    out = torch.empty(count, 3, dtype=torch.long)
    for c in order.tolist():
        rows = torch.nonzero(anchor_cls == c).flatten()
        idx, k = members[c], rows.numel()
        a = torch.randint(idx.numel(), (k,), generator=gen)
        p = (a + 1 + torch.randint(idx.numel() - 1, (k,), generator=gen)) % idx.numel()  # never the anchor
        others = classes[classes != c]
        neg_cls = others[torch.randint(others.numel(), (k,), generator=gen)]
        neg = torch.empty(k, dtype=torch.long)
        for nc in neg_cls.unique().tolist():
            sel = neg_cls == nc
            pool = members[nc]
            neg[sel] = pool[torch.randint(pool.numel(), (int(sel.sum()),), generator=gen)]
        out[rows, 0], out[rows, 1], out[rows, 2] = idx[a], idx[p], neg
    return out


class _ResidualReducer(fx.Interpreter):
    """Runs the traced model and folds each watched node's output into per-channel TRR sums.

    ``scratch`` is a pair of flat float32 buffers reused by every watched node and batch: fresh
    temporaries the size of an early VGG activation are large enough for the allocator to map
    and fault in new pages every time, which cost more than the arithmetic itself.
    """

    def __init__(self, gm: fx.GraphModule, watch: dict[str, torch.Tensor], triplets: int,
                 scratch: list[torch.Tensor]) -> None:
        super().__init__(gm)
        self.watch, self.t, self.scratch = watch, triplets, scratch

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        acc = self.watch.get(n.name)
        if acc is not None:
            # channels to dim 1 (a token or channels-last response keeps them last)
            t = out.movedim(n.meta.get("channel_dim", 1), 1)
            a, p, neg = t.float().reshape(*t.shape[:2], -1).split(self.t)  # (T, C, H*W) each
            if self.scratch[0].numel() < a.numel() or self.scratch[0].device != a.device:
                self.scratch[:] = [torch.empty(a.numel(), device=a.device) for _ in range(2)]
            q = torch.sub(a, neg, out=self.scratch[0][: a.numel()].view(a.shape))
            y = torch.sub(a, p, out=self.scratch[1][: a.numel()].view(a.shape))
            # |a-n|^2 - |a-p|^2 per channel: two reductions over contiguous rows, no temporaries
            r = torch.linalg.vecdot(q, q).sum(0, dtype=torch.float64) - torch.linalg.vecdot(y, y).sum(0, dtype=torch.float64)
            acc += r.cpu()
        return out


class TRR(Importance):
    """Triplet Response Residual importance (NestDNN), reduced on the fly in one forward pass.

    Args:
        triplets: number of triplets (the paper's setting is in the thousands; 1000 = 3000 images).
        seed: triplet sampling seed; also seeds any random data transform while ranking, so the
            ranking is reproducible and leaves the caller's global RNG untouched.
        batch_size: triplets per forward pass (3x as many images).

    ``data`` is the ranking dataset (or a DataLoader, whose ``dataset`` is used): the training
    split, with labels. With ``world_size`` > 1 each rank takes every ``world_size``-th triplet
    and ``reduce`` sums the partial TRRs, so all ranks get identical scores.
    """

    name = "trr"
    needs_data = True

    def __init__(self, triplets: int = 1000, seed: int = 0, batch_size: int = 128) -> None:
        for arg, v in (("triplets", triplets), ("batch_size", batch_size)):
            if not isinstance(v, int) or v < 1:
                raise PruningError(f"`{arg}` must be a positive int, got {v!r}")
        self.triplets, self.seed, self.batch_size = triplets, int(seed), batch_size

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
            raise PruningError("`trr` needs labelled data to sample triplets from. HINT: pass the training dataset")
        dataset = data.dataset if isinstance(data, DataLoader) else data
        groups = list(groups) if groups is not None else graph.prunable_groups
        trip = sample_triplets(dataset_targets(dataset), self.triplets, self.seed)[rank::world_size]
        watch: dict[str, torch.Tensor] = {}
        owners: dict[int, list[str]] = {}
        for g in groups:
            owners[g.id] = graph.response_nodes(g)
            for node in owners[g.id]:
                watch.setdefault(node, torch.zeros(g.width * g.copies, dtype=torch.float64))
        param = next(model.parameters())
        was_training = {m: m.training for m in model.modules()}
        model.eval()
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(self.seed)
                scratch = [torch.empty(0), torch.empty(0)]
                for start in range(0, trip.shape[0], self.batch_size):
                    chunk = trip[start : start + self.batch_size]
                    # (a_1..a_B, p_1..p_B, n_1..n_B): the reducer splits the batch in three
                    images = torch.stack([dataset[int(i)][0] for i in chunk.t().flatten()])
                    _ResidualReducer(graph.gm, watch, chunk.shape[0], scratch).run(images.to(param.device, param.dtype))
        finally:
            for m, flag in was_training.items():
                m.train(flag)
        # an interleaved group's channel is one channel in each block: its residuals add up
        flat = torch.cat([g.blocks(sum(watch[n] for n in owners[g.id]), 0).sum(0) for g in groups]) \
            if groups else torch.zeros(0)
        if reduce is not None:
            flat = reduce(flat)
        return dict(zip([g.id for g in groups], flat.split([g.width for g in groups])))


register_importance("trr", TRR)
