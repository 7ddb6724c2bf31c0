"""The receive side of a transport: posted receives, one per (source, tag), late replies drained, later ones kept.

Header receives are pre-posted; each payload receive is posted into its destination buffer as soon
as its header is in, with the size the header announces, so a receive never truncates and a receive
request can always be cancelled whole (only a header receive is ever cancelled). Posting a newer
receive for a (source, tag) first retires the older one (cancelled if nothing matched it yet, else
finished into scratch memory). Late replies are received into scratch memory and dropped; messages
of a later iteration that reach an older receive are kept aside until a receive for that iteration
is posted.
"""

from __future__ import annotations

import itertools
import time
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple

import numpy as np
from mpi4py import MPI

from .buffers import StagingPool, TensorInfo, WireBuffer, allocate, copy_bytes_into, recv_buffer, tensor_info
from .envelope import Envelope, Header, decode_header, make_tag, new_header_buffer
from .errors import MessageMismatch, WatchdogTimeout
from .flow import FlowControl, test_one
from .polling import Backoff, Deadline
from .stats import TransportStats

HEADER, PAYLOAD, DISCARD, STASH, DONE = range(5)
ARRIVED, LATE, SUPERSEDED, CANCELLED, FAILED = "arrived", "late", "superseded", "cancelled", "failed"


def test_each(requests: Sequence[Any], statuses: List[Any]) -> Tuple[List[int], List[int]]:
    """Test requests one by one; return the indices that completed (their statuses in order) and those that failed.

    One at a time because a request that fails must be told apart from the others: a failing
    Testsome reports an error but not which request it came from.
    """
    done: List[int] = []
    failed: List[int] = []
    for i, request in enumerate(requests):
        outcome = test_one(request, statuses[len(done)])
        if outcome:
            done.append(i)
        elif outcome is None:
            failed.append(i)
    return done, failed


class Slot:
    """One posted receive from one source for one envelope."""

    __slots__ = ("source", "envelope", "key", "out", "info", "header", "request", "state", "outcome", "awaited",
                 "retiring", "wire", "incoming", "scratch", "arrival")

    def __init__(self, source: int, envelope: Envelope, out: Any, info: Optional[TensorInfo]) -> None:
        self.source = source
        self.envelope = envelope
        self.key = (source, envelope.tag)
        self.out = out
        self.info = info
        self.header = new_header_buffer()
        self.request: Any = None
        self.state = HEADER
        self.outcome: Optional[str] = None
        self.awaited = True
        self.retiring = False
        self.wire: Optional[WireBuffer] = None
        self.incoming: Optional[Header] = None
        self.scratch: Optional[np.ndarray] = None
        self.arrival = 0.0


class Departures(Protocol):
    """The messages a send hook holds back (an Outbox): waits post them when their time comes."""

    def depart(self) -> None:
        """Post the held-back messages whose time has come."""

    def next_departure(self) -> Optional[float]:
        """Return when the next held-back message may go, or None."""


class ReceiveOwner(Protocol):
    """What the receive side uses of its transport (a Transport): the communicator, credits, counts, names."""

    comm: Any
    flow: FlowControl
    stats: TransportStats
    failed: Set[int]
    poll_sleep_s: float
    cuda_aware: bool
    device: Any

    def named(self, ranks: Sequence[int]) -> List[int]:
        """Return ranks of the communicator as ranks in the job."""

    def moving(self) -> bool:
        """Return whether a payload is on its way to the rank over the network."""


