"""Naive SAZD coded training (`sazd-naive`): the server encodes, ships coded weights and updates.

The baseline DEU improves on: rank 0 keeps the uncoded conv weights, encodes every worker's coded
weights and sends them with each command, decodes the replies, computes the conv weight gradients
itself and applies the update. Workers are stateless: they only compute with what they are sent, so
the first layer's backward (which needs no input gradient) involves them not at all.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from psframework.comm.rounds import Msg
from psframework.schemes.coded import CodedServerBase, CodedWorkerBase, Payloads, phase_of
from psframework.schemes.coded_layers import (CodedWeights, LayerCoding, coded_forward, coded_input_grad,
                                              encode_layer, uncoded_weight_grads)
from psframework.schemes.coded_parts import FORWARD, flatten, unflatten
from psframework.schemes.common import conv_optimizer


class NaiveServerSide(CodedServerBase):
    """Rank 0: holds the conv weights, encodes them for the workers every round, updates them."""

    def conv_optimizers(self) -> List[torch.optim.Optimizer]:
        """Create the conv layers' optimizer here, on rank 0 (checkpoints restore it with the others)."""
        self.inputs: Dict[int, torch.Tensor] = {}
        return [conv_optimizer(self.settings.optim, [p for conv in self.conv_modules for p in conv.parameters()])]

    def payloads(self, kind: str, layer: int, x: torch.Tensor) -> Payloads:
        """Keep X (forward) or compute the conv weight gradients from it and dY (backward); return the
        tensor and the coded weights every worker needs for the command.

        The time spent here counts as encode_s in the metrics: weight gradients included.
        """
        coding = self.codings[layer]
        conv = self.conv_modules[layer]
        if kind == FORWARD:
            self.inputs[layer] = x
        else:
            grads = uncoded_weight_grads(coding, self.inputs.pop(layer), x, conv.weight.shape)
            for p, g in zip(conv.parameters(), grads):
                p.grad = g
            if not coding.has_column_copy:
                return None, None  # a layer that needs no input gradient needs nothing from the workers
        with torch.no_grad():
            bias = None if conv.bias is None else conv.bias.detach()
            coded = encode_layer(coding, self.code, conv.weight.detach(), bias)
        if kind == FORWARD:
            rows = [[t for t in (w.row_weight, w.row_bias) if t is not None] for w in coded]
            return self.dissemination.packets(x), [flatten(r) for r in rows]
        return self.dissemination.packets(x), [w.col_weight.reshape(-1) for w in coded]


class NaiveWorkerSide(CodedWorkerBase):
    """Worker j: computes with the coded weights the server sends along with each command."""

    def gets_backward(self, coding: LayerCoding) -> bool:
        """Return whether a layer's backward involves the workers: only to compute its input gradient."""
        return coding.has_column_copy

    def compute(self, iteration: int, kind: str, layer: int, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        flat = self.link.take(Msg.params(iteration, layer, phase=phase_of(kind)))  # always taken, even when skipped
        if not reply:
            return None
        coding = self.codings[layer]
        if kind == FORWARD:
            row = torch.Size(coding.row_shape(self.code))
            parts = unflatten(flat, [row, row[:1]] if coding.has_bias else [row])
            return coded_forward(coding, x, CodedWeights(parts[0], parts[1] if coding.has_bias else None, None))
        weight = flat.reshape(coding.col_shape(self.code))
        return coded_input_grad(coding, x, CodedWeights(None, None, weight), self.shapes[(FORWARD, layer)])
