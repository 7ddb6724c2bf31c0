"""Point-to-point packet relay among workers: the transport of the relay dissemination.

Worker j holds packet j (received from the server), sends it to the other workers and receives
theirs until it has k packets, counting its own: with a straggler-tolerant code any k suffice. It
may send to k - 1 peers first and to the others later (`send_packet` with `peers`): when every
worker does so in rotation, each gets the k - 1 packets it needs from the first sends, and the
later ones only stand in for a peer that is slow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .envelope import Envelope
from .errors import WatchdogTimeout
from .gather import FirstK
from .outbox import SendHandle
from .polling import DEFAULT
from .rounds import Msg
from .transport import Transport


def relay_order(rank: int, size: int) -> List[int]:
    """Return the peers a rank sends its packet to, in order: rotated, so that each is some rank's first."""
    return [(rank + i) % size for i in range(1, size)]


@dataclass
class RelayedPackets:
    """The packets received (own packet included) and the sends still leaving."""

    received: FirstK
    sends: List[SendHandle]


def send_packet(transport: Transport, packet: Any, envelope: Envelope,
                peers: Optional[Sequence[int]] = None) -> List[SendHandle]:
    """Start sending `packet` to `peers` (default: every other rank of the transport); return the sends.

    A worker may send a packet on as soon as it arrives, iterations ahead of the one it computes.
    """
    everyone = relay_order(transport.rank, transport.size)
    return [transport.isend(peer, packet, envelope) for peer in (everyone if peers is None else peers)]


def gather_packets(transport: Transport, packet: Any, envelope: Envelope, k: Optional[int] = None, *,
                   timeout_s: Any = DEFAULT, interrupt: Optional[Callable[[], None]] = None,
                   sends: Optional[List[SendHandle]] = None) -> RelayedPackets:
    """Send `packet` to every other rank of the transport and wait for k packets, own one included.

    `sends`: the packet has been sent already (send_packet, as soon as it arrived); only wait.
    Returns when k packets are in (all by default): `received.arrived` starts with this rank, then the
    peers in the order their packets were seen. Every peer's messages come through its mailbox, taken
    off the wire as they arrive whatever their iteration, so a peer that lags or skips ahead never
    leaves a paced sender waiting for acknowledgements; packets of earlier iterations are dropped.
    `interrupt` is called while waiting and may raise to end the wait.
    """
    me, n = transport.rank, transport.size
    k = n if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k: got {k!r}, expected an integer in 1..{n} (packets needed, own one included)")
    peers = relay_order(me, n)
    boxes = {peer: transport.mailbox(peer) for peer in peers}
    for box in boxes.values():  # packets of earlier iterations can no longer be needed
        box.discard(lambda e: e.iteration >= envelope.iteration)
    if sends is None:
        sends = send_packet(transport, packet, envelope)
    start = time.perf_counter()
    seen: List[int] = []

    def enough() -> bool:
        seen.extend(p for p in peers if p not in seen and boxes[p].holds(envelope))
        if interrupt is not None:
            interrupt()
        return len(seen) >= k - 1

    if not transport.wait_until(enough, timeout_s):
        raise WatchdogTimeout(transport.named([p for p in peers if p not in seen]), str(envelope),
                              transport.resolve_timeout(timeout_s), transport.named(seen), k - 1)
    wait_s = time.perf_counter() - start
    data = {me: packet}
    data.update({p: boxes[p].take(envelope) for p in seen})
    late = [p for p in peers if p not in seen]
    return RelayedPackets(FirstK(envelope, k, [me] + seen, wait_s, data, late), sends)


Key = Tuple[int, int, int]  # (iteration, layer, phase) of a relayed message