class Receives:
    """A transport's posted receives: at most one per (source, tag), retired ones draining, later messages kept.

    `fail` is the transport's: told of a source the MPI reported dead. `outbox` holds the messages a
    send hook keeps back; every wait here posts them when their time comes.
    """

    def __init__(self, transport: ReceiveOwner, pool: StagingPool, outbox: Departures,
                 fail: Callable[[int], None]) -> None:
        self.transport = transport
        self.fail = fail
        self._pool = pool
        self._outbox = outbox
        self.live: Dict[Tuple[int, int], Slot] = {}
        # Retired receives whose payload is still on its way: completed by progress, never waited for,
        # so a late reply from a slow rank cannot hold up the rank that moved on.
        self._draining: List[Slot] = []
        self._kept: Dict[Tuple[int, int], Dict[int, Tuple[Header, np.ndarray]]] = {}
        self._statuses: List[Any] = []

    def allocate(self, dtype: str, shape: Tuple[int, ...]) -> Any:
        """Return an empty tensor to receive a payload into, on the transport's device."""
        return allocate(dtype, shape, self.transport.device)

    def receive_buffer(self, out: Any, info: Optional[TensorInfo] = None) -> WireBuffer:
        """Return the wire buffer a payload for `out` is received into (staged when MPI cannot take it)."""
        return recv_buffer(out, self.transport.cuda_aware, self._pool, info)

    def count_received(self, nbytes: int) -> None:
        """Count a payload that came in."""
        self.transport.stats.received_bytes += nbytes

    # -- posting ------------------------------------------------------------------------------
    def open(self, source: int, envelope: Envelope, out: Any, info: Optional[TensorInfo]) -> Slot:
        """Post a receive from `source` for `envelope` (served at once from a message kept aside, if any)."""
        key = (source, envelope.tag)
        old = self.live.get(key)
        if old is not None:
            if old.awaited:
                raise ValueError(f"a receive from rank {source} for {old.envelope} is still awaited; wait for it "
                                 f"(or release() its gather) before posting one for {envelope}")
            self.retire(old)
        slot = Slot(source, envelope, out, info)
        slot.arrival = time.perf_counter()
        if not self._take_kept(slot):
            self.live[key] = slot
            self._post_header(slot)
        return slot

    def _take_kept(self, slot: Slot) -> bool:
        """Serve a slot from a message kept aside earlier; drop kept messages older than it."""
        kept = self._kept.get(slot.key)
        if not kept:
            return False
        want = slot.envelope.iteration
        for iteration in [i for i in kept if i < want]:
            del kept[iteration]
            self.transport.stats.stale_discarded += 1
        item = kept.pop(want, None)
        if not kept:
            del self._kept[slot.key]
        if item is None:
            return False
        header, payload = item
        self._check_match(slot, header)
        if payload.nbytes:
            copy_bytes_into(slot.out, payload)
        self._arrive(slot, header)
        return True

    def has_message(self, source: int, kind: int, layer: int = 0, phase: int = 0) -> bool:
        """Return whether a message from `source` with this kind, layer and phase waits unclaimed."""
        tag = make_tag(kind, layer, phase)
        if self._kept.get((source, tag)):
            return True
        if source in self.transport.failed:
            return False
        try:
            return bool(self.transport.comm.Iprobe(source, tag))
        except MPI.Exception:
            self.fail(source)
            return False

    def _post_header(self, slot: Slot) -> None:
        slot.state = HEADER
        slot.request = self.transport.comm.Irecv([slot.header, MPI.BYTE], slot.source, slot.key[1])

    def _post_payload(self, slot: Slot, buf: Any, state: int) -> None:
        slot.state = state
        slot.request = self.transport.comm.Irecv([buf, MPI.BYTE], slot.source, slot.key[1])

    # -- completing ---------------------------------------------------------------------------
    def _finish(self, slot: Slot, outcome: str) -> None:
        slot.state = DONE
        slot.outcome = outcome
        slot.request = None
        if self.live.get(slot.key) is slot:
            del self.live[slot.key]
        if slot.retiring and slot in self._draining:
            self._draining.remove(slot)

    def _arrive(self, slot: Slot, header: Header) -> None:
        slot.arrival = time.perf_counter()
        self.transport.stats.received_messages += 1
        self._finish(slot, ARRIVED)

    def _check_match(self, slot: Slot, header: Header, consume: bool = False) -> None:
        """Allocate the destination or check it against the header; raise MessageMismatch if it differs."""
        if slot.out is None:
            slot.out = self.allocate(header.dtype, header.shape)
            slot.info = tensor_info(slot.out)
            return
        info = slot.info
        assert info is not None
        if info.dtype != header.dtype or tuple(info.shape) != header.shape:
            if consume and header.nbytes:  # keep the message stream in step before reporting
                self.transport.comm.Recv([np.empty(header.nbytes, np.uint8), MPI.BYTE], slot.source, slot.key[1])
            self._finish(slot, CANCELLED)
            raise MessageMismatch(f"message from rank {slot.source} for {slot.envelope}: expected "
                                  f"{info.describe()}, got {header.dtype} {header.shape}")

    def _complete(self, slot: Slot, status: Any) -> None:
        """Advance a slot whose request has completed."""
        if slot.state == HEADER:
            header = decode_header(slot.header)
            self.transport.flow.received(slot.source, header.ack, header.paced)
            got, want = header.envelope, slot.envelope
            if (got.kind, got.layer, got.phase) != (want.kind, want.layer, want.phase):
                self._finish(slot, CANCELLED)
                raise MessageMismatch(f"message from rank {slot.source}: header says {got}, tag says {want}")
            slot.incoming = header
            if got.iteration == want.iteration and slot.awaited:
                self._check_match(slot, header, consume=True)
                if not header.nbytes:
                    self._arrive(slot, header)
                    return
                slot.wire = self.receive_buffer(slot.out, slot.info)
                self._post_payload(slot, slot.wire.data, PAYLOAD)
                return
            if not header.nbytes:
                self._settle_other(slot, header, np.empty(0, np.uint8))
                return
            slot.scratch = np.empty(header.nbytes, np.uint8)
            self._post_payload(slot, slot.scratch, STASH if got.iteration > want.iteration else DISCARD)
            return
        header = slot.incoming
        assert header is not None
        count = status.Get_count(MPI.BYTE)
        if count != header.nbytes:
            self._finish(slot, CANCELLED)
            raise MessageMismatch(f"message from rank {slot.source} for {slot.envelope}: header announced "
                                  f"{header.nbytes} bytes, {count} arrived")
        self.count_received(count)  # every payload that came in, late ones dropped after it included
        if slot.state == PAYLOAD:
            wire, slot.wire = slot.wire, None
            assert wire is not None
            wire.done(received=slot.awaited)
            if slot.awaited:
                self._arrive(slot, header)
            else:
                self.transport.stats.late_drained += 1
                self._finish(slot, LATE)
            return
        scratch, slot.scratch = slot.scratch, None
        assert scratch is not None
        self._settle_other(slot, header, scratch)

    def _settle_other(self, slot: Slot, header: Header, payload: np.ndarray) -> None:
        """Deal with a message that is not the one the slot waits for (or no longer waited for)."""
        got, want = header.envelope.iteration, slot.envelope.iteration
        if got > want:  # the sender has moved on: it will never send `want` after this
            self._kept.setdefault(slot.key, {})[got] = (header, payload)
            self.transport.stats.future_kept += 1
            self._finish(slot, SUPERSEDED)
        elif got == want:  # its own reply, after the round was over
            self.transport.stats.late_drained += 1
            self._finish(slot, LATE)
        else:  # an older round's reply: drop it and keep listening
            self.transport.stats.stale_discarded += 1
            if slot.retiring:
                self._finish(slot, CANCELLED)
            else:
                self._post_header(slot)

    def retire(self, slot: Slot) -> bool:
        """End a receive nobody waits for any more; return whether it was cancelled unmatched."""
        slot.awaited = False
        slot.retiring = True
        if slot.state == HEADER:
            slot.request.Cancel()
            status = MPI.Status()
            try:
                slot.request.Wait(status)
            except MPI.Exception:
                self.fail(slot.source)
                return True
            if status.Is_cancelled():
                self.transport.stats.cancelled += 1
                self._finish(slot, CANCELLED)
                return True
            self._complete(slot, status)
        if slot.state != DONE:
            # A payload is on its way (its sender posted it with the header). Its receive stays posted
            # ahead of any newer receive for the same source and tag, so MPI's ordering still matches
            # it first; progress() completes it later.
            if self.live.get(slot.key) is slot:
                del self.live[slot.key]
            self._draining.append(slot)
        return False

    def abandon(self, rank: int) -> None:
        """End every receive from a rank the MPI reported failed."""
        for slot in [s for s in list(self.live.values()) + self._draining if s.source == rank]:
            self._finish(slot, FAILED)

    # -- progress, waiting and draining ---------------------------------------------------------
    def _wait_some(self, requests: List[Any], statuses: List[Any], deadline: Deadline,
                   interrupt: Optional[Callable[[], None]] = None) -> Tuple[List[int], List[int]]:
        """Poll until some requests complete or fail (see test_each) or the deadline passes (nothing then)."""
        backoff = Backoff(self.transport.poll_sleep_s, self.transport.moving)
        while True:  # MPI has no timed wait: poll, as a blocking MPI wait spins internally anyway
            self.transport.flow.poll()
            self._outbox.depart()
            if interrupt is not None:
                interrupt()
            done, failed = test_each(requests, statuses)
            if done or failed:
                return done, failed
            if deadline.passed():
                return [], []
            backoff.pause(self._outbox.next_departure())

    def progress_until(self, done: Callable[[], bool], deadline: Deadline,
                       interrupt: Optional[Callable[[], None]] = None) -> bool:
        """Serve all posted receives until done() holds or the deadline passes; return done()."""
        while not done():
            live = list(self.live.values()) + self._draining
            if not live:
                return done()
            completed, failed = self._wait_some([s.request for s in live], self._statuses_for(live), deadline,
                                                interrupt)
            if not completed and not failed:
                return done()
            self._settle(live, completed, failed)
        return True

    def _statuses_for(self, live: List[Slot]) -> List[Any]:
        statuses = self._statuses
        while len(statuses) < len(live):
            statuses.append(MPI.Status())
        return statuses

    def _settle(self, live: List[Slot], completed: List[int], failed: List[int]) -> None:
        """Advance the slots whose requests completed; end those whose source failed."""
        for j, i in enumerate(completed):
            self._complete(live[i], self._statuses[j])
        for i in failed:
            self.fail(live[i].source)

    def moving(self, sources: AbstractSet[int]) -> bool:
        """Return whether a payload from one of `sources` is on its way (its header is in, its receive posted)."""
        return any(s.state in (PAYLOAD, DISCARD, STASH) and s.source in sources
                   for s in itertools.chain(self.live.values(), self._draining))

    def poll(self) -> None:
        """Advance every posted receive that can move now, without blocking."""
        live = list(self.live.values()) + self._draining
        if live:
            self._settle(live, *test_each([s.request for s in live], self._statuses_for(live)))

    def wait(self, slot: Slot, timeout: Optional[float]) -> Any:
        """Wait for one slot's message and return its tensor; raise WatchdogTimeout past `timeout`."""
        deadline = Deadline(timeout)
        try:
            if not self.progress_until(lambda: slot.state == DONE, deadline):
                raise WatchdogTimeout(self.transport.named([slot.source]), str(slot.envelope), timeout or 0.0)
        finally:
            slot.awaited = False
        if slot.outcome != ARRIVED:
            raise RuntimeError(f"no message for {slot.envelope} can arrive from rank {slot.source}: "
                               "it already sent a later iteration instead")
        return slot.out

    def pending(self) -> List[Tuple[int, Envelope]]:
        """Return the receives still posted as (source, envelope), draining ones included."""
        return [(s.source, s.envelope) for s in list(self.live.values()) + self._draining]

    def drain(self, deadline: Deadline) -> Tuple[int, int]:
        """Let posted receives finish until the deadline, then cancel the unanswered ones.

        Return how many completed and how many were cancelled.
        """
        for slot in self.live.values():
            slot.awaited = False
        before = len(self.live) + len(self._draining)
        self.progress_until(lambda: not self.live and not self._draining, deadline)
        completed = before - len(self.live) - len(self._draining)
        cancelled = sum(self.retire(slot) for slot in list(self.live.values()))
        self.progress_until(lambda: not self._draining, deadline)
        return completed, cancelled
