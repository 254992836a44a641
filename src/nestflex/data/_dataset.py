"""The one in-memory image dataset that CIFAR-10, MNIST and the synthetic set all build on."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.utils.data import Dataset

from nestflex.errors import DataError

__all__ = ["ImageTensorDataset"]


class ImageTensorDataset(Dataset):
    """A ``Dataset`` over uint8 ``(N, C, H, W)`` images and int64 labels held in memory.

    Args:
        images: uint8 tensor ``(N, C, H, W)`` (C = 3 for RGB, 1 for greyscale).
        targets: int64 tensor ``(N,)``.
        classes: class names, index = label.
        transform: callable applied to one uint8 ``(C, H, W)`` image; ``None`` returns float32
            in [0, 1].

    Two datasets may share the same tensors with different transforms (training augmentation
    and plain evaluation over one train split) without copying them.
    """

    synthetic = False

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        classes: Sequence[str],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] < 1:
            raise DataError(
                "`images` must be a uint8 tensor of shape (N, C, H, W), "
                f"got {images.dtype} {tuple(images.shape)}"
            )
        if targets.shape != (images.shape[0],):
            raise DataError(f"`targets` must have shape ({images.shape[0]},), got {tuple(targets.shape)}")
        if transform is not None and not callable(transform):
            raise DataError(f"`transform` must be callable or None, got {transform!r}")
        self.images = images
        self.targets = targets.to(torch.int64)
        self.classes = tuple(classes)
        self.transform = transform

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        image = self.transform(image) if self.transform is not None else image.float().div_(255)
        return image, int(self.targets[index])