class PacketRelay:
    """A worker's relay of the server's packets to the other workers, over the workers' own transport.

    Which server messages are relayed is the scheme's choice (`choose`). Each is sent on to the first
    `first` peers in relay order as soon as a poll sees it, so that the peers never wait for this
    worker's computing, and to the others by `send_rest` (after this worker's reply, say).
    """

    def __init__(self, peers: Transport) -> None:
        self.peers = peers
        self.relayed: Optional[Callable[[Envelope], bool]] = None  # None: nothing is relayed yet
        self.first: Optional[int] = None  # None: every peer at once
        self._forwarded: Dict[Key, List[SendHandle]] = {}  # the sends of packets sent on already
        self._unsent: Dict[Key, Tuple[Any, List[int]]] = {}  # -> (packet, peers still to send it to)
        self._started: Dict[int, float] = {}  # when this worker began its recent iterations (time.monotonic)

    def choose(self, relayed: Callable[[Envelope], bool], first: Optional[int]) -> None:
        """Relay the server messages `relayed` accepts, to `first` peers on arrival (None: every peer)."""
        self.relayed, self.first = relayed, first

    def holding(self) -> bool:
        """Return whether a packet of this worker waits on its emulated link."""
        return self.peers.outbox.holding()

    def progress(self) -> None:
        """Move the packets to and from the peers that can move now."""
        self.peers.progress()

    def forward(self, arrived: Iterable[Tuple[Envelope, Any]]) -> None:
        """Send the first peers every relayed server message among `arrived` not sent on yet."""
        if self.relayed is None:
            return
        for got, data in arrived:
            key = (got.iteration, got.layer, got.phase)
            if key not in self._forwarded and self.relayed(got):
                self._forwarded[key] = self._send_first(key, data)

    def _send_first(self, key: Key, packet: Any) -> List[SendHandle]:
        """Send a packet to the first peers in relay order; keep the others for send_rest."""
        order = relay_order(self.peers.rank, self.peers.size)
        first = len(order) if self.first is None else self.first
        if order[first:]:
            self._unsent[key] = (packet, order[first:])
        return send_packet(self.peers, packet, Msg.packet(*key), order[:first])

    def send_rest(self, envelope: Envelope) -> None:
        """Send a relayed packet to the peers it has not gone to yet (they need it if a first sender is slow)."""
        key = (envelope.iteration, envelope.layer, envelope.phase)
        unsent = self._unsent.pop(key, None)
        if unsent is not None:
            send_packet(self.peers, unsent[0], Msg.packet(*key), unsent[1])

    def gather(self, packet: Any, envelope: Envelope, k: int, stopped_after: int, timeout_s: Optional[float],
               interrupt: Callable[[], None]) -> RelayedPackets:
        """Relay packets among the workers until k are in; see gather_packets.

        Then forget the packets kept back (flow control) that a peer can no longer need: those older
        than the latest iteration it has sent, and, once it has sent and acknowledged nothing for
        `stopped_after` of this worker's iterations, those older than this one (it has stopped, and the
        server, which detaches a worker silent for half as long, readmits it at a later iteration). A
        slow peer that still answers loses nothing.
        """
        iteration = envelope.iteration
        self._started.setdefault(iteration, time.monotonic())
        self._started.pop(iteration - stopped_after - 1, None)
        key = (iteration, envelope.layer, envelope.phase)
        sends = self._forwarded.pop(key, None)
        if sends is None:
            sends = self._send_first(key, packet)
        packets = gather_packets(self.peers, packet, envelope, k, timeout_s=timeout_s, interrupt=interrupt,
                                 sends=sends)
        since = self._started.get(iteration - stopped_after + 1)
        for peer in range(self.peers.size):
            if peer != self.peers.rank:
                stopped = since is not None and self.peers.outbox.heard_from(peer) < since
                self.peers.outbox.drop(peer, iteration if stopped else self.peers.mailbox(peer).newest)
        return packets

    def forget(self) -> None:
        """Drop every packet still to send or kept back: a detached worker's are stale."""
        for peer in range(self.peers.size):
            self.peers.outbox.drop(peer)
        self._forwarded.clear()
        self._unsent.clear()

    def finish(self, wait_until: Callable[[Callable[[], bool], Optional[float]], bool],
               timeout_s: Optional[float]) -> None:
        """Go on relaying until every other worker has finished too, then close the peers' transport.

        One that lags may still need packets this worker keeps back for it. A peer that the MPI reports
        dead counts as finished. `wait_until` is the server transport's, which keeps it moving meanwhile.
        """
        from mpi4py import MPI

        request = self.peers.comm.Ibarrier()

        def finished() -> bool:
            self.peers.progress()
            try:
                return bool(request.Test())
            except MPI.Exception:
                return True

        if not wait_until(finished, timeout_s):
            raise WatchdogTimeout(self.peers.named([p for p in range(self.peers.size) if p != self.peers.rank]),
                                  "the other workers to finish the run", timeout_s or 0.0)
        self.peers.close(timeout_s=1.0)
