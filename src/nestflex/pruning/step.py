"""One pruning step: how many channels each group loses, and which; and what its result means.

Two modes decide what a retrained step means: the accuracy goal (NestDNN's, :func:`decide_step`)
and the budget, in MACs or in a cost model's units (:func:`budget_limit`, :func:`budget_reached`,
:func:`budget_scale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from nestflex.errors import PruningError
from nestflex.graph import StructureGraph
from nestflex.pruning.sensitivity import keep_top

#: how a group's unrounded target width becomes a width it may take (:func:`plan_step`)
SNAPS = ("nearest", "up")

__all__ = ["SNAPS", "StepDecision", "budget_limit", "budget_reached", "budget_scale", "decide_step", "plan_step", "shrink"]


def plan_step(
    graph: StructureGraph,
    scores: Mapping[int, torch.Tensor],
    weights: Mapping[int, float],
    step: float,
    min_channels: int = 1,
    round_to: int = 1,
    targets: Mapping[int, int] | None = None,
    allowed: Mapping[int, Sequence[int] | None] | None = None,
    snap: str = "nearest",
    price: Callable[[Mapping[int, int]], float] | None = None,
    max_cut: float | None = None,
) -> dict[int, torch.Tensor]:
    """Channels to keep per group (current indexing) after one step.

    Group ``g`` of current width ``w`` loses ``round(step * weights[g] * w)`` channels, its
    lowest-scoring ones, never going below ``min_channels`` (:func:`shrink`). With ``round_to`` > 1
    the step shrinks the group's *target*, the width it would have without rounding
    (``targets[g]``, default its current width), and the kept count is the multiple of
    ``round_to`` nearest to the new target (ties: the smaller; never below the smallest multiple
    >= ``min_channels``; never above the current width; ``targets`` is ignored without
    rounding), so pruned layers keep SIMD-friendly widths (as Torch-Pruning's ``round_to``) and
    follow the unrounded schedule: a group whose nearest multiple is still its current width
    waits this step while its target goes on shrinking, instead of waiting forever (a 16-channel
    group losing 5% a step reaches 8 after four steps). The caller keeps the targets
    (:func:`shrink` of each). Groups whose count comes out 0 are left out of the result; an
    empty result means nothing more can be pruned at this step size.

    Args:
        graph: the traced model, at its current (possibly already pruned) widths.
        scores: importance scores by group id, one per current channel; only these groups are
            pruned.
        weights: each group's share of the step by group id, in [0, 1]
            (:func:`~nestflex.pruning.allocation_weights`); a group not listed gets 0.
        step: fraction of a group's channels removed at weight 1 (e.g. 0.1).
        min_channels: no group goes below this many channels.
        round_to: kept widths are multiples of this (1: no rounding; 8 or 16 for SIMD-friendly
            widths).
        targets: each group's unrounded width by group id, kept by the caller across steps
            (used only with ``round_to`` > 1 or ``allowed``; default: the current width).
        allowed: the widths each group may take by group id, ascending (a cost model's
            :meth:`~nestflex.pruning.CostModel.widths_for`: the measured fast widths); the kept
            count is the allowed width nearest to the target, as with ``round_to`` (ties: the
            smaller; a group with no allowed width in ``[min_channels, width)`` waits;
            never above the current width). A group not listed, or listed as ``None``, is not
            restricted. Not together with ``round_to`` > 1.
        snap: which of the widths a group may take (a multiple of ``round_to``, an ``allowed``
            width) its target becomes. ``nearest`` (default): the nearest one, ties to the
            smaller. ``up``: the smallest one at or above the target, so a group drops to a width
            only once the unrounded schedule has reached it: where the allowed widths are far
            apart (a CPU that runs 3x3 convs in blocks of 16 or 32 channels: 64 -> 32 -> 16) a
            step never removes channels the schedule has not yet removed. (FilterPruning restarts
            a retried step's targets from the seed's widths: targets that had already passed a
            width would take it again whatever the step size.)
        price: the model's cost with the given groups at the given widths (the rest as traced),
            e.g. ``lambda w: cost(graph, w)`` for a :class:`~nestflex.pruning.CostModel`; with
            ``max_cut``, the step cap's measure.
        max_cut: the most one step may cut from ``price`` (in its units; ``None``: no cap). Where
            widths come in steps, many groups can reach their next width at once (ResNet-50's
            same-width bottlenecks, all at 64 -> 32 in one step: 0.15 of the model's time gone
            where the step asked for 0.05): past the cap, groups wait for the next step, the one
            whose target went furthest past the width it leaves first (ties: in ``scores``
            order), each taken while the cut stays within the cap (the first always is). A
            waiting group's target goes on shrinking, so it comes first next time.

    Returns:
        The indices of the channels to keep (ascending, current indexing), by group id, for the
        groups that lose at least one channel.

    Raises:
        PruningError: ``round_to`` is not an int ``>= 1``, ``round_to`` > 1 with ``allowed``, or an
            unknown ``snap``.

    Examples:
        >>> from nestflex.models import create_model
        >>> from nestflex.graph import trace
        >>> g = trace(create_model("vgg11", width=0.125))
        >>> scores = {x.id: torch.arange(x.width, dtype=torch.float64) for x in g.prunable_groups}
        >>> plan = plan_step(g, scores, {x.id: 1.0 for x in g.prunable_groups}, 0.25)
        >>> plan[0].tolist()  # 8 channels, 2 removed: the two lowest scores
        [2, 3, 4, 5, 6, 7]
        >>> plan = plan_step(g, scores, {x.id: 1.0 for x in g.prunable_groups}, 0.25, round_to=4)
        >>> plan[0].tolist()  # 6 kept rounds to 4 (the tie goes to fewer channels)
        [4, 5, 6, 7]
        >>> 0 in plan_step(g, scores, {x.id: 1.0 for x in g.prunable_groups}, 0.25, round_to=4, snap="up")
        False
    """
    if (price is None) != (max_cut is None) or (max_cut is not None and not max_cut > 0):
        raise PruningError(f"pass `price` and a `max_cut` > 0 together (the step cap), or neither; got price="
                           f"{'a function' if price else None}, max_cut={max_cut!r}")
    if not isinstance(round_to, int) or round_to < 1:
        raise PruningError(f"`round_to` must be an int >= 1, got {round_to!r}. HINT: 8 or 16 for SIMD-friendly widths")
    if allowed is not None and round_to > 1:
        raise PruningError(f"pass `allowed` widths (a cost model's) or `round_to`={round_to}, not both. HINT: the "
                           f"measured widths already say which widths are fast")
    if snap not in SNAPS:
        raise PruningError(f"`snap` must be one of {SNAPS}, got {snap!r}. HINT: 'up' drops a group to a width only "
                           f"once its schedule reaches it")
    floor = -(-min_channels // round_to) * round_to  # the smallest multiple >= min_channels
    plan, overdue = {}, {}
    for gid, s in scores.items():
        width = graph.group(gid).width
        widths = (allowed or {}).get(gid)
        # the target may sit above the width (the last multiple was the lower one): never grows
        target = width if targets is None or (round_to == 1 and widths is None) else targets.get(gid, width)
        keep = unrounded = min(shrink(target, weights.get(gid, 0.0), step, min_channels), width)
        if round_to > 1 and keep < width:
            lower = (keep // round_to) * round_to
            up = lower + (round_to if keep > lower else 0)
            keep = up if snap == "up" else lower if keep - lower <= round_to - (keep - lower) else lower + round_to
            keep = min(max(keep, floor), width)
        elif widths is not None and keep < width:
            options = [w for w in widths if min_channels <= w <= width] or [width]
            if snap == "up":  # the smallest at or above the target (the width itself is always one)
                keep = min([w for w in options if w >= keep] or [width])
            else:
                keep = min(options, key=lambda w: (abs(w - keep), w))
        if keep < width:
            plan[gid] = keep_top(s, keep)
            overdue[gid] = (width - unrounded) / (width - keep)
    return plan if price is None else _capped(plan, overdue, price, max_cut)


def _capped(plan: dict[int, torch.Tensor], overdue: Mapping[int, float],
            price: Callable[[Mapping[int, int]], float], max_cut: float) -> dict[int, torch.Tensor]:
    """The groups of ``plan`` one step takes under the cap (:func:`plan_step`'s ``max_cut``)."""
    start = price({})
    if not plan or start - price({g: k.numel() for g, k in plan.items()}) <= max_cut:
        return plan
    order = sorted(plan, key=lambda g: -overdue[g])  # stable: ties keep the scores' order
    taken: dict[int, int] = {}
    for gid in order:
        trial = taken | {gid: plan[gid].numel()}
        if not taken or start - price(trial) <= max_cut:
            taken = trial
    return {g: plan[g] for g in plan if g in taken}


def shrink(width: int, weight: float, step: float, min_channels: int = 1) -> int:
    """A group's unrounded width after one step: ``width - round(step * weight * width)``, never
    below ``min_channels`` (nor above ``width``).

    Args:
        width: the group's width (or unrounded target width) before the step.
        weight: the group's share of the step, in [0, 1].
        step: fraction of the channels removed at weight 1.
        min_channels: the smallest width allowed.

    Examples:
        >>> shrink(16, 0.2, 0.25), shrink(16, 1.0, 0.25), shrink(3, 1.0, 0.9, min_channels=2)
        (15, 12, 2)
    """
    return width - max(min(round(step * weight * width), width - min_channels), 0)


@dataclass(frozen=True)
class StepDecision:
    """What a retrained pruning step leads to (:func:`decide_step`).

    Attributes:
        action: ``keep`` (record the footprint, go on), ``recover`` (train the same pruned model
            one more epoch, then judge it again), ``retry`` (roll back to the seed, prune again
            with a smaller step) or ``stop`` (roll back to the seed; the roadmap ends).
        scale: the step-size multiplier for the next step.
        retries: consecutive broken steps so far.
        status: the roadmap's stopping reason when ``action == "stop"`` (``goal_broken``), else ``None``.
    """

    action: str
    scale: float
    retries: int
    status: str | None = None


def decide_step(
    accuracy: float, goal: float, scale: float, retries: int, backoff: int, recovered: int = 0, recover: int = 0,
    rejected: int = 0, retry_budget: int | None = None, meets: bool | None = None,
) -> StepDecision:
    """NestDNN's rule, as a pure function of the callback's state and the measured accuracy.

    A step whose retrained accuracy meets ``goal`` is kept, and earns back the step size a broken
    one halved (otherwise one early failure, often noise, would shrink every later step). A step
    that misses it first gets up to ``recover`` more epochs of retraining (``recovered`` so far):
    NestDNN stops when the pruned model *can no longer* meet the goal after retraining, and one
    short retraining often lands a fraction of a point low by chance (benchmarks/pruning/prune_noise.py
    measures how much). A step that still misses it is retried from the seed with half the step,
    at most ``backoff`` times in a row and, when ``retry_budget`` is set, at most that many times
    over the whole roadmap (``rejected``: tries rejected before this one); then the roadmap ends
    with the seed. The budget bounds the stage's time: on a roadmap that grinds at the noise floor
    every rejected try costs a full retraining (docs/pruning.md#time).

    Args:
        accuracy: the step's retrained validation accuracy, in [0, 1].
        goal: the accuracy every kept footprint must meet, in [0, 1].
        scale: the current step-size multiplier (1.0: the full step).
        retries: consecutive broken steps so far.
        backoff: the most consecutive retries with a halved step before the roadmap ends.
        recovered: extra retraining epochs this step has had so far.
        recover: the most extra retraining epochs a step that misses the goal gets.
        rejected: tries rejected over the whole roadmap before this one.
        retry_budget: the most rejected tries over the whole roadmap; ``None``: no limit.
        meets: whether the step meets the goal, when another rule judged it (``decision="paired"``:
            not :attr:`~nestflex.pruning.PairedDecision.broken`); ``None``: ``accuracy >= goal``.

    Returns:
        The :class:`StepDecision` (action, next scale and retries, stopping reason).

    Examples:
        >>> decide_step(0.90, 0.89, scale=0.5, retries=1, backoff=2)
        StepDecision(action='keep', scale=1.0, retries=0, status=None)
        >>> decide_step(0.88, 0.89, scale=1.0, retries=0, backoff=2, recovered=0, recover=1)
        StepDecision(action='recover', scale=1.0, retries=0, status=None)
        >>> decide_step(0.85, 0.89, scale=1.0, retries=0, backoff=2, recovered=1, recover=1)
        StepDecision(action='retry', scale=0.5, retries=1, status=None)
        >>> decide_step(0.85, 0.89, scale=0.25, retries=2, backoff=2)
        StepDecision(action='stop', scale=0.25, retries=2, status='goal_broken')
        >>> decide_step(0.85, 0.89, scale=1.0, retries=0, backoff=2, rejected=3, retry_budget=3)
        StepDecision(action='stop', scale=1.0, retries=0, status='goal_broken')
        >>> decide_step(0.8899, 0.89, scale=1.0, retries=0, backoff=2, meets=True)  # the paired rule kept it
        StepDecision(action='keep', scale=1.0, retries=0, status=None)
    """
    if (accuracy >= goal) if meets is None else meets:
        return StepDecision("keep", min(1.0, scale * 2), 0)
    if recovered < recover:
        return StepDecision("recover", scale, retries)
    if retries >= backoff or (retry_budget is not None and rejected >= retry_budget):
        return StepDecision("stop", scale, retries, "goal_broken")
    return StepDecision("retry", scale / 2, retries + 1)


def budget_limit(start_macs: float, target_macs: float) -> float:
    """The most a model may keep under a budget of ``target_macs`` of ``start_macs``.

    Args:
        start_macs: MACs of the unpruned model (an int), or its cost under a cost model (a
            float, e.g. milliseconds: FilterPruning ``target_cost``).
        target_macs: the budget, a fraction of ``start_macs`` in (0, 1).

    Returns:
        MACs are whole, so an int start gives the int at or below the share; a float cost is
        not rounded.

    Examples:
        >>> budget_limit(1000, 0.5), budget_limit(999, 0.5), budget_limit(2.5, 0.5)
        (500, 499, 1.25)
    """
    if isinstance(start_macs, float):
        return start_macs * target_macs
    return math.floor(start_macs * target_macs)


def budget_reached(macs: float, limit: float) -> bool:
    """Whether a model of ``macs`` MACs (or cost) is within the budget :func:`budget_limit` gives.

    Args:
        macs: the model's multiply-accumulates per sample, or its cost under the budget's cost model.
        limit: the budget in the same units (:func:`budget_limit`).

    Returns:
        ``True`` when ``macs`` is at or below ``limit``.

    Examples:
        >>> budget_reached(500, 500), budget_reached(501, 500)
        (True, False)
    """
    return macs <= limit


def budget_scale(macs_at: Callable[[float], float], limit: float, resolution: float = 1 / 1024) -> float:
    """The share of the full step the next step of the budget mode takes (FilterPruning
    ``target_macs`` or ``target_cost``).

    A full step that stays above the budget is taken whole (1.0). One that would go below it is
    scaled down to the smallest share whose step lands at or below ``limit`` (bisection to
    ``resolution``), so the roadmap ends at the budget, within one step's granularity (a group
    loses whole channels), instead of up to a full step under it.

    Args:
        macs_at: MACs (or cost) the model would have after a step of the given share of the
            full step (0: no step, 1: the full step); non-increasing in the share.
        limit: the most the budget allows, in the same units (:func:`budget_limit`); above the
            current model's ``macs_at(0)`` (the caller stops once :func:`budget_reached`).
        resolution: the bisection's precision on the share.

    Returns:
        The share in (0, 1]; a step of that share lands at or below ``limit`` unless even the
        full step stays above it (then 1.0).

    Examples:
        >>> round(budget_scale(lambda s: round(1000 * (1 - 0.4 * s)), limit=900), 2)  # a full step: 600
        0.25
        >>> budget_scale(lambda s: round(1000 * (1 - 0.4 * s)), limit=500)  # above the budget anyway
        1.0
    """
    if macs_at(1.0) > limit:
        return 1.0
    low, high = 0.0, 1.0  # invariant: macs_at(low) > limit >= macs_at(high)
    while high - low > resolution:
        mid = (low + high) / 2
        if macs_at(mid) <= limit:
            high = mid
        else:
            low = mid
    return high
