"""The coded model-parallel algorithm, apart from its transport.

`DecodingServer` runs one training iteration through an `Exchange` that delivers a layer's tensor to
the workers and returns the replies the server decodes from (any k of n); `EncodingWorker` is what one
worker does with the commands it receives. The MPI sides plug an MPI exchange in (exchange.py);
tests plug an in-process one, so the arithmetic is checked against the reference trainer without MPI.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
from torch import nn

from psframework.codes import Code
from psframework.comm.envelope import Phase
from psframework.comm.timeline import TIMELINE
from psframework.schemes.coded.layers import (CodedWeights, LayerCoding, coded_forward, coded_input_grad,
                                              weight_grad_pieces)
from psframework.schemes.coded.plan import Command, CommandPlan
from psframework.schemes.coded.remote import remote_convs
from psframework.schemes.coded.state import encode_state
from psframework.schemes.common import make_optimizer, scale_lr
from psframework.schemes.groups import Group
from psframework.schemes.recipe import LossScaler, autocast, compute_dtype, finite, step_scaled, unscale
from psframework.schemes.vectors import momentum_of, pack, set_momentum, unpack
from psframework.settings import OptimSettings

Reduce = Callable[[torch.Tensor], Callable[[], torch.Tensor]]  # start a sum; the callable it returns waits for it


class Exchange(Protocol):
    """Deliver a layer's tensor to every worker and collect the replies the server needs."""

    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        """Send X_{l-1}; return at least k coded outputs {worker index: Yr_j}."""

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        """Send dY_l; return at least k coded input gradients (none when `want_reply` is false)."""

    def conclude(self, scale: float, taken: bool) -> None:
        """Tell the workers an optimizer step's loss scale and whether it is taken (with loss scaling)."""


@dataclass
class Update:
    """A layer's coded weight update, computed when the worker has time or when the layer is next needed."""

    pieces: List[Callable[[], List[torch.Tensor]]]  # gradients still to compute, one piece of work each
    lr_factor: float  # the schedule's learning-rate factor of the iteration it belongs to
    steps: bool = True  # whether the optimizer steps after it (False: a micro-batch whose gradients accumulate)
    iteration: int = 0  # with loss scaling: the iteration whose decision (`EncodingWorker.decisions`) the step takes
    grads: List[torch.Tensor] = field(default_factory=list)  # gradients computed so far


