"""Point-to-point shard exchange among workers: the transport of the relay dissemination.

Worker j holds packet j (received from the server), sends it to every other worker and receives
theirs until it has k packets, counting its own: with a straggler-tolerant code any k suffice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional

from .envelope import Envelope
from .transport import DEFAULT, FirstK, SendHandle, Transport


@dataclass
class ShardExchange:
    """The packets received (own packet included) and the sends still leaving."""

    received: FirstK
    sends: List[SendHandle]

    def wait_sends(self, timeout_s: Any = DEFAULT) -> None:
        """Block until every peer has been sent the packet; only then may it be modified."""
        for handle in self.sends:
            handle.wait(timeout_s)


def exchange_shards(transport: Transport, packet: Any, envelope: Envelope, out: Mapping[int, Any],
                    k: Optional[int] = None, *, timeout_s: Any = DEFAULT,
                    interrupt: Optional[Callable[[], None]] = None) -> ShardExchange:
    """Send `packet` to every other rank of the transport and wait for k packets, own one included.

    `out` maps every other rank to a receive buffer shaped like its packet. Receives are posted
    before any send. Returns when k packets are in (all by default): `received.arrived` starts with
    this rank, then the peers in arrival order; peers not in it are drained later by the transport.
    `interrupt` is called while waiting and may raise to end the wait.
    """
    me, n = transport.rank, transport.size
    k = n if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k: got {k!r}, expected an integer in 1..{n} (packets needed, own one included)")
    peers = [(me + i) % n for i in range(1, n)]  # rotated, so that not every rank sends to rank 0 first
    extra = sorted(set(out) - set(peers))
    if extra:
        raise ValueError(f"out: got buffers for rank(s) {extra}, expected only peer ranks {sorted(peers)}")
    if not peers:
        return ShardExchange(FirstK(envelope, k, [me], 0.0, {me: packet}, []), [])
    gather = transport.post_gather(sorted(peers), envelope, out)
    sends = [transport.isend(peer, packet, envelope) for peer in peers]
    if k == 1:
        gather.release()
        first = FirstK(envelope, 0, [], 0.0, {}, sorted(peers))
    else:
        first = gather.wait(k - 1, timeout_s=timeout_s, interrupt=interrupt)
    data = {me: packet}
    data.update(first.data)
    received = FirstK(envelope, k, [me] + first.arrived, first.wait_s, data, first.late)
    return ShardExchange(received, sends)
