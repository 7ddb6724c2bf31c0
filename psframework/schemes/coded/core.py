"""The coded model-parallel algorithm, apart from its transport.

`CodedServer` runs one training iteration given an `Exchange` that delivers a layer's tensor to the
workers and returns the replies the server decodes from (any k of n); `CodedWorker` is what one
worker does with the commands it receives. The MPI schemes plug an MPI exchange in; tests plug an
in-process one, so the arithmetic is checked against the reference trainer without MPI.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from psframework.codes import Code
from psframework.models import Placement, remote_convs
from psframework.schemes.common import make_optimizer, scale_lr
from psframework.schemes.coded_layers import (CodedWeights, LayerCoding, coded_forward, coded_input_grad,
                                              encode_layer, weight_grad_pieces)

FORWARD, BACKWARD = 0, 1  # the two passes of a coded layer
Reduce = Callable[[torch.Tensor], Callable[[], torch.Tensor]]  # start a sum; the callable it returns waits for it


class Exchange(Protocol):
    """Deliver a layer's tensor to every worker and collect the replies the server needs."""

    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        """Send X_{l-1}; return at least k coded outputs {worker index: Yr_j}."""

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        """Send dY_l; return at least k coded input gradients (none when `want_reply` is false)."""


@dataclass
class Update:
    """A layer's coded weight update, computed when the worker has time or when the layer is next needed."""

    pieces: List[Callable[[], List[torch.Tensor]]]  # gradients still to compute, one piece of work each
    lr_factor: float  # the schedule's learning-rate factor of the iteration it belongs to
    grads: List[torch.Tensor] = field(default_factory=list)  # gradients computed so far


class CodedWorker:
    """Worker j: holds packet j of every conv layer's row- and column-coded weights and updates them.

    Updates are deferred: `update` queues a layer's update and the worker applies it (`settle`) while
    it waits for the layer's next forward command or, at the latest, before its next forward pass.
    The server's next backward round needs the worker's reply, not its update, so the update leaves
    the backward pass's critical path. Every update is still applied, in order, with its own
    iteration's learning rate.
    """

    def __init__(self, j: int, code: Code, codings: List[LayerCoding], weights: List[CodedWeights],
                 lr: float, momentum: float, nesterov: bool, weight_decay: float, reduce: Optional[Reduce] = None):
        self.j = j
        # With several groups: start summing a layer's coded gradient with the other holders of packet j;
        # the step waits for the sum until the layer's weights are next needed (its next forward).
        self.reduce = reduce
        self.pending: Dict[int, Tuple[Callable[[], torch.Tensor], List[torch.Size]]] = {}
        self.deferred: Dict[int, Update] = {}
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
        self.settle(layer)
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

    def update(self, layer: int, dy: torch.Tensor, coded: bool = False, lr_factor: float = 1.0) -> None:
        """Queue the layer's update from dY (or, for a layer without a column copy, SA_j(dY))."""
        coding = self.codings[layer]
        if coded and coding.has_column_copy:
            raise ValueError(f"layer {layer}: a coded output gradient only updates a layer without a column copy")
        if layer in self.deferred:  # one update per layer and iteration: the older one first
            self._apply(layer)
        pieces = weight_grad_pieces(coding, self.code, self.j, self._input(layer), dy, self.weights[layer], coded)
        self.deferred[layer] = Update(pieces, lr_factor)

    def has_update(self, layer: int) -> bool:
        """Return whether the layer has a queued update."""
        return layer in self.deferred

    def work(self, layer: int) -> bool:
        """Do one piece of the layer's queued update; return whether any is left."""
        task = self.deferred[layer]
        task.grads += task.pieces.pop(0)()
        if task.pieces:
            return True
        self._apply(layer)
        return False

    def _apply(self, layer: int) -> None:
        """Finish the layer's queued update: its remaining gradients, then the step (or the start of their sum)."""
        task = self.deferred.pop(layer)
        grads = task.grads + [g for piece in task.pieces for g in piece()]
        self.inputs[layer] = None
        scale_lr([self.optimizers[layer]], task.lr_factor)
        if self.reduce is None:
            self._step(layer, grads)
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.pending[layer] = (self.reduce(flat), [g.shape for g in grads])

    def settle(self, layer: Optional[int] = None) -> None:
        """Apply the queued updates and those whose gradient sums are in flight: one layer's, or every layer's.

        Layers go in ascending order, the order of the forward pass: the holders of packet j in every
        group start their sums in the same order.
        """
        for index in sorted(set(self.deferred) | set(self.pending)) if layer is None else [layer]:
            if index in self.deferred:
                self._apply(index)
            if index in self.pending:
                finish, shapes = self.pending.pop(index)
                total, grads, offset = finish(), [], 0
                for shape in shapes:
                    grads.append(total[offset:offset + shape.numel()].view(shape))
                    offset += shape.numel()
                self._step(index, grads)

    def _step(self, layer: int, grads: Sequence[torch.Tensor]) -> None:
        for t, g in zip(self.weights[layer].tensors(), grads):
            t.grad = g
        self.optimizers[layer].step()

    def _input(self, layer: int) -> torch.Tensor:
        x = self.inputs[layer]
        if x is None:
            raise RuntimeError(f"worker {self.j}: backward of layer {layer} before its forward")
        return x

    def state(self) -> List[torch.Tensor]:
        """Return the coded tensors and their momentum buffers, layer by layer (every update applied)."""
        self.settle()
        out: List[torch.Tensor] = []
        for w, opt in zip(self.weights, self.optimizers):
            for t in w.tensors():
                out.append(t)
                buf = opt.state.get(t, {}).get("momentum_buffer")
                out.append(buf if buf is not None else torch.zeros_like(t))
        return out


