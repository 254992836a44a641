"""Shared pieces of the early-exit benchmarks: synthetic data splits, a plain training loop over
nestflex's multi-exit loss, and the machine record.

The loop is deliberately plain torch (SGD + Nesterov, one-cycle LR, weight decay 5e-4, pad-4
crop + flip; the recipe's recipe), so that the three loss weightings of the ablation differ in
nothing else.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from nestflex._machine import machine as _machine
from nestflex.data import SYNTHETIC_MEAN, SYNTHETIC_STD, eval_transform, make_synthetic, train_transform
from nestflex.exits import MultiExitNetwork, loss_weights, multi_exit_loss
from nestflex.models import create_model


def synthetic_splits(
    train: int, val: int, test: int, seed: int = 0
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Train and validation from the synthetic train split (disjoint), test from the test split."""
    x, y, _ = make_synthetic(train + val, seed, "train")
    perm = torch.randperm(train + val, generator=torch.Generator().manual_seed(seed))
    tx, ty, _ = make_synthetic(test, seed, "test")
    return {
        "train": (x[perm[:train]], y[perm[:train]]),
        "val": (x[perm[train:]], y[perm[train:]]),
        "test": (tx, ty),
    }


def batches(images: torch.Tensor, targets: torch.Tensor, size: int = 500):
    """Normalised, unaugmented evaluation batches."""
    norm = eval_transform(SYNTHETIC_MEAN, SYNTHETIC_STD)
    for i in range(0, len(images), size):
        yield norm(images[i : i + size]), targets[i : i + size]


def build(model: str, width: float, positions, head: str, seed: int) -> MultiExitNetwork:
    torch.manual_seed(seed)
    return MultiExitNetwork(create_model(model, width=width), positions=positions, head=head)


def train(
    net: MultiExitNetwork,
    images: torch.Tensor,
    targets: torch.Tensor,
    epochs: int,
    mode: str,
    log: Callable[[str], None],
    lr: float = 0.05,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[str, float]:
    """Train ``net`` with one of the modes:

    * ``backbone``: the backbone alone, cross-entropy on its output (heads untouched);
    * ``overthinking`` / ``equal``: joint, ``sum_i w_i L_i`` with SDN's tau schedule or all 1;
    * ``final_only``: the backbone learns from the final loss only, the heads learn on detached
      features (weight 1 each): same compute, no exit gradient reaches the backbone;
    * ``exits_only``: frozen backbone (eval mode), heads only.

    Returns ``{"seconds", "epoch_seconds_median"}``.
    """
    params = list(net.exits.parameters()) if mode == "exits_only" else list(net.parameters())
    if mode == "backbone":
        params = list(net.backbone.parameters())
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    opt = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        momentum=0.9,
        nesterov=True,
    )
    steps_per_epoch = len(images) // batch_size
    total = epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt,
        max_lr=lr,
        total_steps=total,
        pct_start=min(0.3, 1 / epochs),
        anneal_strategy="cos",
        div_factor=10.0,
        final_div_factor=100.0,
        cycle_momentum=False,
    )
    g = torch.Generator().manual_seed(seed)
    augment = train_transform(SYNTHETIC_MEAN, SYNTHETIC_STD, generator=g)
    step, epoch_seconds = 0, []
    start = time.perf_counter()
    for epoch in range(epochs):
        net.train()
        if mode == "exits_only":
            net.backbone.eval()
            net.backbone.requires_grad_(False)
        t0 = time.perf_counter()
        order = torch.randperm(len(images), generator=g)
        running = 0.0
        for b in range(steps_per_epoch):
            idx = order[b * batch_size : (b + 1) * batch_size]
            x, y = augment(images[idx]), targets[idx]
            if mode == "backbone":
                loss = torch.nn.functional.cross_entropy(net.backbone(x), y)
            else:
                weighting = "overthinking" if mode == "overthinking" else "equal"
                weights = loss_weights(weighting, step, total, net.positions)
                logits = net(x, detach=mode in ("final_only", "exits_only"))
                loss, _ = multi_exit_loss(logits, y, weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running += float(loss.detach())
        epoch_seconds.append(time.perf_counter() - t0)
        log(
            f"{mode}: epoch {epoch + 1}/{epochs} loss {running / steps_per_epoch:.4f} ({epoch_seconds[-1]:.1f} s)"
        )
    net.eval()
    return {
        "seconds": time.perf_counter() - start,
        "epoch_seconds_median": sorted(epoch_seconds)[len(epoch_seconds) // 2],
    }


def machine() -> dict[str, object]:
    """The project's machine record (:func:`nestflex._machine.machine`) with a note on timing noise."""
    return _machine(note="shared 2-core machine, other jobs running concurrently: wall times are noisy")
