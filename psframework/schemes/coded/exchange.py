"""The coded server's exchange over MPI, and the bytes it moves per iteration.

Each coded pass is one round with the group's workers: rank 0 sends each worker its payload (what the
dissemination delivers of the tensor, or a coded packet; the naive scheme adds coded weights) and,
where it decodes the pass's result, takes the first k replies.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from psframework.comm.envelope import Phase
from psframework.comm.links import ServerLink
from psframework.comm.rounds import Msg
from psframework.comm.timeline import TIMELINE
from psframework.models import Placement
from psframework.schemes.coded.plan import Command, sample_shape
from psframework.schemes.coded.setup import CodedSetup
from psframework.schemes.groups import part_size
from psframework.schemes.recipe import compute_dtype
from psframework.settings import Settings


class Payloads(NamedTuple):
    """What each worker gets for a pass: its command's tensor and, or None, a second tensor (PARAMS)."""

    commands: Optional[List[torch.Tensor]]  # None: the pass needs no worker
    params: Optional[List[torch.Tensor]] = None


class MpiExchange:
    """The `core.Exchange` of an MPI server: one round per coded pass over the server's link.

    `payloads` is the scheme's choice of what each worker gets for a pass; the exchange times it
    (encode_s: the naive scheme's weight gradients included) along with the link's rounds.
    """

    def __init__(self, link: ServerLink, setup: CodedSetup,
                 payloads: Callable[[Command, torch.Tensor], Payloads]) -> None:
        self.link, self.setup, self.payloads = link, setup, payloads
        self.iteration, self.encode_s = 0, 0.0

    def begin(self, iteration: int) -> None:
        """Start an iteration: reset its counters."""
        self.iteration, self.encode_s = iteration, 0.0
        self.link.begin_iteration()

    def timings(self) -> Dict[str, float]:
        """Return the iteration's timed parts: the link's rounds and the encoding."""
        return {**self.link.clock.timings, "encode_s": self.encode_s}

    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        return self.round(Command(Phase.FORWARD, layer), x, want_reply=True)

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        return self.round(Command(Phase.BACKWARD, layer), dy, want_reply)

    def conclude(self, scale: float, taken: bool) -> None:
        """Send the workers that step their own weights the step's loss scale and whether it is taken."""
        if self.setup.distributed_encoding_and_updating:  # the workers step coded weights of their own
            self.link.send(torch.tensor([scale, float(taken)]), Msg.scale(self.iteration))

    def round(self, command: Command, x: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        """Send a pass's tensor to every worker; return the first k replies {packet index: reply}."""
        t0 = time.perf_counter()
        payloads = self.payloads(command, x)
        self.encode_s += time.perf_counter() - t0
        TIMELINE.add("encode", f"encode layer {command.layer} {command.phase.name.lower()}", t0,
                     time.perf_counter() - t0)
        if payloads.commands is None:
            return {}
        it, layer, phase = self.iteration, command.layer, command.phase
        gather = self.link.expect(Msg.reply(it, layer, phase)) if want_reply else None
        self.link.send(payloads.commands, Msg.command(it, layer, phase))
        if payloads.params is not None:
            self.link.send(payloads.params, Msg.params(it, layer, phase=phase))
        return {} if gather is None else self.link.collect(gather, self.setup.k).data


def expected_server_bytes(settings: Settings, model: nn.Module, placement: Placement,
                          group: int = 0) -> Tuple[int, int]:
    """Return the payload bytes a group's server sends to and receives from its workers per iteration of sazd,
    poly or uncoded: (sent, received). With several groups a server handles its part of the batch.

    Per coded convolution: the input to every worker (what the dissemination delivers of it) and every
    worker's row-coded output; backward, the output gradient to every worker (a layer without a column
    copy: worker j's own packet of it) and every worker's column-coded input gradient. Every reply is
    counted, also those that come after the first k (they are received, then dropped). Replies are
    computed and sent in `train.precision` (2 bytes a value in bf16 and fp16); the rest in float32.
    """
    setup = CodedSetup.of(settings, model)
    code, dissemination = setup.code, setup.dissemination
    n, batch = code.n, part_size(settings.data.batch_size, group, settings.run.servers)
    sent = received = 0
    for c, conv in zip(setup.codings, setup.placement.coded):
        x, y = sample_shape(conv, Phase.FORWARD), sample_shape(conv, Phase.BACKWARD)
        rows = batch * c.packet_channels(code, c.out_channels) * y[1] * y[2]
        sent += n * dissemination.delivered(batch * math.prod(x))
        received += n * rows
        if c.has_column_copy:
            sent += n * dissemination.delivered(batch * math.prod(y))
            received += n * batch * c.packet_channels(code, c.in_channels) * x[1] * x[2]
        else:
            sent += n * rows
    return 4 * sent, compute_dtype(settings.optim.precision).itemsize * received
