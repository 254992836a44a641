"""ImageTensorDataset: the in-memory dataset CIFAR-10 and the synthetic set share."""

from __future__ import annotations

import pytest
import torch

from nestflex.data import ImageTensorDataset
from nestflex.errors import DataError


def test_items_and_shared_storage():
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    ds = ImageTensorDataset(images, torch.tensor([1, 0]), classes=("a", "b"))
    x, y = ds[0]
    assert torch.allclose(x, images[0].float() / 255) and y == 1 and len(ds) == 2
    assert ds.images is images  # no copy


def _u8(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("images", "targets", "match"),
    [
        (torch.zeros(2, 3, 4, 4), torch.zeros(2), r"`images` must be a uint8 tensor .*got torch\.float32"),
        (_u8(2, 0, 4, 4), torch.zeros(2), r"shape \(N, C, H, W\), .*\(2, 0, 4, 4\)"),
        (_u8(2, 4, 4), torch.zeros(2), r"shape \(N, C, H, W\), .*\(2, 4, 4\)"),
        (_u8(2, 3, 4, 4), torch.zeros(3), r"`targets` must have shape \(2,\), got \(3,\)"),
    ],
)
def test_errors(images, targets, match):
    with pytest.raises(DataError, match=match):
        ImageTensorDataset(images, targets, classes=("a", "b"))


def test_greyscale_images():
    ds = ImageTensorDataset(_u8(3, 1, 28, 28), torch.zeros(3), classes=("a", "b"))
    image, label = ds[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and label == 0
