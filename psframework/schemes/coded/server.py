"""Coded model-parallel training over MPI: `sazd` (DEU), `poly` and `uncoded`.

Rank 0 decodes every conv layer's output from the first k replies, applies BatchNorm/ReLU/pooling,
runs the FC head and decodes input gradients. Ranks 1..n hold packet j of each conv layer's row- and
column-coded weights and update them themselves (distributed encoding and updating). Both sides
follow the driver's plan, so a worker always knows which command comes next: it skips a reply once
the next command is already waiting (the server no longer needs it), but applies every update, in
order. The base classes here also carry the naive scheme (schemes/sazd_naive.py).
"""

from __future__ import annotations

import itertools
import time
from abc import abstractmethod
from typing import Any, Dict, List, Optional, Tuple

import torch

from psframework.comm.envelope import Kind, Phase
from psframework.comm.rounds import Msg
from psframework.runtime.stragglers import Stragglers
from psframework.schemes.coded_core import CodedServer, CodedWorker, decode_conv_state
from psframework.schemes.coded_layers import LayerCoding, encode_layer, layer_codings
from psframework.schemes.coded_parts import (BACKWARD, FORWARD, Dissemination, activation_shapes, code_of,
                                             conv_state_shapes, conv_state_tensors, flatten, rel_diff, unflatten,
                                             worker_state_shapes)
from psframework.schemes.common import Step, conv_optimizer, head_optimizer, placement_of
from psframework.schemes.groups import Group, part_size, start_sum
from psframework.schemes.driver import Event, Problem, Schedule, ServerSide, StepResult, SYNC, STOP, WorkerSide
from psframework.settings import Settings

Payloads = Tuple[Optional[List[torch.Tensor]], Optional[List[torch.Tensor]]]


def phase_of(kind: str) -> int:
    """Return the message phase of a forward or backward command."""
    return Phase.FORWARD if kind == FORWARD else Phase.BACKWARD


