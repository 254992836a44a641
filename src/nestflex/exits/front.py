"""Per-exit thresholds along the accuracy-MACs front: one threshold vector per accuracy level.

One threshold shared by every exit (the sweep of :func:`~nestflex.exits.calibration.exit_profile`)
is a poor dial for exits that differ: an accurate but expensive early exit wants a different
threshold than a cheap late one. :func:`threshold_front` fits one threshold per early exit for
every accuracy level, greedily:

1. start with every early exit closed (threshold 1: nobody exits, the final exit's accuracy);
2. for each exit, find its next move: the highest grid value below its current threshold at
   which at least one more sample leaves there (lower confidence values change nothing until
   then, so the search jumps over them);
3. take the move that saves the most MACs per unit of accuracy lost (moves that lose nothing
   first, largest saving first), record the new operating point, repeat until accuracy falls
   more than ``max_drop`` below the start or no exit can move.

Every point is evaluated with the runtime's policy (:func:`nestflex.deploy.exits.decide`), so
MACs charge each head a sample runs. The points are fitted on the split given and, with one free
threshold per exit, overfit it: on FlexDNN's 13 exits the accuracy of a point chosen on
validation fell by up to about a point on test (docs/flexdnn.md). Measure them on a held-out split
(:func:`~nestflex.exits.calibration.evaluate_thresholds`) before trusting them; this is why
FlexDNN's shipped operating points stay the shared-threshold sweep.

Example:
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

from nestflex.deploy.exits import ExitError, decide

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
        the operating points in the order found (accuracy falling, MACs falling): each
        ``{"thresholds", "accuracy", "mean_macs", "mean_macs_fraction"}``.

    Raises:
        ExitError: mismatched shapes, no samples, a ``max_drop`` outside [0, 1].
    """
    if conf.ndim != 2 or conf.shape != correct.shape or conf.shape[1] == 0 or len(exit_macs) != conf.shape[0]:
        raise ExitError(f"`conf` and `correct` must both be (K, N) with N >= 1 and `exit_macs` K long; got "
                        f"{tuple(conf.shape)}, {tuple(correct.shape)} and {len(exit_macs)} costs")
    if isinstance(max_drop, bool) or not isinstance(max_drop, (int, float)) or not 0.0 <= max_drop <= 1.0:
        raise ExitError(f"`max_drop` must be an accuracy fraction in [0, 1], got {max_drop!r}")
    values = torch.tensor(sorted({float(g) for g in grid} | {1.0}), dtype=conf.dtype)
    costs = torch.as_tensor(list(exit_macs), dtype=torch.float64)
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
            saved, lost = state["mean_macs"] - trial["mean_macs"], state["accuracy"] - trial["accuracy"]
            # free moves (no accuracy lost) first, by saving; then the best saving per accuracy lost
            key = (1, saved, -lost) if lost <= 0 else (0, saved / lost, 0.0)
            if best_key is None or key > best_key:
                best, best_key, best_at = trial, key, (k, j)
        if best is None or best["accuracy"] < floor - 1e-12:
            break
        at[best_at[0]] = best_at[1]
        state = best
        points.append(state)
    return [{k: v for k, v in p.items() if not k.startswith("_")} for p in points]
