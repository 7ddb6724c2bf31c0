"""How rank 0 delivers a pass's tensor to every worker: the two dissemination strategies of `comm.dissemination`.

Direct: a copy to each worker. Relay: SA-coded packets of the tensor's bits, one to each worker, which
the workers exchange among themselves until each has k and restores the tensor bit-exactly
(docs/design.md#relay-dissemination). The topology picks one (`dissemination_of`) and gives it to the
coded sides; they call it the same way whichever it is.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Protocol, Sequence

import torch

from psframework.codes import BlockLayout, SAZDCode, from_bits, split_blocks, to_bits, wide_layout
from psframework.comm.envelope import Envelope
from psframework.comm.links import WorkerLink
from psframework.comm.rounds import Msg
from psframework.settings import CodeSettings, Settings

Shape = Sequence[int]


class Dissemination(Protocol):
    """What rank 0 sends each worker for a pass's tensor, and how a worker gets the whole tensor back."""

    mode: str  # its name in comm.dissemination
    peers: bool  # whether the workers need a transport among themselves

    def packets(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Return what the server sends to each worker for tensor `x`."""

    def delivered(self, numel: int) -> int:
        """Return how many elements the server sends each worker for a tensor of `numel` elements."""

    def attach(self, link: WorkerLink, whole: Callable[[Envelope], bool]) -> None:
        """Prepare a worker's link; `whole` tells the server messages that carry a whole tensor for every worker."""

    def receive(self, link: WorkerLink, data: torch.Tensor, envelope: Envelope, shape: Shape) -> torch.Tensor:
        """Return the whole tensor of a server message `envelope` whose data this worker took."""

    def after_reply(self, link: WorkerLink, envelope: Envelope) -> None:
        """Do what is left of a server message's delivery once this worker's reply has left."""


def copies(x: torch.Tensor, n: int) -> List[torch.Tensor]:
    """Return `x` for each of n workers, as a contiguous copy.

    Sends may complete, or even start, after the model has moved on, and autograd reuses gradient
    buffers in place (a residual connection adds into them): what is sent must be a copy.
    """
    return [x.detach().clone(memory_format=torch.contiguous_format)] * n


class DirectDissemination:
    """Send every worker a copy of the tensor."""

    mode = "direct"
    peers = False

    def __init__(self, n: int) -> None:
        self.n = n

    def packets(self, x: torch.Tensor) -> List[torch.Tensor]:
        return copies(x, self.n)

    def delivered(self, numel: int) -> int:
        return numel

    def attach(self, link: WorkerLink, whole: Callable[[Envelope], bool]) -> None:
        """Nothing to prepare: every server message is whole."""

    def receive(self, link: WorkerLink, data: torch.Tensor, envelope: Envelope, shape: Shape) -> torch.Tensor:
        return data

    def after_reply(self, link: WorkerLink, envelope: Envelope) -> None:
        """Nothing is left: the server sent the whole tensor."""


class RelayDissemination:
    """Send worker j packet j of the tensor's SA-coded bits; the workers relay packets until each has k.

    The bits are coded as one flat vector cut into the widest symbols the code allows
    (codes.wide_layout): decoding then takes a few array calls per packet whatever the tensor's size,
    and none beyond k copies when the systematic packets arrive. Relay codes raw bits with wrap-around
    arithmetic, which only SA codes do bit-exactly, so it uses an SA code whatever `code.kind` is.
    A worker sends its packet on to k - 1 peers as soon as it arrives and to the others after its reply.
    """

    mode = "relay"
    peers = True

    def __init__(self, code: CodeSettings, stopped_after: int = 4) -> None:
        self.code = SAZDCode(code.n, code.k, systematic=code.systematic)
        # A peer silent for this many of a worker's iterations has stopped: its kept-back packets go.
        self.stopped_after = stopped_after

    @property
    def k(self) -> int:
        return self.code.k

    def layout(self, numel: int) -> BlockLayout:
        """Return how a tensor of `numel` elements is cut into blocks and symbols."""
        return wide_layout(numel, self.k, self.code.padding)

    def packets(self, x: torch.Tensor) -> List[torch.Tensor]:
        bits = to_bits(x.detach().contiguous()).reshape(-1)
        size = self.layout(bits.numel()).symbol_size
        return self.code.encode(split_blocks(bits, self.k, symbol_size=size), axis=0, symbol_size=size)

    def delivered(self, numel: int) -> int:
        layout = self.layout(numel)
        return self.code.packet_length(layout.block_length, layout.symbol_size)

    def restore(self, packets: Dict[int, torch.Tensor], shape: Shape, dtype: torch.dtype) -> torch.Tensor:
        """Decode the tensor bit-exactly from k packets."""
        numel = math.prod(shape)
        size = self.layout(numel).symbol_size
        bits = self.code.decode_joined(packets, axis=0, symbol_size=size, length=numel)
        return from_bits(bits.contiguous(), dtype).reshape(shape)

    def attach(self, link: WorkerLink, whole: Callable[[Envelope], bool]) -> None:
        """Relay the whole-tensor messages' packets to k - 1 peers as soon as they arrive."""
        link.relay_on_arrival(whole, self.k - 1)

    def receive(self, link: WorkerLink, data: torch.Tensor, envelope: Envelope, shape: Shape) -> torch.Tensor:
        """Gather k packets from the peers (this worker's `data` included) and restore the tensor."""
        relayed = link.relay_packets(data, packet_envelope(envelope), self.k, stopped_after=self.stopped_after)
        packets = {j: relayed.received.data[j] for j in relayed.received.arrived[:self.k]}
        # The packets sent to peers stay alive in their send handles: no need to wait for them here.
        return self.restore(packets, shape, torch.float32)

    def after_reply(self, link: WorkerLink, envelope: Envelope) -> None:
        """Send the packet on to the peers it has not gone to yet, off the reply's path."""
        link.relay_rest(packet_envelope(envelope))


def packet_envelope(envelope: Envelope) -> Envelope:
    """Return the envelope of the packets the workers exchange for a server message."""
    return Msg.packet(envelope.iteration, envelope.layer, envelope.phase)


def dissemination_of(settings: Settings) -> Dissemination:
    """Return the dissemination `comm.dissemination` names, for a coded scheme's sides."""
    if settings.transport.dissemination == "relay":
        # The server detaches a worker silent for detach_after iterations: after twice as long it is gone.
        return RelayDissemination(settings.code, stopped_after=2 * settings.transport.detach_after)
    return DirectDissemination(settings.code.n)
