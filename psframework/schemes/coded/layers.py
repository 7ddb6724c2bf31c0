"""Coded convolution layers: the identities of docs/design.md#coded-convolutions, shared by every coded scheme.

A conv layer's weight is coded twice: along its out-channels (row-coded: forward and its update) and,
where rank 0 needs the layer's input gradient, along its in-channels (column-coded: input gradient
and its update); a layer that takes the images needs no column copy.
Worker j holds packet j of each; the server decodes any k replies back to the uncoded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

from psframework.codes import Code, make_code, split_blocks
from psframework.models import ConvGeometry, Placement
from psframework.settings import CodeSettings


def code_of(settings: CodeSettings) -> Code:
    """Return the erasure code the settings describe."""
    return make_code(settings.kind, settings.n, settings.k, systematic=settings.systematic, nodes=settings.nodes)


@dataclass(frozen=True)
class LayerCoding:
    """How one conv layer is cut and coded: its geometry, k, symbol size and whether it has a column copy."""

    index: int
    geometry: ConvGeometry
    k: int
    symbol_size: int
    has_column_copy: bool  # rank 0 needs the layer's input gradient (its input depends on parameters)

    @property
    def in_channels(self) -> int:
        return self.geometry.in_channels

    @property
    def out_channels(self) -> int:
        return self.geometry.out_channels

    @property
    def has_bias(self) -> bool:
        return self.geometry.bias

    def packet_channels(self, code: Code, channels: int) -> int:
        """Return the channels of one packet coding `channels` channels (padding and shifts included)."""
        unit = self.k * self.symbol_size
        block = -(-channels // unit) * self.symbol_size
        return code.packet_length(block, self.symbol_size)

    def row_shape(self, code: Code) -> tuple:
        """Return the shape of a row-coded weight packet."""
        return (self.packet_channels(code, self.out_channels), self.in_channels, *self.geometry.kernel)

    def col_shape(self, code: Code) -> tuple:
        """Return the shape of a column-coded weight packet."""
        return (self.out_channels, self.packet_channels(code, self.in_channels), *self.geometry.kernel)

    def blocks(self, x: torch.Tensor, axis: int) -> List[torch.Tensor]:
        """Cut `x` along `axis` into k zero-padded blocks of whole symbols."""
        return split_blocks(x, self.k, axis=axis, symbol_size=self.symbol_size)

    def encode(self, code: Code, x: torch.Tensor, axis: int) -> List[torch.Tensor]:
        """Return the n packets of `x` cut along `axis`."""
        return code.encode(self.blocks(x, axis), axis=axis, symbol_size=self.symbol_size)

    def encode_one(self, code: Code, x: torch.Tensor, axis: int, j: int) -> torch.Tensor:
        """Return packet j of `x` cut along `axis`."""
        return code.encode_packet(self.blocks(x, axis), j, axis=axis, symbol_size=self.symbol_size)

    def decode(self, code: Code, packets: Dict[int, torch.Tensor], axis: int, length: int) -> torch.Tensor:
        """Decode packets cut along `axis` back to the tensor of `length` elements along it."""
        return code.decode_joined(packets, axis=axis, symbol_size=self.symbol_size, length=length)

    def conv_args(self) -> tuple:
        """Return (stride, padding, dilation) as the functional convolutions take them."""
        g = self.geometry
        return g.stride, g.padding, g.dilation


def layer_codings(placement: Placement, k: int, symbol_size: int) -> List[LayerCoding]:
    """Return the coding of every coded convolution of a model's placement, in forward order."""
    return [LayerCoding(c.index, c.geometry, k, symbol_size, c.needs_input_grad) for c in placement.coded]


@dataclass
class CodedWeights:
    """Worker j's coded copies of one conv layer."""

    row_weight: Optional[torch.Tensor]
    row_bias: Optional[torch.Tensor]
    col_weight: Optional[torch.Tensor]

    def tensors(self) -> List[torch.Tensor]:
        """Return the coded tensors in a fixed order (row weight, row bias, column weight), those that exist."""
        return [t for t in (self.row_weight, self.row_bias, self.col_weight) if t is not None]


def tensor_names(coding: LayerCoding) -> List[str]:
    """Return the names of a layer's coded tensors in `CodedWeights.tensors` order."""
    return ["weight"] + (["bias"] if coding.has_bias else []) + (["col_weight"] if coding.has_column_copy else [])


def encode_layer(coding: LayerCoding, code: Code, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 j: Optional[int] = None) -> List[CodedWeights]:
    """Encode a conv layer's weight and bias (None: no bias) for every worker (or only worker j)."""
    indices = range(code.n) if j is None else [j]
    out = []
    for idx in indices:
        rw = coding.encode_one(code, weight, 0, idx).contiguous()
        rb = coding.encode_one(code, bias, 0, idx).contiguous() if bias is not None else None
        cw = coding.encode_one(code, weight, 1, idx).contiguous() if coding.has_column_copy else None
        out.append(CodedWeights(rw, rb, cw))
    return out


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return None if t is None else t.to(dtype)


def coded_forward(coding: LayerCoding, x: torch.Tensor, w: CodedWeights,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return conv(X, Wr_j) + br_j: packet j of the layer's output, coded along channels, computed in `dtype`."""
    return F.conv2d(x.to(dtype), _cast(w.row_weight, dtype), _cast(w.row_bias, dtype), *coding.conv_args())


def coded_input_grad(coding: LayerCoding, dy: torch.Tensor, w: CodedWeights, input_shape,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return conv2d_input(dY, Wc_j): packet j of the input gradient, coded along channels, computed in `dtype`."""
    shape = list(input_shape)
    shape[1] = w.col_weight.shape[1]
    return conv2d_input(shape, w.col_weight.to(dtype), dy.to(dtype), *coding.conv_args())


def weight_grad_pieces(coding: LayerCoding, code: Code, j: int, x: torch.Tensor, dy: torch.Tensor,
                       w: CodedWeights, coded: bool = False) -> List[Callable[[], List[torch.Tensor]]]:
    """Return the gradients of worker j's coded tensors (in `CodedWeights.tensors` order) from X and dY, as
    separate pieces of work: the row copy's gradients, then the column copy's.

    Row copy: conv2d_weight(X, SA_j(dY)) = SA_j(dW row blocks); its bias gets the sum of SA_j(dY).
    Column copy: conv2d_weight(SA_j(X), dY) = SA_j(dW column blocks). With `coded`, `dy` is already
    SA_j(dY) (enough for a layer without a column copy). A worker computes the pieces one at a time,
    so that it can turn to a command in between.
    """
    args = coding.conv_args()

    def row() -> List[torch.Tensor]:
        dy_j = dy if coded else coding.encode_one(code, dy, 1, j)
        grads = [conv2d_weight(x, w.row_weight.shape, dy_j, *args)]
        return grads + [dy_j.sum(dim=(0, 2, 3))] if w.row_bias is not None else grads

    def column() -> List[torch.Tensor]:
        return [conv2d_weight(coding.encode_one(code, x, 1, j), w.col_weight.shape, dy, *args)]

    return [row] if w.col_weight is None else [row, column]


def uncoded_weight_grads(coding: LayerCoding, x: torch.Tensor, dy: torch.Tensor,
                         weight_shape) -> List[torch.Tensor]:
    """Return the gradients of the uncoded weight and, where the layer has one, its bias."""
    grads = [conv2d_weight(x, weight_shape, dy, *coding.conv_args())]
    return grads + [dy.sum(dim=(0, 2, 3))] if coding.has_bias else grads
