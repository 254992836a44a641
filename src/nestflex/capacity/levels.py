"""Which footprints of a roadmap become the levels of a multi-capacity model, in which order.

Level 0 is the seed, level ``K-1`` the vanilla (unpruned) model; the levels between are
footprints chosen evenly spaced in cost: MACs, or the footprints' measured time when the roadmap
was planned with a latency cost (:mod:`nestflex.pruning.cost`) or the caller prices them. Because the roadmap prunes iteratively, the channels
kept at a smaller footprint are a subset of those kept at a larger one, so every group can be
put in *nested order*: the seed's channels first, then the channels each larger level adds back.
Level ``k`` then uses a width prefix of every group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from nestflex.errors import CapacityError
from nestflex.pruning.roadmap import Roadmap

__all__ = ["LevelPlan", "choose_levels", "footprint_costs", "plan_levels"]


@dataclass(frozen=True)
class LevelPlan:
    """Nested layout of a multi-capacity model built from a roadmap.

    Attributes:
        steps: roadmap step of each level, level 0 (the seed) first, the vanilla model last.
        order: per group name, original channel indices in nested order.
        widths: per level, the width of every group (a prefix of ``order``).
        macs: roadmap MACs of each level's footprint.
        costs: each level's cost the levels were spaced in (e.g. milliseconds), ``None`` when
            spaced in MACs.
    """

    steps: tuple[int, ...]
    order: dict[str, list[int]]
    widths: tuple[dict[str, int], ...]
    macs: tuple[int, ...]
    costs: tuple[float, ...] | None = None

    @property
    def num_levels(self) -> int:
        return len(self.steps)


def footprint_costs(roadmap: Roadmap, costs: Mapping[int, float] | None = None) -> dict[int, float]:
    """What the levels are spaced in, per roadmap step: ``costs`` when given, else each
    footprint's recorded cost when every footprint has one (a roadmap planned with a cost
    model), else its MACs.

    Args:
        roadmap: the pruning roadmap.
        costs: a cost per roadmap step (every footprint's), or ``None``.

    Raises:
        CapacityError: ``costs`` misses a footprint.
    """
    if costs is not None:
        missing = [f.step for f in roadmap.footprints if f.step not in costs]
        if missing:
            raise CapacityError(f"`costs` has no cost for roadmap steps {missing}. HINT: price every footprint")
        return {f.step: float(costs[f.step]) for f in roadmap.footprints}
    if roadmap.footprints and all(f.cost is not None for f in roadmap.footprints):
        return {f.step: float(f.cost) for f in roadmap.footprints}
    return {f.step: float(f.macs) for f in roadmap.footprints}


def choose_levels(roadmap: Roadmap, levels: int, costs: Mapping[int, float] | None = None) -> list[int]:
    """Roadmap steps of ``levels`` descendants, seed first, vanilla last, evenly spaced in cost.

    Level ``i`` (0 < i < levels - 1) takes the footprint nearest in cost to
    ``seed + i * (vanilla - seed) / (levels - 1)`` among those that still leave room for the
    levels after it, so the choice is always ``levels`` distinct footprints in nesting order (the
    roadmap's steps, which MACs follow; a measured time may not, step by step). The cost is MACs
    unless the footprints record another (:func:`footprint_costs`).

    Args:
        roadmap: the pruning roadmap whose footprints are chosen from.
        levels: number of descendants K, seed and vanilla model included (``2 <= levels <=``
            the roadmap's number of footprints).
        costs: the cost of each footprint by roadmap step (e.g. milliseconds on the target
            device: :class:`~nestflex.pruning.LatencyCost`); ``None``: :func:`footprint_costs`.

    Returns:
        The roadmap steps of the chosen footprints, seed (the last step) first, vanilla last.

    Raises:
        CapacityError: ``levels`` < 2, or more levels than the roadmap has footprints.

    Examples:
        >>> from nestflex.pruning.roadmap import Footprint
        >>> fps = [Footprint(s, 0.9, 10, m, {}, {}) for s, m in enumerate([100, 80, 60, 50, 40, 20])]
        >>> choose_levels(Roadmap("M", "l1", 0.9, 0.9, {}, fps), 3)
        [5, 2, 0]
    """
    if not isinstance(levels, int) or isinstance(levels, bool) or levels < 2:
        raise CapacityError(f"`levels` must be an int >= 2 (the seed and the vanilla model at least), got {levels!r}")
    value = footprint_costs(roadmap, costs)
    # nesting order (the seed, the highest step, first): a measured time need not fall at every
    # step (noise, a width between two fast ones), and the levels must stay nested whatever it says
    fps = sorted(roadmap.footprints, key=lambda f: -f.step)
    if levels > len(fps):
        raise CapacityError(
            f"`levels`={levels} but the roadmap has only {len(fps)} footprints (steps "
            f"{[f.step for f in roadmap.footprints]}). HINT: use levels <= {len(fps)}, or prune with a smaller "
            "`step` / more `max_steps` to get more footprints"
        )
    low, high = value[fps[0].step], value[fps[-1].step]
    chosen = [0]
    for i in range(1, levels - 1):
        target = low + i * (high - low) / (levels - 1)
        lo, hi = chosen[-1] + 1, len(fps) - 1 - (levels - 1 - i)
        chosen.append(min(range(lo, hi + 1), key=lambda j: (abs(value[fps[j].step] - target), j)))
    chosen.append(len(fps) - 1)
    return [fps[j].step for j in chosen]


def plan_levels(roadmap: Roadmap, steps: list[int], costs: Mapping[int, float] | None = None) -> LevelPlan:
    """The nested channel order and per-level widths for the given roadmap steps.

    Args:
        roadmap: the pruning roadmap.
        steps: one roadmap step per level, smallest model first (see :func:`choose_levels`);
            the last must be step 0 (the vanilla model, every channel kept).
        costs: the cost of each footprint by roadmap step, recorded as the plan's ``costs``;
            ``None``: the footprints' recorded costs when they have them (else no costs).

    Raises:
        CapacityError: an unknown step, steps not from small to large, or footprints that are
            not nested (a channel kept by a smaller level but removed by a larger one).
    """
    known = [f.step for f in roadmap.footprints]
    for s in steps:
        if s not in known:
            raise CapacityError(f"`steps` contains {s!r}, which is not a footprint of the roadmap; steps: {known}")
    if len(set(steps)) != len(steps) or len(steps) < 2:
        raise CapacityError(f"`steps` must be >= 2 distinct roadmap steps, got {steps!r}")
    if steps[-1] != 0 or any(a <= b for a, b in zip(steps, steps[1:])):
        raise CapacityError(
            f"`steps` must go from the smallest footprint to the vanilla one (decreasing steps ending in 0), "
            f"got {steps!r}"
        )
    kept = [roadmap.kept(s) for s in steps]
    order: dict[str, list[int]] = {}
    for g in roadmap.groups:
        seq: list[int] = []
        seen: set[int] = set()
        for k, level in enumerate(kept):
            now = set(level[g])
            if not seen <= now:
                raise CapacityError(
                    f"footprints are not nested: group {g!r} keeps channels {sorted(seen - now)} at step "
                    f"{steps[k - 1]} but not at the larger step {steps[k]}. HINT: use a roadmap written by FilterPruning"
                )
            seq += sorted(now - seen)  # channels this level adds back, in original order
            seen = now
        order[g] = seq
    widths = tuple({g: len(level[g]) for g in roadmap.groups} for level in kept)
    macs = tuple(roadmap.footprint(s).macs for s in steps)
    if costs is None and all(roadmap.footprint(s).cost is not None for s in steps):
        costs = {s: roadmap.footprint(s).cost for s in steps}
    spent = tuple(round(float(costs[s]), 6) for s in steps) if costs is not None else None
    return LevelPlan(steps=tuple(steps), order=order, widths=widths, macs=macs, costs=spent)
