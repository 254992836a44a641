"""Per-exit thresholds along the accuracy-MACs front: one threshold vector per accuracy level.

One threshold shared by every exit (the sweep of :func:`~nestflex.exits.calibration.exit_profile`)
is a poor dial for exits that differ: an accurate but expensive early exit wants a different
threshold than a cheap late one. :func:`threshold_front` fits one threshold per early exit for
every accuracy level, greedily:

1. start with every early exit closed (threshold 1: nobody exits, the final exit's accuracy);
2. for each exit, find its next move: the highest grid value below its current threshold at
   which at least one more sample leaves there (lower confidence values change nothing until
   then, so the search jumps over them);
3. among the moves that keep accuracy within ``max_drop`` of the start, take the one that saves
   the most MACs per unit of accuracy lost (moves that lose nothing first, largest saving first),
   record the new operating point, and repeat until no exit can make such a move.

Every point is evaluated with the runtime's policy (:func:`nestflex.deploy.exits.decide`), so
MACs charge each head a sample runs. The points are fitted on the split given and, with one free
threshold per exit, overfit it: on FlexDNN's 13 exits the accuracy of a point chosen on
validation fell by up to about a point on test (docs/flexdnn.md). Measure them on a held-out split
(:func:`~nestflex.exits.calibration.evaluate_thresholds`) before trusting them; this is why
FlexDNN's shipped operating points stay the shared-threshold sweep.

Examples:
    >>> import torch
    >>> conf = torch.tensor([[0.95, 0.9, 0.3, 0.2], [1.0, 1.0, 1.0, 1.0]])
    >>> correct = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    >>> pts = threshold_front(conf, correct, exit_macs=[20, 100], backbone_macs=100)
    >>> [(p["thresholds"], p["accuracy"], p["mean_macs"]) for p in pts[:3]]
    [([1.0], 1.0, 100.0), ([0.94], 1.0, 80.0), ([0.89], 1.0, 60.0)]
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from nestflex.deploy.exits import FALLBACKS, ExitError, decide

__all__ = ["FRONT_GRID", "threshold_front"]

#: Thresholds the front moves between (steps of 0.01, and a fine tail near 1 where confidences bunch).
FRONT_GRID: tuple[float, ...] = tuple(sorted({round(0.01 * i, 2) for i in range(101)} | {0.995, 0.999}))


def _point(conf, correct, thresholds, costs, backbone_macs, fallback) -> dict[str, Any]:
    exit_index, answer_index = decide(conf, thresholds, fallback)
    right = correct[answer_index, torch.arange(conf.shape[1])]
    macs = float(costs[exit_index].mean())
    return {"thresholds": list(thresholds), "accuracy": float(right.double().mean()), "mean_macs": macs,
            "mean_macs_fraction": macs / backbone_macs, "_exit_index": exit_index}


def threshold_front(
    conf: torch.Tensor,
    correct: torch.Tensor,
    exit_macs: Sequence[float],
    backbone_macs: float,
    max_drop: float = 0.05,
    grid: Sequence[float] = FRONT_GRID,
    fallback: str = "final",
) -> list[dict[str, Any]]:
    """Per-exit thresholds for every accuracy level down to ``max_drop`` below the final exit's.

    Args:
        conf: ``(K, N)`` confidences, one row per exit, the final exit last.
        correct: ``(K, N)`` bool, whether each exit's prediction is right.
        exit_macs: ``K`` MACs per sample of stopping at each exit (heads run so far included).
        backbone_macs: MACs of the backbone alone (the reference for fractions).
        max_drop: stop once accuracy is this far below the start (a fraction, e.g. 0.05).
        grid: the threshold values the search moves between.
        fallback: the runtime policy's fallback (``final``: FlexDNN's).

    Returns:
        the operating points in the order found, MACs strictly falling (accuracy mostly falls too,
        but a move that loses nothing may also gain): each
        ``{"thresholds", "accuracy", "mean_macs", "mean_macs_fraction"}``.

    Raises:
        ExitError: mismatched shapes, no samples, exit costs that fall along the exits, a
            non-positive ``backbone_macs``, a ``max_drop`` or a ``grid`` value outside [0, 1], an
            unknown ``fallback``.
    """
    if conf.ndim != 2 or conf.shape != correct.shape or conf.shape[1] == 0 or len(exit_macs) != conf.shape[0]:
        raise ExitError(f"`conf` and `correct` must both be (K, N) with N >= 1 and `exit_macs` K long; got "
                        f"{tuple(conf.shape)}, {tuple(correct.shape)} and {len(exit_macs)} costs. HINT: one row and "
                        "one cost per exit, the final exit last (`MultiExitNetwork.exit_macs`)")
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0.0 <= max_drop <= 1.0:
        raise ExitError(f"`max_drop` must be an accuracy fraction in [0, 1], got {max_drop!r}. HINT: 0.05 is 5 points")
    if not backbone_macs > 0:
        raise ExitError(f"`backbone_macs` must be positive (the reference for fractions), got {backbone_macs!r}")
    costs = torch.as_tensor(list(exit_macs), dtype=torch.float64)
    if bool((costs[1:] < costs[:-1]).any()):
        raise ExitError(f"`exit_macs` must not fall along the exits (a later exit runs everything an earlier one "
                        f"did), got {costs.tolist()}")
    bad = [g for g in grid if not 0.0 <= float(g) <= 1.0]
    if bad:
        raise ExitError(f"`grid` values must be thresholds in [0, 1], got {bad}")
    if fallback not in FALLBACKS:
        raise ExitError(f"`fallback` must be one of {', '.join(FALLBACKS)} (the runtime policy's), got {fallback!r}")
    values = torch.tensor(sorted({float(g) for g in grid} | {1.0}), dtype=conf.dtype)
    early = conf.shape[0] - 1
    at = [len(values) - 1] * early  # every early exit closed: threshold 1
    state = _point(conf, correct, [1.0] * early, costs, backbone_macs, fallback)
    floor = state["accuracy"] - max_drop
    points = [state]
    while True:
        best, best_key = None, None
        for k in range(early):
            # samples that reach exit k and do not leave there yet; the most confident leaves first
            waiting = (state["_exit_index"] >= k) & (conf[k] <= values[at[k]])
            if not bool(waiting.any()):
                continue
            below = (values < conf[k][waiting].max()).nonzero()
            if below.numel() == 0:
                continue
            j = int(below[-1, 0])
            thr = list(state["thresholds"])
            thr[k] = round(float(values[j]), 6)
            trial = _point(conf, correct, thr, costs, backbone_macs, fallback)
            if trial["accuracy"] < floor - 1e-12:  # too lossy now; another exit's move may still fit
                continue
            saved, lost = state["mean_macs"] - trial["mean_macs"], state["accuracy"] - trial["accuracy"]
            # free moves (no accuracy lost) first, by saving; then the best saving per accuracy lost
            key = (1, saved, -lost) if lost <= 0 else (0, saved / lost, 0.0)
            if best_key is None or key > best_key:
                best, best_key, best_at = trial, key, (k, j)
        if best is None:
            break
        at[best_at[0]] = best_at[1]
        state = best
        points.append(state)
    return [{k: v for k, v in p.items() if not k.startswith("_")} for p in points]
