"""The coded model-parallel algorithm, apart from its transport.

`CodedServer` runs one training iteration given an `Exchange` that delivers a layer's tensor to the
workers and returns the replies the server decodes from (any k of n); `CodedWorker` is what one
worker does with the commands it receives. The MPI schemes plug an MPI exchange in; tests plug an
in-process one, so the arithmetic is checked against the reference trainer without MPI.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Protocol, Sequence

import torch
import torch.nn.functional as F

from psframework.codes import Code
from psframework.models import SplitCNN
from psframework.schemes.common import make_optimizer
from psframework.schemes.coded_layers import (CodedWeights, LayerCoding, coded_forward, coded_input_grad,
                                              coded_weight_grads, encode_layer)

FORWARD, BACKWARD = 0, 1


class Exchange(Protocol):
    """Deliver a layer's tensor to every worker and collect the replies the server needs."""

    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        """Send X_{l-1}; return at least k coded outputs {worker index: Yr_j}."""

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        """Send dY_l; return at least k coded input gradients (none when `want_reply` is false)."""


class CodedWorker:
    """Worker j: holds packet j of every conv layer's row- and column-coded weights and updates them."""

    def __init__(self, j: int, code: Code, codings: List[LayerCoding], weights: List[CodedWeights],
                 lr: float, momentum: float, nesterov: bool, weight_decay: float):
        self.j = j
        self.code = code
        self.codings = codings
        self.weights = weights
        for w in weights:
            for t in w.tensors():
                t.requires_grad_(False)
        # SGD only: a linear step keeps every coded copy an exact image of one weight.
        self.optimizers = [make_optimizer(w.tensors(), "sgd", lr, momentum, nesterov, weight_decay) for w in weights]
        self.inputs: List[Optional[torch.Tensor]] = [None] * len(codings)

    def on_forward(self, layer: int, x: torch.Tensor, reply: bool = True) -> Optional[torch.Tensor]:
        """Keep X_{l-1} for the update; return the coded output unless the reply is stale."""
        self.inputs[layer] = x
        if not reply:
            return None
        return coded_forward(self.codings[layer], x, self.weights[layer])

    def on_backward(self, layer: int, dy: torch.Tensor, reply: bool = True) -> Optional[torch.Tensor]:
        """Return the coded input gradient with the current weights, unless stale or layer 0."""
        coding, w = self.codings[layer], self.weights[layer]
        if not (reply and coding.has_column_copy):
            return None
        return coded_input_grad(coding, dy, w, self._input(layer).shape)

    def update(self, layer: int, dy: torch.Tensor, coded: bool = False) -> None:
        """Update the layer's coded weights from dY (or, for a layer without a column copy, SA_j(dY))."""
        coding, w = self.codings[layer], self.weights[layer]
        if coded and coding.has_column_copy:
            raise ValueError(f"layer {layer}: a coded output gradient only updates a layer without a column copy")
        grads = coded_weight_grads(coding, self.code, self.j, self._input(layer), dy, w, coded=coded)
        for t, g in zip(w.tensors(), grads):
            t.grad = g
        self.optimizers[layer].step()
        self.inputs[layer] = None

    def _input(self, layer: int) -> torch.Tensor:
        x = self.inputs[layer]
        if x is None:
            raise RuntimeError(f"worker {self.j}: backward of layer {layer} before its forward")
        return x

    def state(self) -> List[torch.Tensor]:
        """Return the coded tensors and their momentum buffers, layer by layer."""
        out: List[torch.Tensor] = []
        for w, opt in zip(self.weights, self.optimizers):
            for t in w.tensors():
                out.append(t)
                buf = opt.state.get(t, {}).get("momentum_buffer")
                out.append(buf if buf is not None else torch.zeros_like(t))
        return out


def encode_worker_weights(model: SplitCNN, code: Code, codings: List[LayerCoding], j: int) -> List[CodedWeights]:
    """Return worker j's coded copies of every conv layer of `model`."""
    with torch.no_grad():
        return [encode_layer(c, code, b.conv.weight.detach(), b.conv.bias.detach(), j)[0]
                for c, b in zip(codings, model.conv_blocks)]


class CodedServer:
    """Rank 0's side: decode conv outputs, run BatchNorm/ReLU/pooling and the head, decode gradients."""

    def __init__(self, model: SplitCNN, code: Code, codings: List[LayerCoding],
                 optimizers: Sequence[Optional[torch.optim.Optimizer]]):
        self.model = model
        self.code = code
        self.codings = codings
        # The optimizers of what rank 0 trains: the head, BatchNorm and (naive scheme) the conv layers.
        self.optimizers = [opt for opt in optimizers if opt is not None]
        self.decode_s = 0.0  # seconds spent decoding, accumulated over steps

    def decode(self, coding: LayerCoding, replies: Dict[int, torch.Tensor], length: int) -> torch.Tensor:
        """Decode a layer's channels from the replies, timing it."""
        t0 = time.perf_counter()
        out = coding.decode(self.code, replies, axis=1, length=length)
        self.decode_s += time.perf_counter() - t0
        return out

    def step(self, x: torch.Tensor, y: torch.Tensor, exchange: Exchange) -> float:
        """Run one iteration on the global batch (x, y); return the loss."""
        blocks = self.model.conv_blocks
        outputs: List[torch.Tensor] = []
        conv_outs: List[torch.Tensor] = []
        h = x
        for layer, (block, coding) in enumerate(zip(blocks, self.codings)):
            replies = exchange.forward(layer, h)
            y_l = self.decode(coding, replies, coding.out_channels)
            y_l = y_l.detach().clone().requires_grad_(True)
            out = block.post(y_l)
            conv_outs.append(y_l)
            outputs.append(out)
            h = out.detach()
        features = h.requires_grad_(True)
        loss = F.cross_entropy(self.model.head(features), y)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        grad = features.grad
        for layer in range(len(blocks) - 1, -1, -1):
            outputs[layer].backward(grad)
            dy = conv_outs[layer].grad
            coding = self.codings[layer]
            replies = exchange.backward(layer, dy, want_reply=coding.has_column_copy)
            if coding.has_column_copy:
                grad = self.decode(coding, replies, coding.in_channels)
        for opt in self.optimizers:
            opt.step()
        return float(loss.detach())


def decode_conv_state(code: Code, codings: List[LayerCoding], states: Dict[int, List[torch.Tensor]]
                      ) -> List[Dict[str, torch.Tensor]]:
    """Decode uncoded weights, biases and momentum buffers from k workers' `CodedWorker.state()`."""
    layers, base = [], 0
    for coding in codings:
        count = 5 if coding.has_column_copy else 4
        parts = [{j: s[base + offset] for j, s in states.items()} for offset in range(count)]
        rows = [coding.decode(code, part, axis=0, length=coding.out_channels) for part in parts[:4]]
        layers.append({
            "weight": rows[0], "weight_momentum": rows[1], "bias": rows[2], "bias_momentum": rows[3],
            "col_weight": (coding.decode(code, parts[4], axis=1, length=coding.in_channels)
                           if coding.has_column_copy else None),
        })
        base += 6 if coding.has_column_copy else 4
    return layers