class EncodingWorker:
    """Worker j: encodes packet j of every conv layer's row- and column-coded weights and updates them.

    Updates are deferred: `update` queues a layer's update and the worker applies it (`settle`) while
    it waits for the layer's next forward command or, at the latest, before its next forward pass.
    The server's next backward round needs the worker's reply, not its update, so the update leaves
    the backward pass's critical path. Every update is still applied, in order, with its own
    iteration's learning rate. With gradient accumulation the updates of an optimizer step's
    micro-batches add up (their sum is the coded image of the step's gradient) and the step is
    taken once, after the last. Replies are computed in `train.precision`; updates in float32, so
    that every coded copy stays an exact image of one weight.
    """

    def __init__(self, j: int, code: Code, codings: List[LayerCoding], weights: List[CodedWeights],
                 optim: OptimSettings) -> None:
        self.j = j
        self.dtype = compute_dtype(optim.precision)
        self.deferred: Dict[int, Update] = {}
        self.accumulated: Dict[int, List[torch.Tensor]] = {}  # gradients of an optimizer step's earlier micro-batches
        self.scaled = optim.loss_scale == "dynamic"
        self.decisions: Dict[int, Tuple[float, bool]] = {}  # loss scaling: rank 0's (scale, taken) per iteration
        self.code = code
        self.codings = codings
        self.weights = weights
        for w in weights:
            for t in w.tensors():
                t.requires_grad_(False)
        # SGD only: a linear step keeps every coded copy an exact image of one weight.
        self.optimizers = [make_optimizer(w.tensors(), "sgd", optim.lr, optim.momentum, optim.nesterov,
                                          optim.weight_decay) for w in weights]
        self.inputs: List[Optional[torch.Tensor]] = [None] * len(codings)

    @classmethod
    def from_state(cls, j: int, code: Code, codings: List[LayerCoding], state: torch.Tensor, optim: OptimSettings,
                   **extra: Reduce) -> "EncodingWorker":
        """Return worker j holding its packets of an uncoded conv state (`state.conv_state_tensors`, flat)."""
        weights, buffers = encode_state(code, codings, state, j)
        worker = cls(j, code, codings, weights, optim, **extra)
        if optim.momentum > 0:
            for opt, w, m in zip(worker.optimizers, weights, buffers):
                for tensor, buf in zip(w.tensors(), m.tensors()):
                    set_momentum(opt, tensor, buf.clone())
        return worker

    def on_forward(self, layer: int, x: torch.Tensor, reply: bool = True) -> Optional[torch.Tensor]:
        """Keep X_{l-1} for the update; return the coded output unless the reply is stale."""
        self.settle(layer)
        self.inputs[layer] = x
        if not reply:
            return None
        return coded_forward(self.codings[layer], x, self.weights[layer], self.dtype)

    def on_backward(self, layer: int, dy: torch.Tensor, reply: bool = True) -> Optional[torch.Tensor]:
        """Return the coded input gradient with the current weights, unless stale or layer 0."""
        coding, w = self.codings[layer], self.weights[layer]
        if not (reply and coding.has_column_copy):
            return None
        return coded_input_grad(coding, dy, w, self._input(layer).shape, self.dtype)

    def update(self, layer: int, dy: torch.Tensor, coded: bool = False, lr_factor: float = 1.0,
               steps: bool = True, iteration: int = 0) -> None:
        """Queue the layer's update from dY (or, for a layer without a column copy, SA_j(dY)); `steps`: the
        optimizer steps after it (otherwise its gradients accumulate for the step's later micro-batches)."""
        coding = self.codings[layer]
        if coded and coding.has_column_copy:
            raise ValueError(f"layer {layer}: a coded output gradient only updates a layer without a column copy")
        if layer in self.deferred:  # one update per layer and iteration: the older one first
            self._apply(layer)
        pieces = weight_grad_pieces(coding, self.code, self.j, self._input(layer), dy, self.weights[layer], coded)
        self.deferred[layer] = Update(pieces, lr_factor, steps, iteration)

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

    def settle(self, layer: Optional[int] = None) -> None:
        """Apply the queued updates: one layer's, or every layer's (in ascending order, the forward order)."""
        for index in self._unsettled() if layer is None else [layer]:
            if index in self.deferred:
                self._apply(index)
            self._finish(index)

    def _unsettled(self) -> List[int]:
        """Return the layers whose updates are not all applied yet."""
        return sorted(self.deferred)

    def _apply(self, layer: int) -> None:
        """Finish the layer's queued update: its remaining gradients, then the step (`_conclude`)."""
        task = self.deferred.pop(layer)
        grads = task.grads + [g for piece in task.pieces for g in piece()]
        self.inputs[layer] = None
        if layer in self.accumulated:
            grads = [a.add_(g) for a, g in zip(self.accumulated.pop(layer), grads)]
        if not task.steps:
            self.accumulated[layer] = grads
            return
        if self.scaled and not self._unscaled(layer, task.iteration, grads):
            return  # rank 0 skipped the step (an overflow): so does every worker
        scale_lr([self.optimizers[layer]], task.lr_factor)
        self._conclude(layer, grads)

    def _unscaled(self, layer: int, iteration: int, grads: List[torch.Tensor]) -> bool:
        """Apply rank 0's loss-scaling decision of an iteration to a layer's gradients; return whether to step."""
        if iteration not in self.decisions:
            raise RuntimeError(f"worker {self.j}: layer {layer}'s update of iteration {iteration} has no loss-scaling "
                               "decision from rank 0")
        scale, taken = self.decisions[iteration]
        if not taken:
            return False
        unscale(grads, scale)
        if not finite(grads):
            # rank 0 checked the gradients it sent, from which these are computed in float32
            raise RuntimeError(f"worker {self.j}: the coded gradients of layer {layer} at iteration {iteration} "
                               f"overflow at loss scale {scale:g} although rank 0's did not; lower "
                               "train.loss_scale_power")
        return True

    def forget_decisions(self, before: int) -> None:
        """Drop the loss-scaling decisions of iterations before `before` (their updates are applied)."""
        for iteration in [i for i in self.decisions if i < before]:
            del self.decisions[iteration]

    def _conclude(self, layer: int, grads: List[torch.Tensor]) -> None:
        """Step the layer with its gradients."""
        self._step(layer, grads)

    def _finish(self, layer: int) -> None:
        """Take the steps still owed to a layer: none, each was taken when its update was applied."""

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
                buf = momentum_of(opt, t)
                out += [t, torch.zeros_like(t) if buf is None else buf]
        return out


