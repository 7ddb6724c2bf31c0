"""What both coded model-parallel schemes (DEU and naive) share: flat state vectors, shapes, dissemination."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from psframework.codes import BlockLayout, Code, SAZDCode, from_bits, make_code, split_blocks, to_bits, wide_layout
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from psframework.models import Placement
from psframework.schemes.coded_core import tensor_names
from psframework.schemes.coded_layers import LayerCoding, layer_codings
from psframework.schemes.groups import part_size, sync_bytes
from psframework.settings import CodeSettings, Settings

FORWARD, BACKWARD = "forward", "backward"


def code_of(settings: CodeSettings) -> Code:
    """Return the erasure code the settings describe."""
    return make_code(settings.kind, settings.n, settings.k, systematic=settings.systematic, nodes=settings.nodes)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return the tensors concatenated into one flat float32 vector."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def unflatten(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> List[torch.Tensor]:
    """Split a flat vector back into tensors of the given shapes."""
    out, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(flat[offset:offset + size].reshape(shape))
        offset += size
    if offset != flat.numel():
        raise ValueError(f"state vector has {flat.numel()} values, expected {offset}")
    return out


def conv_state_tensors(model: nn.Module, names: Sequence[str],
                       momentum: Optional[List[Dict[str, Optional[torch.Tensor]]]]) -> List[torch.Tensor]:
    """Return [W, b, momentum W, momentum b] of every coded convolution (no b without bias; zeros for no momentum)."""
    modules = dict(model.named_modules())
    out = []
    for i, name in enumerate(names):
        conv = modules[name]
        params = [conv.weight.detach()] + ([] if conv.bias is None else [conv.bias.detach()])
        keys = ("weight_momentum", "bias_momentum")
        out += params + [momentum[i][key] if momentum else torch.zeros_like(p) for key, p in zip(keys, params)]
    return out


def conv_state_shapes(codings: Sequence[LayerCoding]) -> List[torch.Size]:
    """Return the shapes of `conv_state_tensors`."""
    shapes: List[torch.Size] = []
    for c in codings:
        params = [torch.Size(c.geometry.weight_shape)] + ([torch.Size([c.out_channels])] if c.has_bias else [])
        shapes += params * 2
    return shapes


def worker_state_shapes(codings: List[LayerCoding], code: Code) -> List[torch.Size]:
    """Return the shapes of a worker's `CodedWorker.state()` tensors (each tensor, then its momentum)."""
    shapes = []
    for c in codings:
        row = torch.Size(c.row_shape(code))
        named = {"weight": row, "bias": torch.Size(row[:1]), "col_weight": torch.Size(c.col_shape(code))}
        for name in tensor_names(c):
            shapes += [named[name]] * 2
    return shapes


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return max |a - b| relative to max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


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


def activation_shapes(placement: Placement, batch: int) -> Dict[tuple, tuple]:
    """Return the shape of each coded convolution's input (forward) and output gradient (backward)."""
    shapes = {}
    for c in placement.coded:
        shapes[(FORWARD, c.index)] = (batch, *c.input_shape)
        shapes[(BACKWARD, c.index)] = (batch, *c.output_shape)
    return shapes


def expected_server_bytes(settings: Settings, model: nn.Module, placement: Placement,
                          group: int = 0) -> Tuple[int, int]:
    """Return the payload bytes a group's server sends to and receives from its workers per iteration of sazd,
    poly or uncoded: (sent, received). With several groups a server handles its part of the batch.

    Per coded convolution: the input to every worker (a whole tensor, or with relay one packet of its
    bits) and every worker's row-coded output; backward, the output gradient to every worker (a layer
    without a column copy: worker j's own packet of it) and every worker's column-coded input gradient. Every reply
    is counted, also those that come after the first k (they are received, then dropped).
    """
    code = code_of(settings.code)
    n, batch = code.n, part_size(settings.data.batch_size, group, settings.run.servers)
    codings = layer_codings(placement, code.k, settings.code.symbol_size)
    shapes = activation_shapes(placement, batch)
    dissemination = Dissemination(settings.transport.dissemination, settings.code)
    sent = received = 0
    for layer, c in enumerate(codings):
        x, y = shapes[(FORWARD, layer)], shapes[(BACKWARD, layer)]
        rows = batch * c.packet_channels(code, c.out_channels) * y[2] * y[3]
        sent += n * dissemination.delivered(math.prod(x))
        received += n * rows
        if c.has_column_copy:
            sent += n * dissemination.delivered(math.prod(y))
            received += n * batch * c.packet_channels(code, c.in_channels) * x[2] * x[3]
        else:
            sent += n * rows
    return 4 * sent, 4 * received


def expected_sync_bytes(settings: Settings, model: nn.Module, placement: Placement) -> int:
    """Return the payload bytes a server sums with the others per iteration of a coded scheme with several groups.

    Every parameter rank 0 steps (all but the coded convolutions where the workers hold them, DEU)
    and the BatchNorm sums: see groups.sync_bytes.
    """
    from psframework.schemes.registry import get_scheme

    held = set(placement.worker_parameter_names()) if get_scheme(settings.run.scheme).linear_conv_optimizer else set()
    stepped = sum(p.numel() for name, p in model.named_parameters() if name not in held)
    return sync_bytes(stepped, [m for m in model.modules() if isinstance(m, _BatchNorm)])