class CodedServerBase(ServerSide):
    """Rank 0 of a coded scheme: one round per conv layer and pass, decoded from the first k replies."""

    def __init__(self, settings: Settings, problem: Problem, link: Any = None, group: Optional[Group] = None) -> None:
        super().__init__(settings, problem, link, group)
        self.code = code_of(settings.code)
        self.n, self.k = self.code.n, self.code.k
        self.placement = placement_of(settings, self.model)
        self.codings = layer_codings(self.placement, self.k, settings.code.symbol_size)
        self.conv_modules = [dict(self.model.named_modules())[n] for n in self.placement.coded_names]
        self.dissemination = Dissemination(settings.transport.dissemination, settings.code)
        self.stragglers = Stragglers(settings.stragglers, link.job_workers)
        if settings.code.subsets == "rotate":
            link.rotate_subsets(self.k)
        link.require(self.k)
        self.optimizers = self.server_optimizers() + self.conv_optimizers()
        self.core = CodedServer(self.model, self.code, self.codings, self.placement, self.optimizers)
        self.iteration, self.encode_s = 0, 0.0

    def server_optimizers(self) -> List[torch.optim.Optimizer]:
        """Return the optimizers of what always trains on rank 0: the head and the uncoded trunk layers."""
        coded = self.placement.worker_parameter_names()
        head = [p for key, p in self.model.named_parameters() if key in self.placement.head]
        local = [p for key, p in self.model.named_parameters() if key not in coded and key not in self.placement.head]
        return ([head_optimizer(self.settings.optim, head)] if head else []) + \
            ([conv_optimizer(self.settings.optim, local, "sgd")] if local else [])

    def conv_optimizers(self) -> List[torch.optim.Optimizer]:
        """Return rank 0's optimizers of the coded convolutions (none where the workers update them)."""
        return []

    @abstractmethod
    def payloads(self, kind: str, layer: int, x: torch.Tensor) -> Payloads:
        """Return what each worker gets for a command, and a second tensor per worker or None."""

    def describe(self) -> str:
        return f", {self.code!r}, dissemination {self.settings.transport.dissemination}"

    def step(self, step: Step) -> StepResult:
        self.iteration, self.encode_s, self.core.decode_s = step.iteration, 0.0, 0.0
        self.link.begin_iteration()
        if self.group is not None:
            self.group.begin(len(step.indices))
        loss = self.core.step(*self.problem.dataset.train.fetch(self.batch_indices(step)), self, self.group)
        timings = {**self.link.clock.timings, "encode_s": self.encode_s, "decode_s": self.core.decode_s}
        delays = {str(r): f for r, f in self.stragglers.factors(step.iteration).items() if f}
        return StepResult(loss, timings, {**self.link.iteration_fields(), **self.group.fields(),
                                          "straggler_delays": delays})

    # The exchange CodedServer.step drives: one round per conv layer and pass.
    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        return self.exchange(FORWARD, layer, x, want_reply=True)

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        return self.exchange(BACKWARD, layer, dy, want_reply)

    def exchange(self, kind: str, layer: int, x: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        """Send a layer's tensor to every worker; return the first k replies {packet index: reply}."""
        t0 = time.perf_counter()
        payloads, extra = self.payloads(kind, layer, x)
        self.encode_s += time.perf_counter() - t0
        if payloads is None:
            return {}
        it, phase = self.iteration, phase_of(kind)
        gather = self.link.expect(Msg.reply(it, layer, phase)) if want_reply else None
        self.link.send(payloads, Msg.command(it, layer, phase))
        if extra is not None:
            self.link.send(extra, Msg.params(it, layer, phase=phase))
        return {} if gather is None else self.link.collect(gather, self.k).data


class CodedServerSide(CodedServerBase):
    """Rank 0 of `sazd`, `poly` and `uncoded` (DEU): the workers hold and update the coded weights."""

    def __init__(self, settings: Settings, problem: Problem, link: Any = None, group: Optional[Group] = None) -> None:
        super().__init__(settings, problem, link, group)
        self.momentum: Optional[List[Dict[str, torch.Tensor]]] = None
        self.verify_max = 0.0

    def payloads(self, kind: str, layer: int, x: torch.Tensor) -> Payloads:
        coding = self.codings[layer]
        if kind == BACKWARD and not coding.has_column_copy:
            # Worker j only needs SA_j(dY) to update a layer without a column copy: send just that.
            return [p.contiguous() for p in coding.encode(self.code, x, 1)], None
        return self.dissemination.packets(x), None

    def start(self, schedule: Schedule) -> None:
        """Send every worker the uncoded conv state; each encodes its own packets (DEU)."""
        self.link.send(self.conv_state(), Msg.params(schedule.start))

    def conv_state(self) -> torch.Tensor:
        """Return the uncoded weights and momentum of the coded convolutions as one flat vector."""
        return flatten(conv_state_tensors(self.model, self.placement.coded_names, self.momentum))

    def sync(self, iteration: int, verify: bool) -> Dict[str, Any]:
        """Decode the conv weights (and momentum) from k workers' state into rank 0's model."""
        verify = verify and len(self.link.live) > self.k
        states = self.link.round(torch.zeros(1), Msg.state(iteration), Msg.state_reply(iteration),
                                 self.k + 1 if verify else self.k, rotate=False)
        return self.load_worker_states(states, verify)

    def readmission_state(self, index: int, iteration: int) -> Any:
        """Decode the current conv state from k live workers; return it uncoded (the worker encodes its packets)."""
        states = self.link.round(torch.zeros(1), Msg.snapshot(iteration), Msg.snapshot_reply(iteration), self.k,
                                 rotate=False)
        self.load_worker_states(states, verify=False)
        return self.conv_state()

    def load_worker_states(self, states: Any, verify: bool) -> Dict[str, Any]:
        """Decode the conv weights and momentum from the replies into rank 0's model; verify if asked."""
        shapes = worker_state_shapes(self.codings, self.code)
        per_worker = {j: unflatten(s, shapes) for j, s in states.data.items()}
        layers = decode_conv_state(self.code, self.codings, dict(itertools.islice(per_worker.items(), self.k)))
        with torch.no_grad():
            for conv, layer in zip(self.conv_modules, layers):
                conv.weight.copy_(layer["weight"])
                if conv.bias is not None:
                    conv.bias.copy_(layer["bias"])
        self.momentum = [{key: None if layer[key] is None else layer[key].clone()
                          for key in ("weight_momentum", "bias_momentum")} for layer in layers]
        if not verify:
            return {}
        diff = self.verify(per_worker, layers)
        self.verify_max = max(self.verify_max, diff)
        return {"verify_max_rel_diff": diff}

    def verify(self, per_worker: Dict[int, List[torch.Tensor]], layers: List[Dict[str, torch.Tensor]]) -> float:
        """Decode from a second k-subset and return the largest relative difference (row and column copies too)."""
        again = decode_conv_state(self.code, self.codings, dict(itertools.islice(per_worker.items(), 1, self.k + 1)))
        diffs = [rel_diff(a[key], b[key]) for a, b in zip(layers, again) for key in ("weight", "bias")
                 if a[key] is not None]
        diffs += [rel_diff(a["col_weight"], a["weight"]) for a in layers if a["col_weight"] is not None]
        return max(diffs)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "conv_momentum": self.momentum}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.momentum = state["conv_momentum"]

    def finish(self) -> Dict[str, Any]:
        verified = self.verify_max if self.settings.run.verify_every else None
        return {"code": repr(self.code), "dissemination": self.settings.transport.dissemination,
                "verify_max_rel_diff": verified}


