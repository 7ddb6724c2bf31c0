"""A stand-in for a torchvision model: torchvision's exact factory signature, a small BatchNorm-free network.

`resnet18(*, weights=None, progress=True, **kwargs)` passes **kwargs on to the network's constructor, as
torchvision's factories do: num_classes (1000 by default) is taken, anything else (in_channels) is a TypeError.
The network, like torchvision's ResNet, takes 3-channel images.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn


class TinyResNet(nn.Module):
    """A stem, one residual block of two convolutions, a strided convolution, global pooling and a classifier."""

    def __init__(self, num_classes: int = 1000, width: int = 6) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.block1 = nn.Conv2d(width, width, 3, padding=1)
        self.block2 = nn.Conv2d(width, width, 3, padding=1)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(x + self.block2(torch.relu(self.block1(x))))
        x = self.avgpool(torch.relu(self.down(x)))
        return self.fc(torch.flatten(x, 1))


def resnet18(*, weights: Optional[Any] = None, progress: bool = True, **kwargs: Any) -> TinyResNet:
    """Return the network; like torchvision's resnet18 but without weights to download."""
    if weights is not None:
        raise ValueError(f"weights: got {weights!r}, this stand-in has no pretrained weights")
    return TinyResNet(**kwargs)
