"""Flow control: a bounded window of messages in flight per destination, the rest kept back.

An MPI keeps a message that its receiver has not yet taken in the sender's own resources, and these
are shared by every destination: MPICH's shared-memory transport, for one, gives each sender 64
message cells, and a receiver that makes no MPI calls (a frozen, descheduled or dead process) keeps
every cell it was sent until it wakes. Once they are all spent, messages to live ranks wait behind
them. A paced sender therefore posts at most `window` messages to a destination that the
destination has not acknowledged, and keeps the rest in its own memory, where they can be dropped.

Acknowledgements ride in every message header (the count of messages the sender has received from
the destination); a receiver that has nothing to send back tells a paced sender with a small credit
message on a communicator of its own, every `window // 2` messages. Every header and credit that
comes in also says that its sender runs (`heard`): a rank that falls behind while it still answers is
slow, one that neither sends nor acknowledges anything has stopped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

DEFAULT_WINDOW = 4  # messages in flight per destination: 2 MPI messages each (header and payload)


@dataclass
class Peer:
    """The flow state towards and from one rank."""

    posted: int = 0  # messages posted to it
    acked: int = 0  # messages it has said it received
    received: int = 0  # messages received from it
    told: int = 0  # the received count it was last told
    paces: bool = False  # it waits for acks from this rank
    queue: Deque[Any] = field(default_factory=deque)  # messages kept back, oldest first
    heard: float = field(default_factory=time.monotonic)  # when it last showed it runs: a message or a credit


class FlowControl:
    """Window, queues and acknowledgements of one transport; `post` puts a message on the wire."""

    def __init__(self, comm: Any, window: Optional[int], post: Callable[[Any], None],
                 failed: Callable[[int], None], ready: Callable[[Any], bool] = lambda handle: True) -> None:
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window: got {window!r}, expected a number of messages >= 1 or None (no pacing)")
        self.window = window
        self.ack_every = max(1, (window or 2) // 2)
        self._post = post
        self._ready = ready  # whether a message's bytes are in place (a staging copy may be in flight)
        self._failed = failed  # told of a rank whose credit traffic fails (it died)
        self._peers: Dict[int, Peer] = {}
        self._credits = comm.Dup()  # credit messages never meet the transport's own traffic
        # One credit receive per destination paced to, not one from any source: a receive from any
        # source could fail for every source once one rank dies.
        self._incoming: Dict[int, Tuple[Any, np.ndarray]] = {}
        self._status = MPI.Status()
        self._credit_sends: List[Tuple[Any, np.ndarray]] = []

    @property
    def paced(self) -> bool:
        """Return whether this side limits its messages in flight."""
        return self.window is not None

    def peer(self, rank: int) -> Peer:
        """Return the flow state of a rank."""
        state = self._peers.get(rank)
        if state is None:
            state = self._peers[rank] = Peer()
        return state

    def submit(self, dest: int, handle: Any, urgent: bool = False) -> bool:
        """Post a message now if it is ready and the window allows (or `urgent`), else keep it back.

        Return whether it was posted. Messages to one destination leave in the order submitted.
        """
        peer = self.peer(dest)
        if self._ready(handle) and (urgent or (not peer.queue and self._open(peer))):
            self._post(handle)
            return True
        peer.queue.append(handle)
        return False

    def _open(self, peer: Peer) -> bool:
        """Return whether the window towards a peer has room for one more message."""
        return self.window is None or peer.posted - peer.acked < self.window

    def _pump(self, peer: Peer) -> None:
        """Post kept-back messages, oldest first, while they are ready and the window has room."""
        while peer.queue and self._open(peer) and self._ready(peer.queue[0]):
            self._post(peer.queue.popleft())

    def posting(self, dest: int) -> None:
        """Count a message leaving the window for the wire (an emulated link may still hold it a while)."""
        self.peer(dest).posted += 1
        if self.paced and dest not in self._incoming:
            self._expect_credit(dest)

    def ack_words(self, dest: int) -> Tuple[int, bool]:
        """Return the (ack, paced) words of a header going on the wire now: what has come from `dest` so far.

        Set when the message really goes, so that an ack never waits on an emulated link behind it
        (credits tell the rest meanwhile)."""
        peer = self.peer(dest)
        peer.told = peer.received
        return peer.received, self.paced

    def _expect_credit(self, rank: int) -> None:
        buf = np.zeros(1, np.int64)
        self._incoming[rank] = (self._credits.Irecv([buf, MPI.INT64_T], rank, 0), buf)

    def received(self, source: int, ack: int, paces: bool) -> None:
        """Count a message header received from `source`, with the ack it carries."""
        peer = self.peer(source)
        peer.received += 1
        peer.heard = time.monotonic()
        peer.paces = peer.paces or paces
        self._acked(source, ack)
        if peer.paces and peer.received - peer.told >= self.ack_every:
            self._send_credit(source, peer)

    def poll(self) -> None:
        """Take in the credit messages that have arrived; post what their acks let go."""
        for rank, (request, buf) in list(self._incoming.items()):
            outcome = test_one(request, self._status)
            if outcome is None:
                del self._incoming[rank]
                self._failed(rank)
            if not outcome:
                continue
            ack = int(buf[0])
            self._expect_credit(rank)
            self.peer(rank).heard = time.monotonic()
            self._acked(rank, ack)
        if self._credit_sends:
            self._credit_sends = [(r, b) for r, b in self._credit_sends if not _done(r)]
        for peer in self._peers.values():
            if peer.queue:  # a staging copy may have completed since
                self._pump(peer)

    def _acked(self, rank: int, ack: int) -> None:
        peer = self.peer(rank)
        if ack > peer.acked:
            peer.acked = ack
        self._pump(peer)

    def _send_credit(self, rank: int, peer: Peer) -> None:
        buf = np.array([peer.received], np.int64)
        peer.told = peer.received
        self._credit_sends.append((self._credits.Isend([buf, MPI.INT64_T], rank, 0), buf))

    def backlog(self, dest: int) -> List[Any]:
        """Return the messages kept back for `dest`, oldest first."""
        return list(self.peer(dest).queue)

    def drop(self, dest: int, before: Optional[int] = None) -> List[Any]:
        """Forget the messages kept back for `dest` (those of iterations before `before`, if given); return them."""
        peer = self.peer(dest)
        if before is None:
            dropped = list(peer.queue)
            peer.queue.clear()
            return dropped
        dropped = [h for h in peer.queue if h.envelope.iteration < before]
        if dropped:
            peer.queue = deque(h for h in peer.queue if h.envelope.iteration >= before)
        return dropped

    def close(self) -> List[Any]:
        """Stop taking credits; return every message still kept back (never to be sent)."""
        if self._credits is None:
            return []
        for request, _ in self._incoming.values():
            request.Cancel()
            _done(request, wait=True)
        self._incoming = {}
        left = [h for rank in list(self._peers) for h in self.drop(rank)]
        self._credit_sends = []  # a credit nobody takes matters to nobody
        self._credits.Free()
        self._credits = None
        return left


def _done(request: Any, wait: bool = False) -> bool:
    """Return whether a request is over, an MPI error (a dead peer) counting as over."""
    try:
        if wait:
            request.Wait()
            return True
        return bool(request.Test())
    except MPI.Exception:
        return True


def test_one(request: Any, status: Any) -> Optional[bool]:
    """Test a request: True once it completed, False while not, None if it failed (its peer died, say).

    An MPI reports a failed request either as an error of the call (MPICH) or in the status of a
    request that completed (Open MPI with ULFM): both count.
    """
    status.Set_error(MPI.SUCCESS)
    try:
        if not request.Test(status):
            return False
    except MPI.Exception:
        return None
    return True if status.Get_error() == MPI.SUCCESS else None