class SummingEncodingWorker(EncodingWorker):
    """Worker j of one of several groups: sums each coded gradient with the holders of packet j in the
    other groups before the step (the sum of the groups' coded gradients is the coded image of the
    whole batch's gradient).

    A layer's sum starts when its update is applied; the step waits for the sum until the layer's
    weights are next needed (its next forward). Every holder of packet j starts its sums in the same
    order: ascending layers within `settle`, the forward order.
    """

    def __init__(self, j: int, code: Code, codings: List[LayerCoding], weights: List[CodedWeights],
                 optim: OptimSettings, reduce: Reduce) -> None:
        super().__init__(j, code, codings, weights, optim)
        self.reduce = reduce
        self.pending: Dict[int, Tuple[Callable[[], torch.Tensor], List[torch.Size]]] = {}

    def _unsettled(self) -> List[int]:
        return sorted(set(self.deferred) | set(self.pending))

    def _conclude(self, layer: int, grads: List[torch.Tensor]) -> None:
        """Start summing the layer's coded gradient with the other groups; the step waits for the sum."""
        self.pending[layer] = (self.reduce(pack(grads)), [g.shape for g in grads])

    def _finish(self, layer: int) -> None:
        """Wait for the layer's gradient sum, if one is in flight, and step with it."""
        if layer in self.pending:
            finish, shapes = self.pending.pop(layer)
            self._step(layer, unpack(finish(), shapes))


