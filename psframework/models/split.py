"""Chains of conv blocks (Conv2d, BatchNorm, ReLU, pooling) with an MLP head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch
from torch import nn

from psframework.models.resnet import mlp


@dataclass(frozen=True)
class ConvSpec:
    """One conv block: Conv2d, optional BatchNorm, ReLU, optional max pooling."""

    out_channels: int
    kernel_size: int = 3
    stride: int = 1
    padding: int = 1
    batch_norm: bool = False
    pool: int = 0

    def output_size(self, size: int) -> int:
        """Return the spatial size after this block for an input of `size`."""
        size = (size + 2 * self.padding - self.kernel_size) // self.stride + 1
        return size // self.pool if self.pool else size


class ConvBlock(nn.Module):
    """Conv2d followed by the layers that are never coded (BatchNorm, ReLU, pooling)."""

    def __init__(self, in_channels: int, spec: ConvSpec):
        super().__init__()
        self.spec = spec
        self.conv = nn.Conv2d(in_channels, spec.out_channels, spec.kernel_size, spec.stride, spec.padding)
        self.bn = nn.BatchNorm2d(spec.out_channels) if spec.batch_norm else None
        self.pool = nn.MaxPool2d(spec.pool) if spec.pool else None

    def post(self, y: torch.Tensor) -> torch.Tensor:
        """Apply what follows the convolution to its output `y`."""
        if self.bn is not None:
            y = self.bn(y)
        y = torch.relu(y)
        if self.pool is not None:
            y = self.pool(y)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.conv(x))


class SplitCNN(nn.Module):
    """A chain of conv blocks followed by an MLP head."""

    def __init__(self, in_channels: int, input_size: int, specs: Sequence[ConvSpec],
                 fc: Sequence[int], num_classes: int, dropout: float = 0.0):
        super().__init__()
        blocks: List[ConvBlock] = []
        channels, size = in_channels, input_size
        for spec in specs:
            blocks.append(ConvBlock(channels, spec))
            channels, size = spec.out_channels, spec.output_size(size)
            if size < 1:
                raise ValueError(f"input size {input_size} is too small for the conv stack "
                                 f"(a feature map shrinks to {size}); raise model.input_size")
        self.conv_blocks = nn.ModuleList(blocks)
        self.head = nn.Sequential(nn.Flatten(), *mlp(channels * size * size, fc, num_classes, dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.conv_blocks:
            x = block(x)
        return self.head(x)
