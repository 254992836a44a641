"""The overthinking-aware loss of Shallow-Deep Networks (Kaya et al. 2019), used by SPINN.

``L = sum_i tau_i * L_i`` over the exits, ``L_i`` the cross-entropy of exit ``i``. The weight of
early exit ``i`` grows linearly during training from ``start`` (0.01) to ``C_i``, the exit's
relative position in the backbone (its MACs fraction: 0.15, 0.30, ...); the final exit's weight
is 1 throughout. Deep exits end up weighted more than shallow ones, so the shallow heads do not
pull the shared features away from what the deep ones need, while the early, small weights let
the backbone learn general features first.

The schedule is a pure function of the optimizer step (SDN raises the weights per epoch; a per
step ramp is the same line sampled finer), so a resumed run recomputes it from
``trainer.global_step`` and needs no saved state.

Examples:
    >>> tau_schedule(step=50, total_steps=100, positions=[0.15, 0.5])
    [0.08, 0.255, 1.0]
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from nestflex.deploy.exits import ExitError

__all__ = ["tau_schedule", "multi_exit_loss", "WEIGHTINGS", "loss_weights"]

#: Loss weightings: ``overthinking`` (SDN's tau schedule) and ``equal`` (every exit 1, the usual
#: multi-exit baseline). Final-only training is not a weighting: it is the backbone trained alone,
#: or heads on detached features (``MultiExitNetwork.forward(x, detach=True)``).
WEIGHTINGS: tuple[str, ...] = ("overthinking", "equal")


def tau_schedule(step: int, total_steps: int, positions: Sequence[float], start: float = 0.01) -> list[float]:
    """Loss weights at ``step``: ``start + (C_i - start) * min(1, step / total_steps)`` per early
    exit, then 1 for the final exit.

    Args:
        step: optimizer steps done (``trainer.global_step``).
        total_steps: steps of the whole run (``trainer.estimated_stepping_batches``).
        positions: ``C_i``, the relative position in (0, 1] of each early exit.
        start: the weight every early exit starts from.

    Returns:
        one weight per early exit, then 1.0 for the final exit.

    Raises:
        ExitError: negative ``step``, ``total_steps`` < 1, ``start`` or a position outside (0, 1].

    Examples:
        >>> tau_schedule(50, 100, [0.2, 0.6])
        [0.105, 0.305, 1.0]
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ExitError(f"`step` must be an int >= 0, got {step!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ExitError(f"`total_steps` must be an int >= 1, got {total_steps!r}")
    if not 0.0 < start <= 1.0:
        raise ExitError(f"`start` must be in (0, 1], got {start!r}. HINT: SDN starts every exit at 0.01")
    for i, c in enumerate(positions):
        if not 0.0 < c <= 1.0:
            raise ExitError(f"`positions[{i}]` must be in (0, 1], got {c!r}")
    progress = min(1.0, step / total_steps)
    return [round(start + (c - start) * progress, 12) for c in positions] + [1.0]


def loss_weights(
    weighting: str, step: int, total_steps: int, positions: Sequence[float], start: float = 0.01
) -> list[float]:
    """Per-exit loss weights of a named weighting (see :data:`WEIGHTINGS`) at ``step``.

    Args:
        weighting: ``overthinking`` (SDN's :func:`tau_schedule`) or ``equal`` (all 1).
        step: optimizer steps done (``trainer.global_step``).
        total_steps: steps of the whole run.
        positions: ``C_i``, the relative position in (0, 1] of each early exit.
        start: the weight every early exit starts from (``overthinking``).

    Returns:
        one weight per exit, final last.

    Raises:
        ExitError: unknown ``weighting``, or arguments :func:`tau_schedule` refuses.

    Examples:
        >>> loss_weights("equal", 0, 10, [0.3, 0.6])
        [1.0, 1.0, 1.0]
    """
    if weighting == "overthinking":
        return tau_schedule(step, total_steps, positions, start)
    if weighting == "equal":
        return [1.0] * (len(positions) + 1)
    raise ExitError(f"unknown loss weighting `{weighting}`; choose from: {', '.join(WEIGHTINGS)}")


def multi_exit_loss(
    logits: Sequence[torch.Tensor], target: torch.Tensor, weights: Sequence[float]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``sum_i weights[i] * cross_entropy(logits[i], target)``.

    Args:
        logits: each exit's ``(N, C)`` logits, final last (``MultiExitNetwork(x)``).
        target: ``(N,)`` class indices.
        weights: one loss weight per exit (:func:`loss_weights`).

    Returns:
        ``(total, per_exit)``: the weighted sum and each exit's unweighted loss (detached).

    Raises:
        ExitError: ``weights`` and ``logits`` differ in length.

    Examples:
        >>> logits = [torch.zeros(4, 10), torch.zeros(4, 10)]
        >>> total, per_exit = multi_exit_loss(logits, torch.zeros(4, dtype=torch.long), [0.5, 1.0])
        >>> round(float(total), 4), [round(float(v), 4) for v in per_exit]
        (3.4539, [2.3026, 2.3026])
    """
    if len(weights) != len(logits):
        raise ExitError(f"`weights` needs one value per exit ({len(logits)}), got {len(weights)}")
    losses = [F.cross_entropy(z, target) for z in logits]
    total = sum(w * loss for w, loss in zip(weights, losses))
    return total, [loss.detach() for loss in losses]
