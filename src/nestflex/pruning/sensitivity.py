"""Per-layer pruning sensitivity (NestDNN Fig. 3.3) and the budget allocation drawn from it.

The profile prunes one group at a time, a growing fraction of its least important channels
(by a criterion's scores), with no retraining, and records accuracy. Two uses:

- comparing criteria: a better ranking keeps accuracy higher at the same fraction;
- allocating each pruning step across layers (:func:`allocation_weights`): layers differ a lot
  in how much they tolerate, so scores are never compared across layers. A group's *tolerance*
  is the largest profiled fraction whose accuracy (and that of every smaller fraction) stays
  within ``max_drop`` of the unpruned model; each step removes from a group a share of its
  channels proportional to its tolerance, and a group with tolerance 0 is left alone.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from nestflex.errors import PruningError
from nestflex.graph import ChannelGroup, StructureGraph
from nestflex.graph.surgery import prune_channels

__all__ = ["DEFAULT_FRACTIONS", "keep_top", "pruned_copy", "sensitivity_profile", "allocation_weights", "plot_sensitivity"]

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SCHEMA_VERSION = 1


def keep_top(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` highest scores, ascending; ties broken by the lower index.

    Args:
        scores: one importance score per channel (1-D).
        keep: how many channels to keep.

    Examples:
        >>> keep_top(torch.tensor([0.5, 2.0, 0.5, 1.0]), 2)
        tensor([1, 3])
    """
    order = torch.sort(-scores.double(), stable=True).indices
    return torch.sort(order[:keep]).values


def pruned_copy(graph: StructureGraph, group: ChannelGroup, keep: torch.Tensor) -> nn.Module:
    """The traced model with ``group`` physically pruned to ``keep``; the original is untouched.

    The copy is of ``graph.gm``, which holds only the model's modules (not, say, a Lightning
    Trainer attached to a LightningModule).

    Args:
        graph: the traced model.
        group: the channel group of ``graph`` to prune.
        keep: indices of the group's channels to keep (e.g. from :func:`keep_top`).
    """
    gm = copy.deepcopy(graph.gm)
    prune_channels(gm, copy.deepcopy(group), keep)
    return gm


def sensitivity_profile(
    graph: StructureGraph,
    scores: Mapping[int, torch.Tensor],
    evaluate: Callable[[nn.Module], float],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    criterion: str = "",
) -> dict:
    """Accuracy with each scored group's lowest-scoring ``fraction`` of channels removed.

    Args:
        graph: the traced model (unchanged by the profile).
        scores: criterion scores by group id; each group in it is profiled.
        evaluate: model -> accuracy in [0, 1] (e.g. :func:`nestflex.pruning.accuracy` on a
            validation loader).
        fractions: fractions of each group's channels to remove, each in (0, 1).
        criterion: name recorded in the result.

    Returns:
        ``{"schema_version", "criterion", "fractions", "baseline_accuracy", "layers": [{"id",
        "group", "width", "removed": [...], "accuracy": [...]}]}`` (lists follow ``fractions``; a
        group always keeps one channel).

    Raises:
        PruningError: a fraction outside (0, 1), or no group to profile.
    """
    fractions = [float(f) for f in fractions]
    bad = [f for f in fractions if not 0.0 < f < 1.0]
    if bad or not fractions:
        raise PruningError(f"`fractions` must be non-empty, each in (0, 1), got {list(fractions)}")
    if not scores:
        raise PruningError("no channel group to profile. HINT: the model has no prunable group")
    layers = []
    for gid, s in scores.items():
        g = graph.group(gid)
        accs, removed = [], []
        for f in fractions:
            n = min(g.width - 1, round(f * g.width))
            accs.append(round(evaluate(pruned_copy(graph, g, keep_top(s, g.width - n))), 6) if n else None)
            removed.append(n)
        layers.append({"id": g.id, "group": g.name, "width": g.width, "removed": removed, "accuracy": accs})
    base = round(evaluate(graph.gm), 6)
    for row in layers:  # a fraction that removes nothing has the baseline accuracy
        row["accuracy"] = [base if a is None else a for a in row["accuracy"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "criterion": criterion,
        "fractions": fractions,
        "baseline_accuracy": base,
        "layers": layers,
    }


def allocation_weights(profile: dict, max_drop: float) -> dict[int, float]:
    """Share of each pruning step a group takes, in [0, 1], from its tolerance.

    A group's tolerance is the largest profiled fraction f such that the accuracy at f and at
    every smaller fraction is at least ``baseline - max_drop``. Weights are tolerances over the
    largest one. If no group tolerates even the smallest fraction, every group gets weight 1
    (uniform) and a warning says so.

    Args:
        profile: a sensitivity profile (:func:`sensitivity_profile`).
        max_drop: the accuracy drop a group may cause and still count as tolerant, as an
            accuracy difference in [0, 1] (0.02: two points).

    Returns:
        The weight of each group, by group id.

    Raises:
        PruningError: ``max_drop`` outside [0, 1].
    """
    if not 0.0 <= max_drop <= 1.0:
        raise PruningError(f"`max_drop` is an accuracy difference in [0, 1], got {max_drop!r}")
    base = profile["baseline_accuracy"]
    tol: dict[int, float] = {}
    for row in profile["layers"]:
        t = 0.0
        for f, a in zip(profile["fractions"], row["accuracy"]):
            if a < base - max_drop:
                break
            t = f
        tol[row["id"]] = t
    top = max(tol.values())
    if top == 0.0:
        warnings.warn(
            f"no layer keeps accuracy within {max_drop} of {base} at {profile['fractions'][0]:.0%} removed; "
            "allocating pruning uniformly across layers"
        )
        return {k: 1.0 for k in tol}
    return {k: t / top for k, t in tol.items()}


def plot_sensitivity(profiles: Sequence[dict], png: str | Path, title: str = "", layers: Sequence[str] | None = None) -> None:
    """One panel per layer, accuracy vs fraction removed, one line per criterion's profile.

    Needs matplotlib.

    Args:
        profiles: sensitivity profiles of the same model (:func:`sensitivity_profile`), one per
            criterion.
        png: path of the image written (its parent directories are created).
        title: figure title (empty: none).
        layers: the group names to plot, one panel each; ``None``: every layer of the first
            profile.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(layers) if layers is not None else [r["group"] for r in profiles[0]["layers"]]
    cols = min(5, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names):
        for prof in profiles:
            row = next(r for r in prof["layers"] if r["group"] == name)
            ax.plot([0] + prof["fractions"], [prof["baseline_accuracy"]] + row["accuracy"], marker=".", label=prof["criterion"])
        ax.set_title(name, fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("fraction of filters removed (no retraining)")
    fig.supylabel("top-1 accuracy")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
