"""CIFAR-style residual networks (He et al. 2016): a 3x3 stem, stages of basic blocks, global pooling."""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn


def norm(channels: int, batch_norm: bool) -> nn.Module:
    """Return BatchNorm over `channels`, or an identity for a BatchNorm-free network."""
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut: identity, or a strided 1x1 convolution when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, batch_norm: bool):
        super().__init__()
        bias = not batch_norm  # BatchNorm's shift makes a conv bias redundant
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=bias)
        self.bn1 = norm(out_channels, batch_norm)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=bias)
        self.bn2 = norm(out_channels, batch_norm)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, 0, bias=bias),
                                          norm(out_channels, batch_norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet for small images: stem, one stage per width (the first keeps the size, the others halve it)."""

    def __init__(self, in_channels: int, num_classes: int, widths: Sequence[int], blocks: Sequence[int],
                 batch_norm: bool = True, head: Sequence[int] = (), dropout: float = 0.0):
        super().__init__()
        if len(widths) != len(blocks):
            raise ValueError(f"model.channels: got {len(widths)} widths {list(widths)}, "
                             f"this ResNet has {len(blocks)} stages")
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=not batch_norm)
        self.bn1 = norm(widths[0], batch_norm)
        stages: List[nn.Module] = []
        channels = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            layers = []
            for b in range(count):
                stride = 2 if i > 0 and b == 0 else 1
                layers.append(BasicBlock(channels, width, stride, batch_norm))
                channels = width
            stages.append(nn.Sequential(*layers))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = mlp(channels, head, num_classes, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        return self.fc(self.flatten(self.pool(self.layers(x))))


def mlp(width: int, hidden: Sequence[int], num_classes: int, dropout: float) -> nn.Sequential:
    """Return Linear-ReLU(-Dropout) layers of the `hidden` widths, then the classifier."""
    layers: List[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
