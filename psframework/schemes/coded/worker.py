"""The worker side of coded model-parallel training over MPI: `sazd`, `poly` and `uncoded`.

Worker j holds packet j of each conv layer's row- and column-coded weights and updates them itself
(distributed encoding and updating). It follows the driver's plan and the command plan (plan.py), as
rank 0 does (server.py), so it always knows which command comes next: it skips a reply once the next
command is already waiting (the server no longer needs it), but applies every update, in order.
The base class here also carries the naive scheme (naive.py).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Any, List, Optional

import torch

from psframework.comm.envelope import Envelope, Kind, Phase
from psframework.comm.links import WorkerLink
from psframework.comm.rounds import Msg
from psframework.comm.timeline import TIMELINE
from psframework.runtime.stragglers import Stragglers
from psframework.schemes.coded.core import EncodingWorker, SummingEncodingWorker
from psframework.schemes.coded.dissemination import Dissemination
from psframework.schemes.coded.plan import Command
from psframework.schemes.coded.setup import CodedSetup
from psframework.schemes.common import Step, meta_model
from psframework.schemes.driver import Event, Schedule, SYNC, STOP, WorkerSide
from psframework.schemes.groups import part_size, start_sum
from psframework.schemes.vectors import pack
from psframework.settings import Settings


def command_envelope(iteration: int, command: Command) -> Envelope:
    """Return the envelope of a command of the plan."""
    return Msg.command(iteration, command.layer, command.phase)


class CommandWorkerBase(WorkerSide):
    """Worker j of a coded scheme: answers the plan's commands, layer by layer and pass by pass."""

    # As the server's: this worker updates its coded weights in every backward pass.
    distributed_encoding_and_updating = True

    def __init__(self, settings: Settings, link: WorkerLink, dissemination: Optional[Dissemination] = None) -> None:
        super().__init__(settings, link)
        self.j = link.index
        self.setup = CodedSetup.of(settings, meta_model(settings), self.distributed_encoding_and_updating,
                                   dissemination)
        self.batch = part_size(settings.data.batch_size, link.roles.group, link.roles.groups)
        self.stragglers = Stragglers(settings.stragglers, link.job_workers)
        self.schedule: Optional[Schedule] = None
        self.setup.dissemination.attach(link, self.whole)

    def opening(self, event: Event) -> Envelope:
        """Return the envelope of the first server message of a plan event."""
        if event.kind == SYNC:
            return Msg.state(event.iteration)
        if event.kind == STOP:
            return Msg.stop(event.iteration)
        return command_envelope(event.iteration, self.setup.plan.commands[0])

    def start(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def step(self, step: Step, after: Event) -> None:
        it, commands = step.iteration, self.setup.plan.commands
        following = [command_envelope(it, c) for c in commands[1:]] + [self.opening(after)]
        for command, nxt in zip(commands, following):
            self.command(it, command, nxt)

    def command(self, iteration: int, command: Command, nxt: Envelope) -> None:
        """Answer one command: compute and reply unless the next command already waits; queue its update."""
        self.link.progress()  # let peers' late packets drain and this worker's sends finish
        self.use_spare_time(iteration, command)
        x = self.receive(iteration, command)
        want = self.setup.plan.wants_reply(command)
        stale = want and self.link.has(nxt)
        t0 = time.perf_counter()
        out = self.compute(iteration, command, x, reply=not stale)
        compute_s = time.perf_counter() - t0
        TIMELINE.add("compute", f"layer {command.layer} {command.phase.name.lower()}", t0, compute_s)
        report = self.link.report
        report.add("delay_s", self.delay(iteration, compute_s))
        if out is not None:
            # The reply leaves while this worker polls (for the next command, say): no need to wait here.
            self.link.reply(out.contiguous(), Msg.reply(iteration, command.layer, command.phase), wait=False)
        elif want:
            report.skipped()
        if not self.coded_packet(command):
            self.setup.dissemination.after_reply(self.link, command_envelope(iteration, command))
        self.after_reply(iteration, command, x)
        report.add("compute_s", compute_s)

    def use_spare_time(self, iteration: int, command: Command) -> None:
        """Until a forward command arrives, do the deferred work it will need (`spare_work`), piece by piece.

        Deferred work waits for the forward command that needs it: in the backward pass the server
        waits for one reply after another with little work of its own in between, so work done there
        would delay the next reply; while the server decodes a layer and applies the layers it keeps,
        a worker prepares the next one. Once the command is in, the rest is done when it is computed.
        """
        if command.phase != Phase.FORWARD:
            return
        envelope = command_envelope(iteration, command)
        while not self.link.has(envelope):
            self.link.let_sends_go(envelope)
            t0 = time.perf_counter()
            more = self.spare_work(command.layer)
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

    def coded_packet(self, command: Command) -> bool:
        """Return whether the server sends this worker its own coded packet (not the whole tensor)."""
        return False

    def whole(self, envelope: Envelope) -> bool:
        """Return whether a server message carries a whole tensor for every worker (the dissemination's)."""
        return envelope.kind == Kind.COMMAND and not self.coded_packet(Command(Phase(envelope.phase), envelope.layer))

    def receive(self, iteration: int, command: Command) -> torch.Tensor:
        """Receive a layer's input (forward) or output gradient (backward), as the dissemination delivers it."""
        envelope = command_envelope(iteration, command)
        data = self.link.take(envelope)
        if self.coded_packet(command):
            return data
        return self.setup.dissemination.receive(self.link, data, envelope, self.setup.plan.shape(command, self.batch))

    @abstractmethod
    def compute(self, iteration: int, command: Command, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        """Return the reply to a command (None when skipped)."""

    def after_reply(self, iteration: int, command: Command, x: torch.Tensor) -> None:
        """Do what a command asks after its reply has left: nothing by default (DEU workers update here)."""


class EncodingWorkerSide(CommandWorkerBase):
    """Worker j of `sazd`, `poly` and `uncoded`: encodes its packets of the conv state and updates them.

    With loss scaling rank 0 decides after each optimizer step whether it is taken (Msg.scale); the
    worker takes the decisions at the next iteration's start (before any update of that step is
    applied), before a synchronisation and at the end.
    """

    with_syncs = True
    awaiting: List[int]  # loss scaling: iterations whose decision is still to take

    def start(self, schedule: Schedule) -> None:
        """Encode this worker's packets of the uncoded conv state the server sent (weights, momentum)."""
        super().start(schedule)
        self.readmitted(self.link.take(Msg.params(schedule.start)))
        self.link.serve_snapshots(lambda: pack(self.worker.state()))

    def readmitted(self, state: torch.Tensor) -> None:
        """Encode this worker's packets of an uncoded conv state (weights and momentum, flattened)."""
        self.worker = self.new_worker(state)
        self.awaiting = []  # the updates that waited for them are gone with the old packets

    def take_decisions(self) -> None:
        """Take rank 0's loss-scaling decisions of the optimizer steps whose updates are still to apply."""
        for iteration in self.awaiting:
            scale, taken = self.link.take(Msg.scale(iteration)).tolist()
            self.worker.forget_decisions(before=iteration)
            self.worker.decisions[iteration] = (scale, taken > 0)
        self.awaiting = []

    def step(self, step: Step, after: Event) -> None:
        self.take_decisions()
        super().step(step, after)

    def new_worker(self, state: torch.Tensor) -> EncodingWorker:
        """Return the algorithm of this worker, holding its packets of an uncoded conv state."""
        return EncodingWorker.from_state(self.j, self.setup.code, self.setup.codings, state, self.settings.optim)

    def close(self) -> None:
        """Apply the updates still queued (or, with several groups, whose sums are in flight: no collective
        may outlive the run)."""
        self.take_decisions()
        self.worker.settle()

    def sync(self, iteration: int) -> None:
        """Send the server this worker's coded tensors and momentum."""
        self.link.take(Msg.state(iteration))
        self.take_decisions()
        self.link.send(pack(self.worker.state()), Msg.state_reply(iteration))

    def coded_packet(self, command: Command) -> bool:
        return command.phase == Phase.BACKWARD and not self.setup.codings[command.layer].has_column_copy

    def compute(self, iteration: int, command: Command, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        with self.link.busy():
            if command.phase == Phase.FORWARD:
                return self.worker.on_forward(command.layer, x, reply=reply)
            return self.worker.on_backward(command.layer, x, reply=reply)

    def after_reply(self, iteration: int, command: Command, x: torch.Tensor) -> None:
        """Queue a backward command's update (every one, in order, even when the reply was skipped)."""
        if command.phase != Phase.BACKWARD:
            return
        steps = self.schedule.ends_step(iteration)
        self.worker.update(command.layer, x, coded=self.coded_packet(command),
                           lr_factor=self.schedule.lr_factor(iteration), steps=steps, iteration=iteration)
        if steps and self.worker.scaled and iteration not in self.awaiting:
            self.awaiting.append(iteration)
        self.link.report.add("updates", 1)

    def spare_work(self, layer: int) -> bool:
        """Compute a piece of the layer's queued update before its forward command arrives."""
        if not self.worker.has_update(layer):
            return False
        with self.link.busy():
            return self.worker.work(layer)


class GroupEncodingWorkerSide(EncodingWorkerSide):
    """Worker j of one of several groups (`sazd`, `poly`, `uncoded` with several servers): sums its coded
    gradients with the workers of packet j in the other groups."""

    def new_worker(self, state: torch.Tensor) -> EncodingWorker:
        return SummingEncodingWorker.from_state(self.j, self.setup.code, self.setup.codings, state, self.settings.optim,
                                                reduce=self.packet_sum)

    def packet_sum(self, grads: torch.Tensor) -> Any:
        """Start summing a coded gradient with the workers of this packet in the other groups."""
        return start_sum(self.link.across, grads, f"the coded gradient sum of packet {self.j}", self.link.progress)
