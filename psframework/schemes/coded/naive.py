"""Naive SAZD coded training (`sazd-naive`): the server encodes, ships coded weights and updates.

The baseline that distributed encoding and updating improves on: rank 0 keeps the uncoded conv
weights, encodes every worker's coded weights and sends them with each command, decodes the replies,
computes the conv weight gradients itself and applies the update. Workers are stateless: they only
compute with what they are sent, so the first layer's backward (which needs no input gradient)
involves them not at all.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn

from psframework.comm.envelope import Phase
from psframework.comm.links import WorkerLink
from psframework.comm.rounds import Msg
from psframework.models import Placement
from psframework.schemes.coded.dissemination import Dissemination
from psframework.schemes.coded.exchange import Payloads
from psframework.schemes.coded.layers import (CodedWeights, coded_forward, coded_input_grad, encode_layer,
                                              uncoded_weight_grads)
from psframework.schemes.coded.plan import Command
from psframework.schemes.coded.server import CommandServerBase, stepped_sync_bytes
from psframework.schemes.coded.worker import CommandWorkerBase
from psframework.schemes.common import conv_optimizer
from psframework.schemes.recipe import compute_dtype
from psframework.schemes.vectors import pack, unpack
from psframework.settings import Settings


class EncodingServerSide(CommandServerBase):
    """Rank 0 of `sazd-naive`: holds the conv weights, encodes them for the workers every round, updates them."""

    distributed_encoding_and_updating = False  # the workers take only the passes whose result rank 0 decodes

    def conv_optimizers(self) -> List[torch.optim.Optimizer]:
        """Create the conv layers' optimizer here, on rank 0 (checkpoints restore it with the others)."""
        self.inputs: Dict[int, torch.Tensor] = {}
        return [conv_optimizer(self.settings.optim, [p for conv in self.conv_modules for p in conv.parameters()])]

    def payloads(self, command: Command, x: torch.Tensor) -> Payloads:
        """Keep X (forward) or compute the conv weight gradients from it and dY (backward); return the
        tensor and the coded weights every worker needs for the command.

        The time spent here counts as encode_s in the metrics: weight gradients included.
        """
        layer = command.layer
        coding, conv = self.setup.codings[layer], self.conv_modules[layer]
        if command.phase == Phase.FORWARD:
            self.inputs[layer] = x
        else:
            grads = uncoded_weight_grads(coding, self.inputs.pop(layer), x, conv.weight.shape)
            for p, g in zip(conv.parameters(), grads):  # accumulated over an optimizer step's micro-batches
                p.grad = g if p.grad is None else p.grad + g
        if not self.setup.plan.sends(command):
            return Payloads(None)  # a layer that needs no input gradient needs nothing from the workers
        with torch.no_grad():
            bias = None if conv.bias is None else conv.bias.detach()
            coded = encode_layer(coding, self.setup.code, conv.weight.detach(), bias)
        if command.phase == Phase.FORWARD:
            rows = [[t for t in (w.row_weight, w.row_bias) if t is not None] for w in coded]
            return Payloads(self.setup.dissemination.packets(x), [pack(r) for r in rows])
        return Payloads(self.setup.dissemination.packets(x), [w.col_weight.reshape(-1) for w in coded])


class StatelessWorkerSide(CommandWorkerBase):
    """Worker j of `sazd-naive`: holds no weights; computes with the coded ones the server sends with each command."""

    distributed_encoding_and_updating = False  # as the server's: this worker takes only the passes rank 0 decodes

    def __init__(self, settings: Settings, link: WorkerLink, dissemination: Optional[Dissemination] = None) -> None:
        super().__init__(settings, link, dissemination)
        self.dtype = compute_dtype(settings.optim.precision)  # the replies' precision

    def compute(self, iteration: int, command: Command, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        layer = command.layer
        flat = self.link.take(Msg.params(iteration, layer, phase=command.phase))  # always taken, even when skipped
        if not reply:
            return None
        coding = self.setup.codings[layer]
        if command.phase == Phase.FORWARD:
            row = torch.Size(coding.row_shape(self.setup.code))
            parts = unpack(flat, [row, row[:1]] if coding.has_bias else [row])
            weights = CodedWeights(parts[0], parts[1] if coding.has_bias else None, None)
            return coded_forward(coding, x, weights, self.dtype)
        weight = flat.reshape(coding.col_shape(self.setup.code))
        input_shape = self.setup.plan.shape(Command(Phase.FORWARD, layer), self.batch)
        return coded_input_grad(coding, x, CodedWeights(None, None, weight), input_shape, self.dtype)


def expected_sync_bytes(settings: Settings, model: nn.Module, placement: Placement) -> int:
    """Return the payload bytes a server sums with the others per iteration with several groups: rank 0
    steps every parameter, the coded convolutions' too, and sums the BatchNorm statistics."""
    return stepped_sync_bytes(model, frozenset())
