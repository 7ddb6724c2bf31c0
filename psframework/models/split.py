"""Conv blocks, FC heads and the three model families."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Sequence

import torch
from torch import nn


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
    """A conv stack (workers' part) and an FC head (the server's part)."""

    def __init__(self, name: str, in_channels: int, input_size: int, specs: Sequence[ConvSpec],
                 fc: Sequence[int], num_classes: int, dropout: float = 0.0):
        super().__init__()
        self.name = name
        self.in_channels = in_channels
        self.input_size = input_size
        blocks: List[ConvBlock] = []
        channels, size = in_channels, input_size
        for spec in specs:
            blocks.append(ConvBlock(channels, spec))
            channels, size = spec.out_channels, spec.output_size(size)
            if size < 1:
                raise ValueError(f"model {name}: input size {input_size} is too small for its conv stack "
                                 f"(a feature map shrinks to {size}); raise model.input_size")
        self.conv_blocks = nn.ModuleList(blocks)
        self.feature_shape = (channels, size, size)
        layers: List[nn.Module] = [nn.Flatten()]
        width = channels * size * size
        for hidden in fc:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.head = nn.Sequential(*layers)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Run the conv stack."""
        for block in self.conv_blocks:
            x = block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def conv_parameters(self) -> List[nn.Parameter]:
        """Return the conv stack's parameters (conv weights, biases, BatchNorm affine)."""
        return list(self.conv_blocks.parameters())

    def head_parameters(self) -> List[nn.Parameter]:
        """Return the FC head's parameters."""
        return list(self.head.parameters())


# name -> (input size, conv specs, fc widths, dropout)
_FAMILIES = {
    "lenet5": (28, [ConvSpec(6, 5, 1, 2, pool=2), ConvSpec(16, 5, 1, 0, pool=2)], [120, 84], 0.0),
    "vgg-small": (32, [ConvSpec(32, 3, 1, 1, pool=2), ConvSpec(64, 3, 1, 1, pool=2),
                       ConvSpec(128, 3, 1, 1), ConvSpec(128, 3, 1, 1, pool=2)], [1024, 1024], 0.0),
    "alexnet-small": (32, [ConvSpec(32, 5, 1, 2, pool=2), ConvSpec(64, 5, 1, 2, pool=2),
                           ConvSpec(96, 3, 1, 1), ConvSpec(64, 3, 1, 1), ConvSpec(64, 3, 1, 1, pool=2)],
                      [512, 256], 0.5),
}
_BATCH_NORM_DEFAULT = {"lenet5": False, "vgg-small": False, "alexnet-small": False}


def model_defaults(name: str) -> dict:
    """Return a family's default input size, channels, fc widths, BatchNorm and dropout."""
    if name not in _FAMILIES:
        raise ValueError(f"model.name: unknown model {name!r}, expected one of {', '.join(_FAMILIES)}")
    size, specs, fc, dropout = _FAMILIES[name]
    return {"input_size": size, "channels": [s.out_channels for s in specs], "fc": list(fc),
            "batch_norm": _BATCH_NORM_DEFAULT[name], "dropout": dropout}


def build_model(model_cfg, in_channels: int, num_classes: int) -> SplitCNN:
    """Build the configured model; `model_cfg` fields left null take the family's defaults."""
    defaults = model_defaults(model_cfg.name)
    _, specs, _, _ = _FAMILIES[model_cfg.name]
    channels = model_cfg.channels if model_cfg.channels is not None else defaults["channels"]
    if len(channels) != len(specs):
        raise ValueError(f"model.channels: got {len(channels)} values {channels}, model {model_cfg.name} "
                         f"has {len(specs)} conv layers")
    batch_norm = defaults["batch_norm"] if model_cfg.batch_norm is None else model_cfg.batch_norm
    specs = [replace(s, out_channels=c, batch_norm=batch_norm) for s, c in zip(specs, channels)]
    fc = model_cfg.fc if model_cfg.fc is not None else defaults["fc"]
    dropout = defaults["dropout"] if model_cfg.dropout is None else model_cfg.dropout
    input_size = input_size_of(model_cfg)
    return SplitCNN(model_cfg.name, in_channels, input_size, specs, fc, num_classes, dropout)


def input_size_of(model_cfg) -> int:
    """Return the configured input size or the family's default."""
    return model_cfg.input_size if model_cfg.input_size is not None else model_defaults(model_cfg.name)["input_size"]


def model_summary(model: SplitCNN, batch_size: int = 1) -> List[dict]:
    """Return one row per layer: part, layer, output shape, parameters, activation floats."""
    rows: List[dict] = []
    x = torch.zeros(batch_size, model.in_channels, model.input_size, model.input_size)
    with torch.no_grad():
        for i, block in enumerate(model.conv_blocks):
            x = block(x)
            rows.append({"part": "conv (workers)", "layer": f"conv{i + 1} {block.spec.kernel_size}x"
                         f"{block.spec.kernel_size}" + (" +bn" if block.bn is not None else "")
                         + (f" +pool{block.spec.pool}" if block.spec.pool else ""),
                         "output": tuple(x.shape[1:]),
                         "params": sum(p.numel() for p in block.parameters()),
                         "activations": int(x[0].numel())})
        for j, layer in enumerate(model.head):
            x = layer(x)
            if isinstance(layer, nn.Linear):
                rows.append({"part": "head (server)", "layer": f"fc{j} {layer.in_features}->{layer.out_features}",
                             "output": tuple(x.shape[1:]),
                             "params": sum(p.numel() for p in layer.parameters()),
                             "activations": int(x[0].numel())})
    return rows
