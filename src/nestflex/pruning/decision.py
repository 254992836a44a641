"""Keep or reject a pruning step from a paired comparison on the same validation images.

FilterPruning's default rule (``decision="threshold"``) keeps a step whose measured accuracy is
at least ``start - max_drop``. Near the goal that verdict is the split's noise: a step whose true
accuracy sits exactly at the goal is rejected half of the time. :func:`paired_decision` judges
the same step from the per-sample correctness of the start model and of the step on the same
images, and calls the step broken only when it is *confidently* below the goal.
:func:`confirm_seed` asks the opposite question of the roadmap's last model (``FilterPruning``'s
``confirm``): is it *confidently* within the goal?
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch

from nestflex.errors import PruningError

__all__ = ["PairedDecision", "SeedConfirmation", "check_pairable", "confirm_seed", "describe_verdict",
           "paired_decision"]


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
    estimate, se, n = _paired_difference(start, step, "step", max_drop, confidence)
    bound = estimate + NormalDist().inv_cdf(confidence) * se + 1.0 / n
    return PairedDecision(estimate=estimate, bound=bound, se=se, n=n, max_drop=float(max_drop),
                          confidence=float(confidence), broken=bound < -max_drop)


def _paired_difference(start: Any, other: Any, name: str, max_drop: float, confidence: float) -> tuple[float, float, int]:
    """``mean(other - start)``, its paired standard error (variance floored at one discordant image)
    and the image count, after checking the arguments both verdicts take."""
    if not (isinstance(confidence, (int, float)) and not isinstance(confidence, bool) and 0.5 < confidence < 1.0):
        raise PruningError(f"`confidence` must be in (0.5, 1), got {confidence!r}. HINT: 0.9 rejects a step whose "
                           f"true accuracy is exactly at the goal about 10% of the time")
    if not (isinstance(max_drop, (int, float)) and 0.0 <= max_drop < 1.0):
        raise PruningError(f"`max_drop` is an accuracy difference in [0, 1), got {max_drop!r}. HINT: 0.01 is one point")
    a, b = _flags(start, "start"), _flags(other, name)
    if a.shape != b.shape:
        raise PruningError(f"`start` and `{name}` must score the same images, got {a.size} and {b.size} flags. "
                           f"HINT: evaluate both on the same deterministic loader (and `eval_batches`)")
    n = a.size
    if n == 0:
        raise PruningError(f"`start` and `{name}` hold no samples. HINT: check the validation split")
    d = b - a
    var = float(d.var(ddof=1)) if n > 1 else 0.0
    return float(d.mean()), math.sqrt(max(var, 1.0 / n) / n), int(n)


@dataclass(frozen=True)
class SeedConfirmation:
    """The statistics behind one confirmation of the roadmap's last model (:func:`confirm_seed`).

    Attributes:
        estimate: measured accuracy difference, seed - start (negative: the seed lost accuracy).
        lower: one-sided lower confidence bound of the true difference at ``confidence``.
        se: paired standard error of ``estimate``.
        n: validation images both models were scored on.
        max_drop: the allowed drop (start - goal).
        confidence: the bound's one-sided confidence.
        confirmed: ``True`` when ``lower >= -max_drop`` (the seed is confidently within the goal).
    """

    estimate: float
    lower: float
    se: float
    n: int
    max_drop: float
    confidence: float
    confirmed: bool

    def to_dict(self) -> dict[str, Any]:
        """Rounded, JSON-ready fields (what ``roadmap.json`` records under ``confirm``)."""
        d = asdict(self)
        for k in ("estimate", "lower", "se", "max_drop"):
            d[k] = round(d[k], 6)
        return d


def confirm_seed(start: Any, seed: Any, max_drop: float, confidence: float = 0.9) -> SeedConfirmation:
    """Whether the roadmap's last model is confidently within the goal, from both models' hits.

    The mirror image of :func:`paired_decision`: the lower bound ``mean(d) - z * se - 1 / n`` of the
    paired difference must be at least ``-max_drop``. A step is judged leniently (kept unless
    confidently broken, or by the threshold), so the model the roadmap ends on is the one most
    likely to sit at the goal's edge, where an accuracy on other images (the test split) falls
    below the goal about half of the time; this verdict keeps it only when the validation split
    says it is within the goal with ``confidence``. A seed with true drop ``max_drop - 1.28 se``
    passes about half of the time at 0.9.

    Args:
        start: per-sample correct flags of the start (unpruned) model, bool or 0/1, shape ``(n,)``.
        seed: the seed's flags on the same images in the same order.
        max_drop: the allowed drop (start accuracy - goal), in [0, 1).
        confidence: one-sided confidence of the bound, in (0.5, 1).

    Returns:
        The :class:`SeedConfirmation`.

    Raises:
        PruningError: as :func:`paired_decision`.

    Examples:
        >>> a = np.arange(5000) < 4350  # the start model: 87% of 5,000 images
        >>> b = a.copy(); b[:130] = False; b[4350:4450] = True  # 130 lost, 100 gained: -0.6 points
        >>> c = confirm_seed(a, b, max_drop=0.01)  # within 1 point, but not confidently
        >>> c.confirmed, round(c.estimate, 4), round(c.lower, 4)
        (False, -0.006, -0.0101)
        >>> b = a.copy(); b[:60] = False; b[4350:4400] = True  # -0.2 points
        >>> confirm_seed(a, b, max_drop=0.01).confirmed
        True
    """
    estimate, se, n = _paired_difference(start, seed, "seed", max_drop, confidence)
    lower = estimate - NormalDist().inv_cdf(confidence) * se - 1.0 / n
    return SeedConfirmation(estimate=estimate, lower=lower, se=se, n=n, max_drop=float(max_drop),
                            confidence=float(confidence), confirmed=lower >= -max_drop)


def check_pairable(world_size: int, loader: Any, arg: str = "`decision`='paired'") -> None:
    """``decision="paired"`` (and ``confirm``) compare per-sample results of two evaluations: they
    must see the same images in the same order, on one process (the flags are not gathered across
    ranks).

    Args:
        world_size: the Trainer's processes.
        loader: the evaluation loader.
        arg: the argument that asks for the pairing, as the error names it.

    Raises:
        PruningError: more than one process, or a shuffling loader.
    """
    if world_size > 1:
        raise PruningError(f"{arg} runs on one process; this Trainer has world_size={world_size} (per-sample "
                           f"results are not gathered across ranks). HINT: leave it out under DDP "
                           f"(`decision`='threshold', `confirm`=None)")
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        raise PruningError(f"{arg} pairs models on the same images, and the evaluation loader shuffles "
                           f"(RandomSampler). HINT: evaluate on a loader with `shuffle=False`, or pass `eval_dataloader=`")
