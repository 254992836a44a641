"""A tiny bundle with exits, split points and a split quantisation profile, for the split tests."""

from __future__ import annotations

from pathlib import Path

import torch

from nestflex.capacity import extract_level
from nestflex.profiling import profile_split_quantization
from tests.export.bundles import LEVELS, exits_on, nested_vgg


def write_split_bundle(tmp: Path) -> Path:
    """VGG-11 x0.125, 3 levels, 2 SDN exits, every ReLU a split, profiled at 2/4/8 bits on random data."""
    from nestflex.export import export_bundle

    net = nested_vgg(tmp)
    exits = exits_on(net)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(2)]
    profile = profile_split_quantization(extract_level(net, LEVELS - 1), batches, bitwidths=(2, 4, 8),
                                         size_samples=4)
    export_bundle(tmp / "split.nfx", net, exits=exits, thresholds=[0.5, 0.6], onnx=False, split_profile=profile,
                  mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    return tmp / "split.nfx"
