"""How rank 0 delivers a tensor to every worker: a copy each (direct), or relayed among the workers as
SA-coded packets of its bits, restored bit-exactly from any k (docs/design.md#relay-dissemination)."""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

import torch

from psframework.codes import BlockLayout, SAZDCode, from_bits, split_blocks, to_bits, wide_layout
from psframework.settings import CodeSettings


class Dissemination:
    """Deliver a tensor from the server to every worker: direct, or relayed as SA-coded packets of its bits.

    Relay codes the tensor's bits as one flat vector cut into the widest symbols the code allows
    (codes.wide_layout): decoding then takes a few array calls per packet whatever the tensor's size,
    and none beyond k copies when the systematic packets arrive.
    """

    def __init__(self, mode: str, code: CodeSettings):
        # Relay codes raw bits with wrap-around arithmetic, which only SA codes can do bit-exactly.
        self.code = SAZDCode(code.n, code.k, systematic=code.systematic) if mode == "relay" else None
        self.n, self.k = code.n, code.k

    @property
    def relayed(self) -> bool:
        """Return whether workers exchange packets among themselves."""
        return self.code is not None

    def layout(self, numel: int) -> BlockLayout:
        """Return how a relayed tensor of `numel` elements is cut into blocks and symbols."""
        return wide_layout(numel, self.k, self.code.padding)

    def packets(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Return what the server sends to each worker (a copy of the tensor, or packet j of its bits).

        Sends may complete, or even start, after the model has moved on, and autograd reuses gradient
        buffers in place (a residual connection adds into them): what is sent must be a copy.
        """
        if self.code is None:
            return [x.detach().clone(memory_format=torch.contiguous_format)] * self.n
        bits = to_bits(x.detach().contiguous()).reshape(-1)
        size = self.layout(bits.numel()).symbol_size
        return self.code.encode(split_blocks(bits, self.k, symbol_size=size), axis=0, symbol_size=size)

    def delivered(self, numel: int) -> int:
        """Return how many elements the server sends each worker for a tensor of `numel` elements."""
        if self.code is None:
            return numel
        layout = self.layout(numel)
        return self.code.packet_length(layout.block_length, layout.symbol_size)

    def restore(self, packets: Dict[int, torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Decode the tensor bit-exactly from k packets."""
        numel = math.prod(shape)
        size = self.layout(numel).symbol_size
        bits = self.code.decode_joined(packets, axis=0, symbol_size=size, length=numel)
        return from_bits(bits.contiguous(), dtype).reshape(shape)
