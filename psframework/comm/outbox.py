"""The send side of a transport: messages posted header then payload, paced by flow control, held by a send hook.

Every message goes as two MPI messages with the same tag, sent back to back: its header, then its
payload bytes. A message beyond flow control's window is kept back (flow.py); one the send hook
holds back (an emulated link) is posted at the first poll after its time, in the order sent.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Protocol, Sequence, Set, Tuple

import numpy as np
from mpi4py import MPI

from .buffers import StagingPool, WireBuffer, send_buffer
from .envelope import Envelope, encode_header, set_flow
from .errors import WatchdogTimeout
from .flow import FlowControl
from .polling import DEFAULT, Backoff, Deadline
from .stats import TransportStats

# Called as hook(dest, envelope, nbytes) before a message goes on the wire; it may return the time
# (time.perf_counter) before which the message must not be posted (an emulated link), or None.
SendHook = Callable[[int, Envelope, int], Optional[float]]


class SendPath(Protocol):
    """What an outbox uses of its transport (a Transport): the communicator, counts, waits and names."""

    comm: Any
    cuda_aware: bool
    send_hook: Optional[SendHook]
    poll_sleep_s: float
    stats: TransportStats
    failed: Set[int]

    def progress(self) -> int:
        """Serve everything that can move now."""

    def moving(self) -> bool:
        """Return whether a payload is on its way to the rank over the network."""

    def named(self, ranks: Sequence[int]) -> List[int]:
        """Return ranks of the communicator as ranks in the job."""

    def resolve_timeout(self, value: Any = DEFAULT) -> Optional[float]:
        """Return the watchdog timeout a wait uses."""


class SendHandle:
    """One message on its way out (or kept back by flow control); keeps its buffers alive until MPI is done."""

    def __init__(self, outbox: "Outbox", dest: int, envelope: Envelope, header: np.ndarray,
                 wire: WireBuffer) -> None:
        self.dest = dest
        self.envelope = envelope
        self.requests: Optional[List[Any]] = None  # None while kept back
        self.dropped = False
        self._outbox = outbox
        self.header = header
        self.wire: Optional[WireBuffer] = wire
        self.nbytes = wire.info.nbytes

    def test(self) -> bool:
        """Return whether the message has left (its buffers may be reused), was dropped, or its receiver died."""
        if self.wire is not None and self.requests is not None:
            try:
                left = MPI.Request.Testall(self.requests)
            except MPI.Exception:
                self._outbox.fail(self.dest)
                left = True
            if left:
                self._finish()
        return self.wire is None

    def drop(self) -> None:
        """Give up a message kept back: it will never be sent."""
        self.dropped = True
        self._finish()

    def wait(self, timeout_s: Any = DEFAULT) -> None:
        """Block until the message has left, serving other receives meanwhile; watchdog-bounded."""
        self._outbox.wait(self, timeout_s)

    def _finish(self) -> None:
        if self.wire is not None:
            self.wire.done(received=False)
            self.wire = None


class Outbox:
    """A transport's messages on their way out: posted, kept back by flow control or held by the send hook.

    `fail` is the transport's: told of a destination the MPI reported dead.
    """

    def __init__(self, transport: SendPath, base: Any, window: Optional[int], pool: StagingPool,
                 fail: Callable[[int], None]) -> None:
        self.transport = transport
        self.fail = fail
        self._pool = pool
        self._sends: List[SendHandle] = []
        self._departures: Deque[Tuple[float, SendHandle]] = deque()  # held back by the send hook, oldest first
        self.flow = FlowControl(base, window, self._post_message, fail,
                                ready=lambda handle: handle.wire is None or handle.wire.ready())

    def submit(self, dest: int, data: Any, envelope: Envelope, urgent: bool) -> SendHandle:
        """Start sending `data` to `dest` (see Transport.isend); return its handle."""
        wire = send_buffer(data, self.transport.cuda_aware, self._pool)
        info = wire.info
        header = encode_header(envelope, info.dtype, info.shape, info.nbytes)
        if self._sends:
            self.sweep()
        handle = SendHandle(self, dest, envelope, header, wire)
        self.transport.stats.sent_messages += 1
        self.transport.stats.sent_bytes += info.nbytes
        self._sends.append(handle)
        self.flow.submit(dest, handle, urgent)
        return handle

    def _post_message(self, handle: SendHandle) -> None:
        """Post one message, header then payload: every message that goes on the wire passes through here."""
        self.flow.posting(handle.dest)
        hook = self.transport.send_hook
        due = None if hook is None else hook(handle.dest, handle.envelope, handle.nbytes)
        if due is not None and (self._departures or due > time.perf_counter()):
            self._departures.append((due, handle))
            return
        self._isend(handle)

    def holding(self) -> bool:
        """Return whether the send hook still holds messages back (on an emulated link)."""
        return bool(self._departures)

    def next_departure(self) -> Optional[float]:
        """Return when the next message held back by the send hook may go (None: none is held back)."""
        return self._departures[0][0] if self._departures else None

    def depart(self) -> None:
        """Post the messages the send hook held back whose time has come, in order."""
        if not self._departures:
            return
        now = time.perf_counter()
        while self._departures and self._departures[0][0] <= now:
            _, handle = self._departures.popleft()
            if not handle.dropped:
                self._isend(handle)

    def _isend(self, handle: SendHandle) -> None:
        dest, envelope, header, wire = handle.dest, handle.envelope, handle.header, handle.wire
        assert wire is not None
        set_flow(header, *self.flow.ack_words(dest))
        tag = envelope.tag
        if dest in self.transport.failed:
            handle.drop()
            return
        try:
            requests = [self.transport.comm.Isend([header, MPI.BYTE], dest, tag)]
            if handle.nbytes:
                requests.append(self.transport.comm.Isend([wire.data, MPI.BYTE], dest, tag))
        except MPI.Exception:
            self.fail(dest)
            handle.drop()
            return
        handle.requests = requests

    def backlog(self, dest: int) -> List[SendHandle]:
        """Return the messages flow control keeps back for `dest`, oldest first."""
        return self.flow.backlog(dest)

    def oldest_kept(self, dest: int) -> Optional[int]:
        """Return the iteration of the oldest message kept back for `dest`, or None (checked after every send)."""
        queue = self.flow.peer(dest).queue
        return queue[0].envelope.iteration if queue else None

    def heard_from(self, rank: int) -> float:
        """Return when `rank` last showed that it runs (time.monotonic): a message or a credit from it."""
        return self.flow.peer(rank).heard

    def drop(self, dest: int, before: Optional[int] = None) -> int:
        """Drop the messages kept back for `dest` (all, or those of iterations before `before`); return how many."""
        return self.discard(self.flow.drop(dest, before))

    def discard(self, handles: List[SendHandle]) -> int:
        """Drop messages flow control gave up (never to be sent) and count them; return how many."""
        for handle in handles:
            handle.drop()
            self.transport.stats.dropped_messages += 1
            self.transport.stats.dropped_bytes += handle.nbytes
        if handles:
            self.sweep()
        return len(handles)

    def sweep(self) -> None:
        """Post the held-back messages whose time has come and forget the sends that have finished."""
        self.depart()
        if self._sends:
            self._sends = [h for h in self._sends if not h.test()]

    def unfinished(self) -> int:
        """Return how many sends have not finished yet (as of the last sweep)."""
        return len(self._sends)

    def wait(self, handle: SendHandle, timeout_s: Any = DEFAULT) -> None:
        """Block until `handle` has left, serving everything else meanwhile; watchdog-bounded."""
        timeout = self.transport.resolve_timeout(timeout_s)
        if handle.test():
            self.sweep()
            return
        deadline = Deadline(timeout)
        backoff = Backoff(self.transport.poll_sleep_s, self.transport.moving)
        while not handle.test():
            self.transport.progress()
            if deadline.passed():
                raise WatchdogTimeout(self.transport.named([handle.dest]), f"the send of {handle.envelope}", timeout)
            backoff.pause(self.next_departure())
        self.sweep()

    def flush(self, deadline: Deadline) -> int:
        """Let the sends finish until the deadline; return how many are still unfinished."""
        backoff = Backoff(self.transport.poll_sleep_s, self.transport.moving)
        while self._sends and not deadline.passed():
            self.sweep()
            backoff.pause(self.next_departure())
        self.sweep()
        return len(self._sends)
