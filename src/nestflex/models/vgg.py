"""CIFAR VGG-11/13/16 with BatchNorm, in the layout of Li et al. 2016 ("Pruning Filters for
Efficient ConvNets"): 3x3 convs, BN, ReLU, 2x2 max-pooling, then Linear(512, 512) + BN + ReLU +
Linear(512, classes). VGG-16 costs 3.13e8 MACs on a 32x32 input.

Layers are named ``features.conv1`` ... ``features.conv13`` so reports match the papers' "conv13".
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from nestflex.models._registry import register_model, scaled

__all__ = ["VGG", "VGG_CONFIGS"]

VGG_CONFIGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """VGG for 32x32 inputs.

    Five 2x2 max-poolings leave one pixel per channel of a 32x32 input, which is what the
    classifier's first linear layer takes; inputs of 32..63 pixels work the same way, 28x28
    (MNIST) does not (28 -> 14 -> 7 -> 3 -> 1 -> nothing): pad it to 32x32.

    Args:
        config: list of channel counts and ``"M"`` (max-pool), e.g. ``VGG_CONFIGS["vgg16"]``.
        num_classes: classifier outputs.
        width: channel multiplier applied to every conv and the hidden linear layer.
        in_chans: image channels (3 for RGB, 1 for greyscale).

    Attributes:
        input_shape: ``(in_chans, 32, 32)``, the per-sample input it is traced at by default.
    """

    def __init__(self, config: list[int | str], num_classes: int = 10, width: float = 1.0, in_chans: int = 3) -> None:
        super().__init__()
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        in_ch, conv_i, pool_i = in_chans, 0, 0
        for item in config:
            if item == "M":
                pool_i += 1
                layers[f"pool{pool_i}"] = nn.MaxPool2d(2, 2)
                continue
            conv_i += 1
            out_ch = scaled(int(item), width)
            layers[f"conv{conv_i}"] = nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False)
            layers[f"bn{conv_i}"] = nn.BatchNorm2d(out_ch)
            layers[f"relu{conv_i}"] = nn.ReLU(inplace=True)
            in_ch = out_ch
        self.features = nn.Sequential(layers)
        hidden = scaled(512, width)
        self.classifier = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(in_ch, hidden),
                bn=nn.BatchNorm1d(hidden),
                relu=nn.ReLU(inplace=True),
                fc2=nn.Linear(hidden, num_classes),
            )
        )
        self.num_classes = num_classes
        self.input_shape: tuple[int, ...] = (in_chans, 32, 32)
        _init_weights(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(x, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _init_weights(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


def _make(name: str):
    @register_model(name)
    def build(num_classes: int = 10, width: float = 1.0, in_chans: int = 3) -> VGG:
        return VGG(VGG_CONFIGS[name], num_classes=num_classes, width=width, in_chans=in_chans)

    build.__doc__ = f"CIFAR {name.upper()} with BatchNorm (Li et al. layout)."
    return build


vgg11 = _make("vgg11")
vgg13 = _make("vgg13")
vgg16 = _make("vgg16")
