"""A user's own model and data for the exit tests: a small single-channel CNN at 16x16 on a
learnable ten-class task, the shape of handwritten digits rather than CIFAR (issue 39)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SHAPE = (1, 16, 16)
CLASSES = 10


class DigitsCNN(nn.Module):
    """Five conv + ReLU layers (five places for exits), global pooling, a linear classifier; no
    ``input_shape`` attribute, as users write them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(12, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(24, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.body(x)), 1))


class DigitsModule(pl.LightningModule):
    """The user's LightningModule: the network under ``model``, plain cross-entropy training."""

    def __init__(self) -> None:
        super().__init__()
        self.model = DigitsCNN()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy 1x16x16 images whose class is which of ten 4x4 cells is bright."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = 0.5 * torch.rand(n, *SHAPE, generator=g)
    for i, c in enumerate(y.tolist()):
        r, col = divmod(c, 4)
        x[i, 0, 4 * r:4 * r + 4, 4 * col:4 * col + 4] += 1.0
    return x, y


def loaders(n_train: int = 160, n_val: int = 96, batch_size: int = 32) -> tuple[DataLoader, DataLoader]:
    """Training (shuffled, seeded) and validation loaders of :func:`digits`."""
    train = DataLoader(TensorDataset(*digits(n_train, 0)), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(*digits(n_val, 1)), batch_size=batch_size)
    return train, val


def trainer(root, callbacks=(), **kwargs) -> pl.Trainer:
    """A quiet CPU Trainer writing under ``root``."""
    kwargs.setdefault("max_epochs", 1)
    return pl.Trainer(callbacks=list(callbacks), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", default_root_dir=root, **kwargs)
