"""CIFAR ResNet-20/56 with basic blocks (He et al. 2016, Sec. 4.2): 3 stages of 16/32/64
channels, ``n`` blocks each (depth = 6n + 2). ResNet-56 costs 1.25e8 MACs on 32x32.

Shortcuts that change shape use a 1x1 conv + BN (He et al.'s option B) rather than zero-padding
(option A): it costs 0.2% more MACs and keeps every residual add a clean coupling of two equal
channel sets, which pruning and nesting need.
Each ReLU is its own module (``relu1``/``relu2``) so split points and exits have unique names.
"""

from __future__ import annotations

import torch
from torch import nn

from nestflex.models._registry import register_model, scaled

__all__ = ["BasicBlock", "CifarResNet"]


class BasicBlock(nn.Module):
    """The two-conv residual block of CIFAR ResNets (He et al. 2016).

    Two 3x3 convolutions with BatchNorm and ReLU; the shortcut is the identity, or a 1x1
    convolution + BatchNorm where the stride or channel count changes.

    Args:
        in_ch: input channels.
        out_ch: output channels (of both convolutions).
        stride: stride of the first convolution (2 halves the resolution).
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))
        self.relu2 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet for 32x32 inputs.

    Args:
        depth: 6n + 2 (20, 32, 44, 56, 110).
        num_classes: classifier outputs.
        width: channel multiplier for all three stages.
        in_chans: image channels (3 for RGB, 1 for greyscale).

    Attributes:
        input_shape: ``(in_chans, 32, 32)``, the per-sample input it is traced at by default
            (global average pooling makes any size work).
    """

    def __init__(self, depth: int, num_classes: int = 10, width: float = 1.0, in_chans: int = 3) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise ValueError(f"`depth` must be 6n + 2 with n >= 1, got {depth}")
        n = (depth - 2) // 6
        widths = [scaled(c, width) for c in (16, 32, 64)]
        self.conv1 = nn.Conv2d(in_chans, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        in_ch = widths[0]
        for stage, out_ch in enumerate(widths, start=1):
            blocks = []
            for b in range(n):
                stride = 2 if (stage > 1 and b == 0) else 1
                blocks.append(BasicBlock(in_ch, out_ch, stride))
                in_ch = out_ch
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        self.num_classes = num_classes
        self.input_shape: tuple[int, ...] = (in_chans, 32, 32)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        return self.layer3(self.layer2(self.layer1(x)))

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@register_model("resnet20")
def resnet20(num_classes: int = 10, width: float = 1.0, in_chans: int = 3) -> CifarResNet:
    """CIFAR ResNet-20 (3 basic blocks per stage)."""
    return CifarResNet(20, num_classes=num_classes, width=width, in_chans=in_chans)


@register_model("resnet56")
def resnet56(num_classes: int = 10, width: float = 1.0, in_chans: int = 3) -> CifarResNet:
    """CIFAR ResNet-56 (9 basic blocks per stage)."""
    return CifarResNet(56, num_classes=num_classes, width=width, in_chans=in_chans)
