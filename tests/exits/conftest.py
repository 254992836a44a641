import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nestflex.exits import MultiExitNetwork
from nestflex.models import create_model
from tests.conftest import settle_batchnorm


@pytest.fixture
def small_net() -> MultiExitNetwork:
    """A ResNet-20 (width 0.5) with four exits and realistic BatchNorm statistics, in eval mode."""
    return MultiExitNetwork(
        settle_batchnorm(create_model("resnet20", width=0.5)), positions=(0.2, 0.4, 0.6, 0.8)
    ).eval()


def tiny_loader(n: int = 32, batch_size: int = 8, classes: int = 10, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, classes, (n,), generator=g))
    return DataLoader(data, batch_size=batch_size)