class CodedWorkerBase(WorkerSide):
    """Worker j of a coded scheme: answers forward and backward commands, layer by layer."""

    def __init__(self, settings: Settings, link: Any) -> None:
        super().__init__(settings, link)
        self.code = code_of(settings.code)
        self.j, self.k = link.index, self.code.k
        self.placement = placement_of(settings)
        self.codings = layer_codings(self.placement, self.k, settings.code.symbol_size)
        roles = link.roles
        self.shapes = activation_shapes(self.placement, part_size(settings.data.batch_size, roles.group, roles.groups))
        self.dissemination = Dissemination(settings.transport.dissemination, settings.code)
        self.stragglers = Stragglers(settings.stragglers, link.job_workers)
        self.order = self.command_order()
        self.schedule: Optional[Schedule] = None
        if self.dissemination.relayed:
            link.relayed, link.relay_first = self.relays, self.k - 1

    def command_order(self) -> List[Tuple[str, int]]:
        """Return the (kind, layer) commands of every iteration, in the order the server sends them."""
        backward = [layer for layer in self.placement.backward_order if self.gets_backward(self.codings[layer])]
        return [(FORWARD, layer) for layer in range(len(self.codings))] + [(BACKWARD, layer) for layer in backward]

    def gets_backward(self, coding: LayerCoding) -> bool:
        """Return whether the server sends this worker a layer's backward command (DEU: always, to update)."""
        return True

    def opening(self, event: Event) -> Any:
        """Return the envelope of the first server message of a plan event."""
        if event.kind == SYNC:
            return Msg.state(event.iteration)
        if event.kind == STOP:
            return Msg.stop(event.iteration)
        kind, layer = self.order[0]
        return Msg.command(event.iteration, layer, phase_of(kind))

    def start(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def step(self, step: Step, after: Event) -> None:
        it = step.iteration
        following = [Msg.command(it, layer, phase_of(kind)) for kind, layer in self.order[1:]] + [self.opening(after)]
        for (kind, layer), nxt in zip(self.order, following):
            self.command(it, kind, layer, nxt)

    def command(self, iteration: int, kind: str, layer: int, nxt: Any) -> None:
        """Answer one command: compute and reply unless the next command already waits; queue its update."""
        self.link.progress()  # let peers' late packets drain and this worker's sends finish
        self.use_spare_time(iteration, kind, layer)
        x = self.receive(iteration, kind, layer)
        want = kind == FORWARD or self.codings[layer].has_column_copy
        stale = want and self.link.has(nxt)
        t0 = time.perf_counter()
        out = self.compute(iteration, kind, layer, x, reply=not stale)
        compute_s = time.perf_counter() - t0
        report = self.link.report
        report.add("delay_s", self.delay(iteration, compute_s))
        if out is not None:
            # The reply leaves while this worker polls (for the next command, say): no need to wait here.
            self.link.reply(out.contiguous(), Msg.reply(iteration, layer, phase_of(kind)), wait=False)
        elif want:
            report.skipped()
        if self.dissemination.relayed:  # the later peers' copies go after the reply, off its path
            self.link.relay_rest(Msg.shard(iteration, layer, phase_of(kind)))
        self.after_reply(iteration, kind, layer, x)
        report.add("compute_s", compute_s)

    def use_spare_time(self, iteration: int, kind: str, layer: int) -> None:
        """Until a forward command arrives, do the deferred work it will need (`spare_work`), piece by piece.

        Deferred work waits for the forward command that needs it: in the backward pass the server
        waits for one reply after another with little work of its own in between, so work done there
        would delay the next reply; while the server decodes a layer and applies the layers it keeps,
        a worker prepares the next one. Once the command is in, the rest is done when it is computed.
        """
        envelope = Msg.command(iteration, layer, phase_of(kind))
        if kind != FORWARD:
            return
        while not self.link.has(envelope):
            self.link.let_sends_go(envelope)
            t0 = time.perf_counter()
            more = self.spare_work(layer)
            work_s = time.perf_counter() - t0
            self.link.report.add("compute_s", work_s)
            self.link.report.add("delay_s", self.delay(iteration, work_s))  # a straggler is slow at all its work
            if not more:
                return

    def spare_work(self, layer: int) -> bool:
        """Do a piece of the deferred work a layer's forward command needs; return whether more is left."""
        return False

    def delay(self, iteration: int, compute_s: float) -> float:
        """Sleep as an injected straggler would; return the delay."""
        from psframework.runtime.node import straggle

        return straggle(self.stragglers, self.link.rank, iteration, compute_s, [self.link.progress])

    def coded_packet(self, kind: str, layer: int) -> bool:
        """Return whether the server sends this worker its own coded packet (not the whole tensor)."""
        return False

    def relays(self, envelope: Any) -> bool:
        """Return whether a server message is a relayed packet, to be sent on to the other workers."""
        kind = FORWARD if envelope.phase == Phase.FORWARD else BACKWARD
        return envelope.kind == Kind.COMMAND and not self.coded_packet(kind, envelope.layer)

    def receive(self, iteration: int, kind: str, layer: int) -> torch.Tensor:
        """Receive a layer's input (forward) or output gradient (backward), directly or relayed."""
        phase = phase_of(kind)
        data = self.link.take(Msg.command(iteration, layer, phase))
        if not self.dissemination.relayed or self.coded_packet(kind, layer):
            return data
        shards = self.link.exchange(data, Msg.shard(iteration, layer, phase), self.k,
                                    stopped_after=2 * self.settings.transport.detach_after)
        packets = {j: shards.received.data[j] for j in shards.received.arrived[:self.k]}
        # The packets sent to peers stay alive in their send handles: no need to wait for them here.
        return self.dissemination.restore(packets, self.shapes[(kind, layer)], torch.float32)

    @abstractmethod
    def compute(self, iteration: int, kind: str, layer: int, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        """Return the reply to a command (None when skipped)."""

    def after_reply(self, iteration: int, kind: str, layer: int, x: torch.Tensor) -> None:
        """Do what a command asks after its reply has left: nothing by default (DEU workers update here)."""


class CodedWorkerSide(CodedWorkerBase):
    """Worker j of `sazd`, `poly` and `uncoded` (DEU): holds and updates its coded weights."""

    with_syncs = True

    def start(self, schedule: Schedule) -> None:
        """Encode this worker's packets of the uncoded conv state the server sent (weights, momentum)."""
        super().start(schedule)
        self.readmitted(self.link.take(Msg.params(schedule.start)))
        self.link.snapshot = lambda: flatten(self.worker.state())

    def readmitted(self, flat: torch.Tensor) -> None:
        """Encode this worker's packets of an uncoded conv state (weights and momentum, flattened)."""
        state = iter(unflatten(flat, conv_state_shapes(self.codings)))
        o = self.settings.optim
        weights, buffers = [], []
        for coding in self.codings:
            w, b = next(state), next(state) if coding.has_bias else None
            mw, mb = next(state), next(state) if coding.has_bias else None
            weights.append(encode_layer(coding, self.code, w, b, self.j)[0])
            buffers.append(encode_layer(coding, self.code, mw, mb, self.j)[0])
        reduce = None if self.link.across is None else self.packet_sum
        self.worker = CodedWorker(self.j, self.code, self.codings, weights, o.lr, o.momentum, o.nesterov,
                                  o.weight_decay, reduce)
        if o.momentum > 0:
            for opt, w, m in zip(self.worker.optimizers, weights, buffers):
                for tensor, buf in zip(w.tensors(), m.tensors()):
                    opt.state[tensor]["momentum_buffer"] = buf.clone()

    def packet_sum(self, grads: torch.Tensor) -> Any:
        """Start summing a coded gradient with the workers of this packet in the other groups."""
        return start_sum(self.link.across, grads, f"the coded gradient sum of packet {self.j}", self.link.progress)

    def close(self) -> None:
        """Apply the updates whose sums are still in flight (no collective may outlive the run)."""
        self.worker.settle()

    def sync(self, iteration: int) -> None:
        """Send the server this worker's coded tensors and momentum."""
        self.link.take(Msg.state(iteration))
        self.link.send(flatten(self.worker.state()), Msg.state_reply(iteration))

    def coded_packet(self, kind: str, layer: int) -> bool:
        return kind == BACKWARD and not self.codings[layer].has_column_copy

    def compute(self, iteration: int, kind: str, layer: int, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        with self.link.busy():
            if kind == FORWARD:
                return self.worker.on_forward(layer, x, reply=reply)
            return self.worker.on_backward(layer, x, reply=reply)

    def after_reply(self, iteration: int, kind: str, layer: int, x: torch.Tensor) -> None:
        """Queue a backward command's update (every one, in order, even when the reply was skipped)."""
        if kind != BACKWARD:
            return
        self.worker.update(layer, x, coded=self.coded_packet(kind, layer), lr_factor=self.schedule.lr_factor(iteration))
        self.link.report.add("updates", 1)

    def spare_work(self, layer: int) -> bool:
        """Compute a piece of the layer's queued update before its forward command arrives."""
        if not self.worker.has_update(layer):
            return False
        with self.link.busy():
            return self.worker.work(layer)
