"""FlexDNN insertion plan: which candidate exits to keep, by greedy removal on exit quality.

Every exit helps the samples that leave there (they skip the rest of the network) and costs every
sample that reaches it (its head runs). For the current set of exits, on a calibration split:

    G_j = n_exit_j  * (cost of the final exit - cost of stopping at j)     MACs it saves
    C_j = n_reach_j * head_macs_j                                          MACs it costs
    Q_j = G_j / C_j

The plan starts with every candidate and repeatedly removes the exit with the lowest ``Q`` as
long as total MACs fall; it stops as soon as removing it would not lower them, so the total never
rises (the paper's greedy search over the ``2^K`` subsets). For every subset the exit thresholds
are refitted (FlexDNN's lossless thresholds, :func:`~nestflex.exits.calibration.fit_lossless_thresholds`)
and samples that pass none are answered by the final exit, so accuracy stays that of the final
exit on the calibration split while MACs fall.

Examples:
    >>> import torch
    >>> conf = torch.tensor([[0.9, 0.9, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2], [1.0, 1.0, 1.0, 1.0]])
    >>> correct = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    >>> plan = insertion_plan(conf, correct, taps=[10, 50], head_macs=[2, 5], backbone_macs=100)
    >>> plan.kept, plan.all_candidates_macs, plan.mean_macs
    ([0], 59.5, 57.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from nestflex.deploy.exits import ExitError, decide
from nestflex.exits.calibration import fit_lossless_thresholds

__all__ = ["InsertionPlan", "insertion_plan", "subset_cost"]


@dataclass(frozen=True)
class InsertionPlan:
    """The chosen exits and how the greedy search got there.

    Attributes:
        kept: indices (into the candidates) of the exits kept, in execution order.
        thresholds: lossless threshold of each kept exit, fitted on the calibration split.
        mean_macs: MACs per sample of the plan on the calibration split.
        accuracy: accuracy of the plan there (final-exit fallback).
        all_candidates_macs: MACs per sample with every candidate kept.
        backbone_macs: MACs per sample of the backbone alone.
        steps: one record per removal: ``{"removed", "q", "mean_macs"}``, then the refused
            removal (``"accepted": False``) that stopped the search, if any.
    """

    kept: list[int]
    thresholds: list[float]
    mean_macs: float
    accuracy: float
    all_candidates_macs: float
    backbone_macs: float
    steps: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def subset_cost(
    subset: Sequence[int],
    conf: torch.Tensor,
    correct: torch.Tensor,
    taps: Sequence[float],
    head_macs: Sequence[float],
    backbone_macs: float,
) -> dict[str, Any]:
    """Thresholds, per-sample exit, MACs and accuracy with only the early exits ``subset``.

    Args:
        subset: candidate indices, increasing.
        conf: ``(K + 1, N)`` confidence of every candidate exit, final last.
        correct: ``(K + 1, N)`` bool, whether each exit's prediction is right.
        taps: MACs of the backbone up to each candidate's tap.
        head_macs: MACs of each candidate's head.
        backbone_macs: MACs of the whole backbone.

    Returns:
        ``{"thresholds", "exit_index", "costs", "mean_macs", "accuracy"}``: the lossless
        thresholds fitted for ``subset`` (final-exit fallback), each sample's exit, the MACs of
        stopping at each kept exit (final last), and the mean MACs and accuracy per sample.
    """
    rows = list(subset) + [conf.shape[0] - 1]
    c, r = conf[rows], correct[rows]
    thresholds = fit_lossless_thresholds(c, r) if subset else []
    exit_index, answer_index = decide(c, thresholds, "final")
    heads = torch.tensor([float(head_macs[j]) for j in subset], dtype=torch.float64).cumsum(0)
    costs = [float(taps[j]) + float(heads[i]) for i, j in enumerate(subset)]
    costs.append(float(backbone_macs) + (float(heads[-1]) if subset else 0.0))
    per_sample = torch.tensor(costs, dtype=torch.float64)[exit_index]
    right = r[answer_index, torch.arange(c.shape[1])]
    return {
        "thresholds": thresholds,
        "exit_index": exit_index,
        "costs": costs,
        "mean_macs": float(per_sample.mean()),
        "accuracy": float(right.double().mean()),
    }


def insertion_plan(
    conf: torch.Tensor,
    correct: torch.Tensor,
    taps: Sequence[float],
    head_macs: Sequence[float],
    backbone_macs: float,
) -> InsertionPlan:
    """Greedy removal of the lowest-quality exit while total MACs fall (see the module docstring).

    Args:
        conf: ``(K + 1, N)`` confidence of each of ``K`` candidate exits (execution order) and the
            final exit (last row) on a calibration split.
        correct: ``(K + 1, N)`` bool, whether each exit's prediction is right.
        taps: ``K`` MACs of the backbone up to each candidate's tap (non-decreasing).
        head_macs: ``K`` MACs of each candidate's head.
        backbone_macs: MACs of the whole backbone.

    Returns:
        the :class:`InsertionPlan`: the kept exits, their thresholds and the search's steps.

    Raises:
        ExitError: no candidate exits, mismatched shapes, or an empty calibration split.
    """
    k = len(taps)
    if k == 0 or conf.shape[0] < 2:
        raise ExitError(
            "the insertion plan got no candidate exits. HINT: pass at least one early exit candidate "
            "(rows of `conf` before the final exit's) with its tap and head MACs"
        )
    if conf.shape != correct.shape or conf.ndim != 2 or conf.shape[0] != k + 1 or len(head_macs) != k:
        raise ExitError(
            f"`conf` and `correct` must both be (K + 1, N) with K = len(taps) = len(head_macs); got "
            f"{tuple(conf.shape)}, {tuple(correct.shape)}, {k} taps and {len(head_macs)} head costs"
        )
    if conf.shape[1] == 0:
        raise ExitError("the calibration split is empty (N = 0). HINT: plan on a non-empty validation split")
    if any(b > a for a, b in zip(taps[1:], taps[:-1])):
        raise ExitError(f"`taps` must follow execution order (non-decreasing MACs), got {list(taps)}. "
                        "HINT: sort the candidates (and the rows of `conf` and `correct`) by their tap MACs")
    kept = list(range(k))
    state = subset_cost(kept, conf, correct, taps, head_macs, backbone_macs)
    first = state["mean_macs"]
    steps: list[dict[str, Any]] = []
    while kept:
        counts = torch.bincount(state["exit_index"], minlength=len(kept) + 1).double()
        reach = counts.flip(0).cumsum(0).flip(0)  # samples that run exit i's head = exit there or later
        final_cost = state["costs"][-1]
        q = []
        for i, j in enumerate(kept):
            gain = float(counts[i]) * (final_cost - state["costs"][i])
            cost = float(reach[i]) * float(head_macs[j])
            q.append(gain / cost if cost > 0 else float("inf"))
        worst = min(range(len(kept)), key=lambda i: q[i])
        trial = kept[:worst] + kept[worst + 1 :]
        trial_state = subset_cost(trial, conf, correct, taps, head_macs, backbone_macs)
        accepted = trial_state["mean_macs"] < state["mean_macs"]
        steps.append({"removed": kept[worst], "q": q[worst], "mean_macs": trial_state["mean_macs"],
                      "accepted": accepted})
        if not accepted:
            break
        kept, state = trial, trial_state
    return InsertionPlan(
        kept=kept,
        thresholds=state["thresholds"],
        mean_macs=state["mean_macs"],
        accuracy=state["accuracy"],
        all_candidates_macs=first,
        backbone_macs=float(backbone_macs),
        steps=steps,
    )
