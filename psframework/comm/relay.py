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
from typing import Any, Callable, List, Optional, Sequence

from .envelope import Envelope
from .errors import WatchdogTimeout
from .gather import FirstK
from .outbox import SendHandle
from .polling import DEFAULT
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
