"""Keep or reject a pruning step from a paired comparison on the same validation images.

FilterPruning's default rule (``decision="threshold"``) keeps a step whose measured accuracy is
at least ``start - max_drop``. Near the goal that verdict is the split's noise: a step whose true
accuracy sits exactly at the goal is rejected half of the time. :func:`paired_decision` judges
the same step from the per-sample correctness of the start model and of the step on the same
images, and calls the step broken only when it is *confidently* below the goal.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from nestflex.errors import PruningError

__all__ = ["PairedDecision", "check_pairable", "describe_verdict", "paired_decision"]


@dataclass(frozen=True)
class PairedDecision:
    """The statistics behind one paired verdict (:func:`paired_decision`).

    Attributes:
        estimate: measured accuracy difference, step - start (negative: the step lost accuracy).
        bound: one-sided upper confidence bound of the true difference at ``confidence``.
        se: paired standard error of ``estimate``.
        n: validation images both models were scored on.
        max_drop: the allowed drop (start - goal).
        confidence: the bound's one-sided confidence.
        broken: ``True`` when ``bound < -max_drop`` (the step is confidently below the goal).
    """

    estimate: float
    bound: float
    se: float
    n: int
    max_drop: float
    confidence: float
    broken: bool

    def to_dict(self) -> dict[str, Any]:
        """Rounded, JSON-ready fields (what ``roadmap.json`` records per footprint)."""
        d = asdict(self)
        for k in ("estimate", "bound", "se", "max_drop"):
            d[k] = round(d[k], 6)
        return d


def describe_verdict(accuracy: float, goal: float, paired: PairedDecision | None) -> str:
    """A log line's account of a step's verdict: the figures the rule compared (the threshold
    rule's accuracy and goal; with ``paired``, the paired rule's difference and bound)."""
    if paired is None:
        return f"accuracy {accuracy:.4f} {'>=' if accuracy >= goal else '<'} goal {goal:.4f}"
    return (f"accuracy {accuracy:.4f} (goal {goal:.4f}); paired difference to the start "
            f"{100 * paired.estimate:+.2f} points, {100 * paired.confidence:g}% upper bound "
            f"{100 * paired.bound:+.2f} {'<' if paired.broken else '>='} {-100 * paired.max_drop:+.2f} "
            f"(se {100 * paired.se:.2f}, n {paired.n})")


def _flags(x: Any, name: str) -> np.ndarray:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim != 1 or not (arr.dtype == bool or np.isin(arr, (0, 1)).all()):
        raise PruningError(f"`{name}` must be a 1-D array of per-sample correct flags (bool or 0/1), got shape "
                           f"{arr.shape} and dtype {arr.dtype}")
    return arr.astype(np.float64)


def paired_decision(start: Any, step: Any, max_drop: float, confidence: float = 0.9) -> PairedDecision:
    """Whether a step is confidently below the goal, from both models' hits on the same images.

    With ``d_i = step_i - start_i`` (each in {-1, 0, 1}) the estimate is ``mean(d)`` and its
    paired standard error ``sd(d) / sqrt(n)`` (sample sd, ``ddof=1``): images both models get
    right or wrong cancel, which is what makes a paired comparison several times tighter than two
    independent accuracies. The upper bound is ``mean(d) + z * se`` with ``z`` the standard normal
    quantile at ``confidence`` (a normal approximation, good for the thousands of images a
    validation split has; a few dozen discordant images are enough), plus a continuity correction
    of one image, ``1 / n`` (Edwards' correction of McNemar's test: the difference moves in steps of
    whole images, and without it a step exactly at the goal was rejected at about ``1 - confidence``,
    0.1022, 0.0993 and 0.0998 in three simulations of 20-60k splits, instead of at most that;
    docs/results/keep_reject). The step is broken when the
    bound is below ``-max_drop``; otherwise it is kept, so a step that the split cannot tell from
    the goal is kept. The variance is floored at ``1 / n``, as if one image disagreed: with no
    discordant image (identical hits, or ``n < 2``) the sample variance is 0 and the estimate
    would otherwise count as exact.

    Args:
        start: per-sample correct flags of the start (unpruned) model, bool or 0/1, shape ``(n,)``.
        step: the step model's flags on the same images in the same order.
        max_drop: the allowed drop (start accuracy - goal), in [0, 1).
        confidence: one-sided confidence of the bound, in (0.5, 1): the rate at which a step
            whose true accuracy is exactly at the goal is rejected is at most ``1 - confidence``
            (a little under it with the continuity correction: 0.09 at 0.9 on 5,000 images).

    Returns:
        The :class:`PairedDecision`.

    Raises:
        PruningError: flags of another shape or length, no images, ``max_drop`` or
            ``confidence`` out of range.

    Examples:
        >>> a = np.array([1, 1, 0, 1] * 250, dtype=bool)
        >>> paired_decision(a, a, max_drop=0.01).broken  # identical predictions
        False
        >>> b = a.copy(); b[:100] = False  # 75 images lost: 7.5 points
        >>> d = paired_decision(a, b, max_drop=0.01)
        >>> d.broken, round(d.estimate, 3), d.n
        (True, -0.075, 1000)
    """
    if not (isinstance(confidence, (int, float)) and 0.5 < confidence < 1.0):
        raise PruningError(f"`confidence` must be in (0.5, 1), got {confidence!r}. HINT: 0.9 rejects a step whose "
                           f"true accuracy is exactly at the goal about 10% of the time")
    if not (isinstance(max_drop, (int, float)) and 0.0 <= max_drop < 1.0):
        raise PruningError(f"`max_drop` is an accuracy difference in [0, 1), got {max_drop!r}. HINT: 0.01 is one point")
    a, b = _flags(start, "start"), _flags(step, "step")
    if a.shape != b.shape:
        raise PruningError(f"`start` and `step` must score the same images, got {a.size} and {b.size} flags. "
                           f"HINT: evaluate both on the same deterministic loader (and `eval_batches`)")
    n = a.size
    if n == 0:
        raise PruningError("`start` and `step` hold no samples. HINT: check the validation split")
    d = b - a
    var = float(d.var(ddof=1)) if n > 1 else 0.0
    se = math.sqrt(max(var, 1.0 / n) / n)
    estimate = float(d.mean())
    bound = estimate + NormalDist().inv_cdf(confidence) * se + 1.0 / n
    return PairedDecision(estimate=estimate, bound=bound, se=se, n=int(n), max_drop=float(max_drop),
                          confidence=float(confidence), broken=bound < -max_drop)


def check_pairable(world_size: int, loader: Any) -> None:
    """``decision="paired"`` compares per-sample results of two evaluations: they must see the same
    images in the same order, on one process (the flags are not gathered across ranks).

    Args:
        world_size: the Trainer's processes.
        loader: the evaluation loader.

    Raises:
        PruningError: more than one process, or a shuffling loader.
    """
    if world_size > 1:
        raise PruningError(f"`decision`='paired' runs on one process; this Trainer has world_size="
                           f"{world_size} (per-sample results are not gathered across ranks). HINT: use "
                           f"`decision`='threshold' under DDP")
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        raise PruningError("`decision`='paired' pairs every step with the start model on the same images, and the "
                           "evaluation loader shuffles (RandomSampler). HINT: evaluate on a loader with "
                           "`shuffle=False`, or pass `eval_dataloader=`")
