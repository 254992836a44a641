"""Freezing for freeze-&-grow: while level ``k`` trains, nothing a smaller level uses may change.

"Frozen" here means *bit-identical*, whatever the optimizer does. Zeroing gradients is not
enough: SGD's weight decay and momentum, and Adam's moments, move a parameter whose gradient is
zero. So :class:`LevelFreezer` works on values, not gradients:

* at the start of level ``k`` it takes a snapshot of every parameter tensor and a boolean mask
  of the entries level ``k`` may train: those level ``k`` computes with and no smaller level
  does (:func:`trainable_masks`);
* after every optimizer step, :meth:`LevelFreezer.restore` writes the snapshot back into every
  entry outside the mask (``torch.where(mask, p, snapshot)``: an exact copy, no arithmetic).

Entries of *larger* levels are restored too, so weight decay does not shrink filters before
their own level trains them. BatchNorm needs no restore: each level has its own BatchNorm
(:class:`~nestflex.capacity.nested.NestedNorm`) and only the active level's runs, so no other
level's running statistics are ever updated; their affine parameters get no gradient and are
covered by the restore like every other parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from nestflex.capacity.nested import level_regions, num_levels

__all__ = ["trainable_masks", "LevelFreezer"]


def _mask(shape: torch.Size, region, device) -> torch.Tensor:
    m = torch.zeros(shape, dtype=torch.bool, device=device)
    if region is not None:
        m[region] = True
    return m


def trainable_masks(model: nn.Module, level: int) -> dict[str, torch.Tensor]:
    """Per parameter name, ``True`` where level ``level`` may train (used by it, by no smaller level).

    Args:
        model: a nested (multi-capacity) model.
        level: the level being trained (``0 <= level < num_levels``; level 0 is the seed).

    Returns:
        A boolean mask of each parameter's shape, keyed by parameter name.
    """
    regions = level_regions(model)
    masks = {}
    for name, p in model.named_parameters():
        own = _mask(p.shape, regions[name][level], p.device)
        for k in range(level):
            own &= ~_mask(p.shape, regions[name][k], p.device)
        masks[name] = own
    return masks


class LevelFreezer:
    """Snapshot + restore that keeps everything but level ``level``'s new entries bit-identical.

    Args:
        model: a nested (multi-capacity) model.
        level: the level being trained (``1 <= level < num_levels``; level 0 is the seed).

    Example::

        freezer = LevelFreezer(model, level=2)
        opt.register_step_post_hook(lambda *_: freezer.restore())
    """

    def __init__(self, model: nn.Module, level: int) -> None:
        assert 0 <= level < num_levels(model), level
        self.model, self.level = model, level
        self.masks = trainable_masks(model, level)
        params = dict(model.named_parameters())
        # only tensors with at least one frozen entry need restoring
        self.frozen = {n: (params[n], m, params[n].detach().clone()) for n, m in self.masks.items() if not bool(m.all())}

    @property
    def trainable(self) -> int:
        """Number of trainable entries at this level."""
        return int(sum(int(m.sum()) for m in self.masks.values()))

    @torch.no_grad()
    def restore(self) -> None:
        """Write the snapshot back into every entry this level may not train."""
        for p, mask, snap in self.frozen.values():
            p.copy_(torch.where(mask, p, snap))

    @torch.no_grad()
    def mask_gradients(self) -> None:
        """Zero the gradients of entries this level may not train (keeps momentum clean)."""
        for name, p in self.model.named_parameters():
            if p.grad is not None and name in self.frozen:
                p.grad.mul_(self.masks[name])

    def changed(self) -> list[str]:
        """Names of parameters whose frozen entries differ from the snapshot (should be empty)."""
        return [n for n, (p, m, snap) in self.frozen.items() if not torch.equal(p.detach()[~m], snap[~m])]