class DecodingServer:
    """Rank 0: runs the model with its coded convolutions computed by the workers, each decoded from k replies.

    The model runs in its own order with each coded Conv2d replaced by a remote convolution whose
    forward sends X and decodes Y from the first k replies and whose backward sends dY and decodes
    dX; everything else (BatchNorm, activations, pooling, residual additions, the head) runs here on
    the decoded tensors, so autograd keeps the model's structure. `group` is this server's place
    among the servers: its share of the loss, BatchNorm over the whole batch, the sum of gradients.
    """

    def __init__(self, model: nn.Module, code: Code, codings: List[LayerCoding], plan: CommandPlan,
                 optimizers: Sequence[Optional[torch.optim.Optimizer]], exchange: Exchange, group: Group,
                 precision: str = "fp32", scaler: Optional[LossScaler] = None) -> None:
        self.model = model
        self.precision = precision  # autocast of the layers rank 0 runs
        self.scaler = scaler or LossScaler()
        self.step_inf = False  # an output gradient sent in this optimizer step was not finite
        self.code = code
        self.codings = codings
        self.plan = plan
        # The optimizers of what rank 0 trains: the head, BatchNorm and (naive scheme) the conv layers.
        self.optimizers = [opt for opt in optimizers if opt is not None]
        self.exchange = exchange
        self.group = group
        self.decode_s = 0.0  # seconds spent decoding in the last step

    def step(self, x: torch.Tensor, y: torch.Tensor, first: bool = True, last: bool = True,
             share: float = 1.0) -> float:
        """Run one iteration on this server's batch (x, y); return the loss of the whole batch.

        With gradient accumulation an iteration is a micro-batch whose loss counts `share`: gradients
        start from zero at the `first` of an optimizer step and are summed and stepped after the `last`.
        """
        self.decode_s = 0.0
        if first:
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
            self.step_inf = False
        rounds = _Rounds(self)
        with remote_convs(self.model, self.plan.names, rounds), self.group.batchnorm(self.model):
            with autocast(self.precision, x.device):
                scores = self.model(x)  # the forward rounds, one per coded convolution, and the layers between
            loss = self.group.loss(scores, y)
            (loss * (share * self.scaler.factor)).backward()  # the backward rounds, in the plan's order
        rounds.finish()
        self.step_inf = self.step_inf or rounds.inf
        value = self.group.sum_gradients(self.optimizers if last else [], float(loss.detach()))
        if last:
            used = self.scaler.factor
            # The workers' updates come from the output gradients sent: an overflow there skips their step too.
            taken = step_scaled(self.scaler, self.optimizers, self.step_inf, agree=self.group.any)
            if self.scaler.enabled:
                self.exchange.conclude(used, taken)
        return value

    def timings(self) -> Dict[str, float]:
        """Return the seconds the last step spent decoding."""
        return {"decode_s": self.decode_s}

    def decode(self, coding: LayerCoding, replies: Dict[int, torch.Tensor], length: int) -> torch.Tensor:
        """Decode a layer's channels from the replies, timing it."""
        t0 = time.perf_counter()
        replies = {j: r.float() for j, r in replies.items()}  # replies in train.precision, decoded in float32
        out = coding.decode(self.code, replies, axis=1, length=length)
        self.decode_s += time.perf_counter() - t0
        TIMELINE.add("decode", f"decode layer {coding.index}", t0, time.perf_counter() - t0)
        return out


class _Rounds:
    """The session of one iteration: each remote convolution's call becomes a round, in the planned order."""

    def __init__(self, server: DecodingServer) -> None:
        self.server, self.exchange, self.plan = server, server.exchange, server.plan
        self.position = 0
        self.inf = False  # whether an output gradient sent was not finite (checked with loss scaling only)

    def expect(self, command: Command) -> None:
        """Check that the model calls its coded convolutions in the order the workers follow."""
        passes = self.plan.passes
        if self.position >= len(passes) or passes[self.position] != command:
            name = self.plan.names[command.layer]
            raise RuntimeError(f"model: convolution {name!r} ran its {command.phase.name.lower()} pass out of the "
                               "traced order; coded schemes need a forward pass without data-dependent control flow")
        self.position += 1

    def forward(self, index: int, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        self.expect(Command(Phase.FORWARD, index))
        coding = self.server.codings[index]
        x = x.detach().float()  # a layer before may have run in bf16: the workers take float32
        return self.server.decode(coding, self.exchange.forward(index, x), coding.out_channels)

    def backward(self, index: int, dy: torch.Tensor, want_input_grad: bool) -> Optional[torch.Tensor]:
        command = Command(Phase.BACKWARD, index)
        self.expect(command)
        want_reply = self.plan.wants_reply(command)
        if self.server.scaler.enabled:
            self.inf = self.inf or not finite([dy])
        replies = self.exchange.backward(index, dy.float(), want_reply)  # float32, as the forward's input
        if not want_reply:
            return None
        return self.server.decode(self.server.codings[index], replies, self.server.codings[index].in_channels)

    def finish(self) -> None:
        """Check that every planned round ran."""
        if self.position != len(self.plan.passes):
            raise RuntimeError(f"model: {len(self.plan.passes) - self.position} coded convolution passes of the "
                               "traced order did not run; coded schemes need a forward pass without data-dependent "
                               "control flow")
