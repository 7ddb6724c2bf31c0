"""Coded convolution layers: the DESIGN section 5 identities, shared by every coded scheme.

A conv layer's weight is coded twice: along its out-channels (row-coded: forward and its update) and,
except for the first layer, along its in-channels (column-coded: input gradient and its update).
Worker j holds packet j of each; the server decodes any k replies back to the uncoded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

from psframework.codes import Code, split_blocks
from psframework.models import ConvSpec


@dataclass(frozen=True)
class LayerCoding:
    """How one conv layer is cut and coded: channel counts, padding and symbol size."""

    index: int
    in_channels: int
    out_channels: int
    spec: ConvSpec
    k: int
    symbol_size: int

    @property
    def has_column_copy(self) -> bool:
        """Return whether the layer needs an input gradient (every layer but the first)."""
        return self.index > 0

    def packet_channels(self, code: Code, channels: int) -> int:
        """Return the channels of one packet coding `channels` channels (padding and shifts included)."""
        unit = self.k * self.symbol_size
        block = -(-channels // unit) * self.symbol_size
        return code.packet_length(block, self.symbol_size)

    def row_shape(self, code: Code) -> tuple:
        """Return the shape of a row-coded weight packet."""
        ks = self.spec.kernel_size
        return (self.packet_channels(code, self.out_channels), self.in_channels, ks, ks)

    def col_shape(self, code: Code) -> tuple:
        """Return the shape of a column-coded weight packet."""
        ks = self.spec.kernel_size
        return (self.out_channels, self.packet_channels(code, self.in_channels), ks, ks)

    def blocks(self, x: torch.Tensor, axis: int) -> List[torch.Tensor]:
        """Cut `x` along `axis` into k zero-padded blocks of whole symbols."""
        return split_blocks(x, self.k, axis=axis, symbol_size=self.symbol_size)

    def encode(self, code: Code, x: torch.Tensor, axis: int) -> List[torch.Tensor]:
        """Return the n packets of `x` cut along `axis`."""
        return code.encode(self.blocks(x, axis), axis=axis, symbol_size=self.symbol_size)

    def encode_one(self, code: Code, x: torch.Tensor, axis: int, j: int) -> torch.Tensor:
        """Return packet j of `x` cut along `axis`."""
        return code.encode(self.blocks(x, axis), axis=axis, symbol_size=self.symbol_size)[j]

    def decode(self, code: Code, packets: Dict[int, torch.Tensor], axis: int, length: int) -> torch.Tensor:
        """Decode packets cut along `axis` back to the tensor of `length` elements along it."""
        return code.decode_joined(packets, axis=axis, symbol_size=self.symbol_size, length=length)


def layer_codings(model, k: int, symbol_size: int) -> List[LayerCoding]:
    """Return the coding of every conv layer of a SplitCNN."""
    return [LayerCoding(i, b.conv.in_channels, b.conv.out_channels, b.spec, k, symbol_size)
            for i, b in enumerate(model.conv_blocks)]


@dataclass
class CodedWeights:
    """Worker j's coded copies of one conv layer."""

    row_weight: torch.Tensor
    row_bias: torch.Tensor
    col_weight: Optional[torch.Tensor]

    def tensors(self) -> List[torch.Tensor]:
        """Return the coded tensors in a fixed order (row weight, row bias, column weight)."""
        return [t for t in (self.row_weight, self.row_bias, self.col_weight) if t is not None]


def encode_layer(coding: LayerCoding, code: Code, weight: torch.Tensor, bias: torch.Tensor,
                 j: Optional[int] = None) -> List[CodedWeights]:
    """Encode a conv layer's weight and bias for every worker (or only worker j)."""
    indices = range(code.n) if j is None else [j]
    out = []
    for idx in indices:
        rw = coding.encode_one(code, weight, 0, idx)
        rb = coding.encode_one(code, bias, 0, idx)
        cw = coding.encode_one(code, weight, 1, idx) if coding.has_column_copy else None
        out.append(CodedWeights(rw.contiguous(), rb.contiguous(), None if cw is None else cw.contiguous()))
    return out


def coded_forward(coding: LayerCoding, x: torch.Tensor, w: CodedWeights) -> torch.Tensor:
    """Return conv(X, Wr_j) + br_j: packet j of the layer's output, coded along channels."""
    s = coding.spec
    return F.conv2d(x, w.row_weight, w.row_bias, s.stride, s.padding)


def coded_input_grad(coding: LayerCoding, dy: torch.Tensor, w: CodedWeights, input_shape) -> torch.Tensor:
    """Return conv2d_input(dY, Wc_j): packet j of the input gradient, coded along channels."""
    s = coding.spec
    shape = list(input_shape)
    shape[1] = w.col_weight.shape[1]
    return conv2d_input(shape, w.col_weight, dy, s.stride, s.padding)


def coded_weight_grads(coding: LayerCoding, code: Code, j: int, x: torch.Tensor, dy: torch.Tensor,
                       w: CodedWeights, coded: bool = False) -> List[torch.Tensor]:
    """Return the gradients of worker j's coded tensors from the uncoded X and dY.

    Row copy: conv2d_weight(X, SA_j(dY)) = SA_j(dW row blocks); its bias gets the sum of SA_j(dY).
    Column copy: conv2d_weight(SA_j(X), dY) = SA_j(dW column blocks). With `coded`, `dy` is already
    SA_j(dY) (enough for a layer without a column copy).
    """
    s = coding.spec
    dy_j = dy if coded else coding.encode_one(code, dy, 1, j)
    grads = [conv2d_weight(x, w.row_weight.shape, dy_j, s.stride, s.padding), dy_j.sum(dim=(0, 2, 3))]
    if w.col_weight is not None:
        x_j = coding.encode_one(code, x, 1, j)
        grads.append(conv2d_weight(x_j, w.col_weight.shape, dy, s.stride, s.padding))
    return grads


def uncoded_weight_grads(coding: LayerCoding, x: torch.Tensor, dy: torch.Tensor,
                         weight_shape) -> List[torch.Tensor]:
    """Return the gradients of the uncoded weight and bias (the naive scheme's server does this)."""
    s = coding.spec
    return [conv2d_weight(x, weight_shape, dy, s.stride, s.padding), dy.sum(dim=(0, 2, 3))]
