"""A user-defined residual network, trained by psframework from a config without changing the package.

    model:
      name: examples/small_resnet.py:small_resnet   # or a module on PYTHONPATH: mypackage.models:small_resnet
      args: {width: 16, blocks: 2}

The factory receives `in_channels` and `num_classes` from the dataset because it asks for them;
everything else comes from `model.args`. Any torch.nn.Module works: every Conv2d becomes a coded
layer in the coded schemes, the rest (here: the residual additions, pooling and the classifier)
runs on rank 0 in the module's own order, and `stanza` cuts it before its first Linear layer.
"""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """Two 3x3 convolutions with an identity shortcut."""

    def __init__(self, width: int, batch_norm: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width) if batch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.norm(self.conv2(torch.relu(self.conv1(x)))))


class SmallResNet(nn.Module):
    """A stem, `blocks` residual blocks, a strided downsampling convolution, global pooling, a classifier."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 16, blocks: int = 2,
                 batch_norm: bool = True):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, padding=1)
        self.blocks = nn.Sequential(*[Residual(width, batch_norm) for _ in range(blocks)])
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(torch.relu(self.stem(x)))
        x = self.pool(torch.relu(self.down(x)))
        return self.classifier(torch.flatten(x, 1))


def small_resnet(in_channels: int, num_classes: int, width: int = 16, blocks: int = 2,
                 batch_norm: bool = True) -> nn.Module:
    """Return the network for images with `in_channels` channels and `num_classes` classes."""
    return SmallResNet(in_channels, num_classes, width, blocks, batch_norm)