def conv_weights(model: nn.Module, codings: List[LayerCoding], names: Sequence[str]
                 ) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Return the (weight, bias or None) of the model's coded convolutions, detached."""
    modules = dict(model.named_modules())
    return [(modules[n].weight.detach(), None if modules[n].bias is None else modules[n].bias.detach())
            for n in names]


def encode_worker_weights(model: nn.Module, code: Code, codings: List[LayerCoding], names: Sequence[str],
                          j: int) -> List[CodedWeights]:
    """Return worker j's coded copies of every coded convolution of `model`."""
    with torch.no_grad():
        return [encode_layer(c, code, w, b, j)[0] for c, (w, b) in zip(codings, conv_weights(model, codings, names))]


class CodedServer:
    """Rank 0's side: runs the model with its coded convolutions computed by the workers.

    The model runs in its own order with each coded Conv2d replaced by a remote convolution whose
    forward sends X and decodes Y from the first k replies and whose backward sends dY and decodes
    dX; everything else (BatchNorm, activations, pooling, residual additions, the head) runs here on
    the decoded tensors, so autograd keeps the model's structure.
    """

    def __init__(self, model: nn.Module, code: Code, codings: List[LayerCoding], placement: Placement,
                 optimizers: Sequence[Optional[torch.optim.Optimizer]]):
        self.model = model
        self.code = code
        self.codings = codings
        self.placement = placement
        # The optimizers of what rank 0 trains: the head, BatchNorm and (naive scheme) the conv layers.
        self.optimizers = [opt for opt in optimizers if opt is not None]
        self.decode_s = 0.0  # seconds spent decoding, accumulated over steps

    def decode(self, coding: LayerCoding, replies: Dict[int, torch.Tensor], length: int) -> torch.Tensor:
        """Decode a layer's channels from the replies, timing it."""
        t0 = time.perf_counter()
        out = coding.decode(self.code, replies, axis=1, length=length)
        self.decode_s += time.perf_counter() - t0
        return out

    def step(self, x: torch.Tensor, y: torch.Tensor, exchange: Exchange, group: Any = None) -> float:
        """Run one iteration on the global batch (x, y), or with a server group on its part; return the loss.

        With a group (schemes.groups.ServerGroup) the loss is this part's share of the global batch's
        mean, BatchNorm uses the whole batch's statistics, and rank 0's gradients are summed over the servers.
        """
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        session = _Rounds(self, exchange)
        with remote_convs(self.model, self.placement.coded_names, session), \
                (nullcontext() if group is None else group.batchnorm(self.model)):
            scores = self.model(x)
            loss = F.cross_entropy(scores, y) if group is None else group.loss(scores, y)
            loss.backward()
        session.finish()
        value = float(loss.detach())
        if group is not None:
            value = group.sum_gradients(self.optimizers, value)
        for opt in self.optimizers:
            opt.step()
        return value


