"""Naive SAZD coded training (`sazd-naive`): the server encodes, ships coded weights and updates.

The baseline DEU improves on: rank 0 keeps the uncoded conv weights, encodes every worker's coded
weights and sends them with each command, decodes the replies, computes the conv weight gradients
itself and applies the update. Workers are stateless: they only compute with what they are sent.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from psframework.config import Config
from psframework.schemes.coded import (BACKWARD, FORWARD, Command, CodedServerRank, CodedWorkerRank, envelope, flatten,
                                       run_ranks, unflatten)
from psframework.schemes.coded_layers import (CodedWeights, coded_forward, coded_input_grad, encode_layer,
                                              uncoded_weight_grads)
from psframework.schemes.common import conv_optimizer


class NaiveServerRank(CodedServerRank):
    """Rank 0: holds the conv weights, encodes them for the workers every round, updates them."""

    stateful = False

    def conv_optimizers(self) -> List[torch.optim.Optimizer]:
        return [self.conv_optimizer]

    def setup_optimizers(self, model) -> None:
        self.conv_params = [p for b in model.conv_blocks for p in (b.conv.weight, b.conv.bias)]
        self.conv_optimizer = conv_optimizer(self.cfg, self.conv_params)
        self.inputs: Dict[int, torch.Tensor] = {}

    def restore_momentum(self, momentum: Optional[List[Dict[str, torch.Tensor]]]) -> None:
        if momentum is None or self.cfg.train.momentum == 0:
            return
        for block, m in zip(self.model.conv_blocks, momentum):
            self.conv_optimizer.state[block.conv.weight]["momentum_buffer"] = m["weight_momentum"].clone()
            self.conv_optimizer.state[block.conv.bias]["momentum_buffer"] = m["bias_momentum"].clone()

    def start_workers(self, model, momentum, start: int) -> None:
        """Nothing to send: stateless workers get their weights with every command."""

    def before_forward(self, layer: int, x: torch.Tensor) -> None:
        self.inputs[layer] = x

    def before_backward(self, layer: int, dy: torch.Tensor) -> None:
        coding = self.codings[layer]
        conv = self.model.conv_blocks[layer].conv
        grads = uncoded_weight_grads(coding, self.inputs.pop(layer), dy, conv.weight.shape)
        conv.weight.grad, conv.bias.grad = grads

    def round_extra(self, cmd: Command, x: torch.Tensor) -> Optional[List[torch.Tensor]]:
        """Encode every worker's coded weights of this layer from the current uncoded weights."""
        conv = self.model.conv_blocks[cmd.layer].conv
        with torch.no_grad():
            coded = encode_layer(self.codings[cmd.layer], self.code, conv.weight.detach(), conv.bias.detach())
        if cmd.kind == FORWARD:
            return [flatten([w.row_weight, w.row_bias]) for w in coded]
        return [w.col_weight.reshape(-1) for w in coded]

    def end_step(self) -> None:
        self.conv_optimizer.step()
        self.conv_optimizer.zero_grad(set_to_none=True)

    def sync_state(self, iteration: int, verify: bool) -> List[Dict[str, torch.Tensor]]:
        """The server holds the weights: return its momentum buffers for checkpoints."""
        out = []
        for block in self.model.conv_blocks:
            state = [self.conv_optimizer.state.get(p, {}).get("momentum_buffer") for p in
                     (block.conv.weight, block.conv.bias)]
            out.append({"weight_momentum": state[0] if state[0] is not None else torch.zeros_like(block.conv.weight),
                        "bias_momentum": state[1] if state[1] is not None else torch.zeros_like(block.conv.bias)})
        return out


class NaiveWorkerRank(CodedWorkerRank):
    """Worker j: computes with the coded weights the server sends along with each command."""

    stateful = False

    def command_envelopes(self, cmd: Command) -> list:
        """Forward and backward commands come with the coded weights in a second message."""
        if cmd.kind in (FORWARD, BACKWARD):
            return [envelope(cmd), envelope(cmd, params=True)]
        return [envelope(cmd)]

    def compute(self, cmd: Command, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        flat = self.inbox.take(envelope(cmd, params=True))  # always taken, even when skipped
        if not reply:
            return None
        coding = self.codings[cmd.layer]
        if cmd.kind == FORWARD:
            row = torch.Size(coding.row_shape(self.code))
            weight, bias = unflatten(flat, [row, row[:1]])
            return coded_forward(coding, x, CodedWeights(weight, bias, None))
        weight = flat.reshape(coding.col_shape(self.code))
        return coded_input_grad(coding, x, CodedWeights(None, None, weight), self.shapes[(FORWARD, cmd.layer)])


    def after_reply(self, cmd: Command, x: torch.Tensor) -> None:
        """Nothing to update: the server owns the weights."""


def run(cfg: Config, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run `sazd-naive` on this rank: the server returns the summary, workers return None."""
    return run_ranks(cfg, NaiveServerRank, NaiveWorkerRank, comm)
