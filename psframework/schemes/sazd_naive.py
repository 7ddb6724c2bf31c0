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

    def conv_optimizers(self, model, momentum: Optional[List[Dict[str, torch.Tensor]]]
                        ) -> List[torch.optim.Optimizer]:
        """Create the conv layers' optimizer here, on rank 0, restoring checkpointed momentum."""
        self.conv_optimizer = conv_optimizer(self.cfg, [p for b in model.conv_blocks
                                                        for p in (b.conv.weight, b.conv.bias)])
        self.inputs: Dict[int, torch.Tensor] = {}
        if momentum is not None and self.cfg.train.momentum > 0:
            for block, m in zip(model.conv_blocks, momentum):
                self.conv_optimizer.state[block.conv.weight]["momentum_buffer"] = m["weight_momentum"].clone()
                self.conv_optimizer.state[block.conv.bias]["momentum_buffer"] = m["bias_momentum"].clone()
        return [self.conv_optimizer]

    def round_extra(self, cmd: Command, x: torch.Tensor) -> Optional[List[torch.Tensor]]:
        """Keep X (forward) or compute the conv weight gradients from it and dY (backward); return the
        coded weights every worker needs for the command, encoded from the current uncoded weights.

        The time spent here counts as encode_s in the metrics: weight gradients included.
        """
        coding = self.codings[cmd.layer]
        conv = self.model.conv_blocks[cmd.layer].conv
        if cmd.kind == FORWARD:
            self.inputs[cmd.layer] = x
        else:
            conv.weight.grad, conv.bias.grad = uncoded_weight_grads(coding, self.inputs.pop(cmd.layer), x,
                                                                    conv.weight.shape)
            if not coding.has_column_copy:
                return None  # the first layer's backward needs nothing from the workers
        with torch.no_grad():
            coded = encode_layer(coding, self.code, conv.weight.detach(), conv.bias.detach())
        if cmd.kind == FORWARD:
            return [flatten([w.row_weight, w.row_bias]) for w in coded]
        return [w.col_weight.reshape(-1) for w in coded]

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



def run(cfg: Config, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run `sazd-naive` on this rank: the server returns the summary, workers return None."""
    return run_ranks(cfg, NaiveServerRank, NaiveWorkerRank, comm)