class _Rounds:
    """The session of one iteration: each remote convolution's call becomes a round, in the planned order."""

    def __init__(self, server: CodedServer, exchange: Exchange) -> None:
        self.server, self.exchange = server, exchange
        placement = server.placement
        self.plan = [(FORWARD, c.index) for c in placement.coded] + [(BACKWARD, i) for i in placement.backward_order]
        self.position = 0

    def expect(self, kind: int, index: int) -> None:
        """Check that the model calls its coded convolutions in the order the workers follow."""
        planned = self.plan[self.position] if self.position < len(self.plan) else None
        if planned != (kind, index):
            name = self.server.placement.coded[index].name
            raise RuntimeError(f"model: convolution {name!r} ran its {'backward' if kind else 'forward'} pass out of "
                               "the traced order; coded schemes need a forward pass without data-dependent "
                               "control flow")
        self.position += 1

    def forward(self, index: int, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        self.expect(FORWARD, index)
        coding = self.server.codings[index]
        return self.server.decode(coding, self.exchange.forward(index, x.detach()), coding.out_channels)

    def backward(self, index: int, dy: torch.Tensor, want_input_grad: bool) -> Optional[torch.Tensor]:
        self.expect(BACKWARD, index)
        coding = self.server.codings[index]
        replies = self.exchange.backward(index, dy, want_reply=coding.has_column_copy)
        if not coding.has_column_copy:
            return None
        return self.server.decode(coding, replies, coding.in_channels)

    def finish(self) -> None:
        """Check that every planned round ran."""
        if self.position != len(self.plan):
            raise RuntimeError(f"model: {len(self.plan) - self.position} coded convolution passes of the traced "
                               "order did not run; coded schemes need a forward pass without data-dependent "
                               "control flow")


def decode_conv_state(code: Code, codings: List[LayerCoding], states: Dict[int, List[torch.Tensor]]
                      ) -> List[Dict[str, torch.Tensor]]:
    """Decode uncoded weights, biases and momentum buffers from k workers' `CodedWorker.state()`.

    Each layer gives {"weight", "weight_momentum", "bias", "bias_momentum", "col_weight"}; the bias
    entries are None for a layer without bias, "col_weight" for a layer without a column copy.
    """
    layers, base = [], 0
    for coding in codings:
        layer: Dict[str, Any] = {"bias": None, "bias_momentum": None, "col_weight": None}
        for name in tensor_names(coding):
            for offset, key in enumerate((name, f"{name}_momentum")):
                part = {j: s[base + offset] for j, s in states.items()}
                if name == "col_weight":
                    layer[key] = coding.decode(code, part, axis=1, length=coding.in_channels)
                else:
                    layer[key] = coding.decode(code, part, axis=0, length=coding.out_channels)
            base += 2
        layers.append(layer)
    return layers


def tensor_names(coding: LayerCoding) -> List[str]:
    """Return the names of a layer's coded tensors in `CodedWeights.tensors` order."""
    return ["weight"] + (["bias"] if coding.has_bias else []) + (["col_weight"] if coding.has_column_copy else [])
