"""Enveloped point-to-point messages, first-k-of-n receives, a watchdog and draining of late replies.

Every message goes as two MPI messages with the same tag, sent back to back: a 144-byte header
(kind, iteration, layer, phase, dtype, shape, size) and the payload bytes. The tag holds kind,
layer and phase; the full iteration is in the header and is checked on receipt, so a late reply of
round t is never taken for a reply of round t+1. Header receives are pre-posted; each payload
receive is posted into its destination buffer as soon as its header is in, with the size the
header announces, so a receive never truncates and a receive request can always be cancelled
whole (only a header receive is ever cancelled). At most one receive is posted per (source, tag):
posting a newer one first retires the older one (cancelled if nothing matched it yet, else finished
into scratch memory). Late replies are received into scratch memory and dropped; messages of a
later iteration that reach an older receive are kept aside until a receive for that iteration is
posted.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .buffers import (StagingPool, TensorInfo, WireBuffer, allocate, copy_bytes_into, recv_buffer, send_buffer,
                      tensor_info)
from .cuda import resolve_cuda_aware
from .envelope import (MAX_TAG, MIN_TAG_UB, Envelope, Header, decode_header, encode_header, make_tag,
                       new_header_buffer, set_flow)
from .errors import MessageMismatch, TooFewWorkers, WatchdogTimeout
from .flow import FlowControl, test_one
from .mailbox import Mailbox
from .polling import DEFAULT, Backoff, Deadline, auto_poll_sleep

# Called as hook(dest, envelope, nbytes) before a message goes on the wire; it may return the time
# (time.perf_counter) before which the message must not be posted (an emulated link), or None.
SendHook = Callable[[int, Envelope, int], Optional[float]]

_HEADER, _PAYLOAD, _DISCARD, _STASH, _DONE = range(5)
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


@dataclass
class TransportStats:
    """Counts of what the transport moved and what it had to drain."""

    sent_messages: int = 0  # messages sent, kept back ones included
    sent_bytes: int = 0
    dropped_messages: int = 0  # messages kept back, then dropped unsent (their receiver had been detached)
    dropped_bytes: int = 0
    received_messages: int = 0  # messages handed out
    received_bytes: int = 0  # payload bytes that came in, late replies that were dropped included
    late_drained: int = 0  # replies that came after their round was over: received into scratch, dropped
    stale_discarded: int = 0  # older-iteration messages met by a newer receive: dropped
    future_kept: int = 0  # newer-iteration messages met by an older receive: kept for their own receive
    cancelled: int = 0  # receives cancelled because nothing was sent for them


@dataclass
class FirstK:
    """The outcome of waiting for the first k of n replies."""

    envelope: Envelope
    k: int
    arrived: List[int]  # sources in arrival order; at least k, more if they came in together
    wait_s: float  # seconds from the start of the wait until the k-th reply was in
    data: Dict[int, Any]  # source -> received tensor, for the sources that arrived
    late: List[int]  # sources still outstanding: their replies are drained later

    @property
    def first(self) -> List[int]:
        """Return the first k sources to answer."""
        return self.arrived[:self.k]


@dataclass
class DrainReport:
    """What a drain did: late replies completed, receives cancelled, sends still in flight."""

    completed: int
    cancelled: int
    unfinished_sends: int


class _Slot:
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
        self.state = _HEADER
        self.outcome: Optional[str] = None
        self.awaited = True
        self.retiring = False
        self.wire: Optional[WireBuffer] = None
        self.incoming: Optional[Header] = None
        self.scratch: Optional[np.ndarray] = None
        self.arrival = 0.0


class SendHandle:
    """One message on its way out (or kept back by flow control); keeps its buffers alive until MPI is done."""

    def __init__(self, transport: "Transport", dest: int, envelope: Envelope, header: np.ndarray,
                 wire: WireBuffer) -> None:
        self.dest = dest
        self.envelope = envelope
        self.requests: Optional[List[Any]] = None  # None while kept back
        self.dropped = False
        self._transport = transport
        self.header = header
        self.wire: Optional[WireBuffer] = wire
        self.nbytes = wire.info.nbytes

    def test(self) -> bool:
        """Return whether the message has left (its buffers may be reused), was dropped, or its receiver died."""
        if self.wire is not None and self.requests is not None:
            try:
                left = MPI.Request.Testall(self.requests)
            except MPI.Exception:
                self._transport.peer_failed(self.dest)
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
        self._transport._wait_send(self, self._transport.resolve_timeout(timeout_s))

    def _finish(self) -> None:
        if self.wire is not None:
            self.wire.done(received=False)
            self.wire = None


class _Settled(Exception):
    """Ends a gather's wait early: its `settle` said the replies in are enough."""


class Gather:
    """Receives pre-posted from several sources for one envelope; wait for the first k."""

    def __init__(self, transport: "Transport", envelope: Envelope, slots: Dict[int, _Slot]) -> None:
        self.transport = transport
        self.envelope = envelope
        self.sources = list(slots)
        self._slots = slots
        self._result: Optional[FirstK] = None

    def arrived(self) -> List[int]:
        """Return the sources whose reply is in so far, in arrival order."""
        done = [s for s in self._slots.values() if s.outcome == ARRIVED]
        return [s.source for s in sorted(done, key=lambda s: s.arrival)]

    def wait(self, k: Optional[int] = None, *, timeout_s: Any = DEFAULT,
             interrupt: Optional[Callable[[], None]] = None, least: Optional[int] = None,
             settle: Optional[Callable[[], bool]] = None) -> FirstK:
        """Block until k replies are in (all by default); raise WatchdogTimeout past timeout_s.

        `interrupt`, if given, is called at every poll: it may raise to end the wait early. `settle`, if
        given, is asked at every poll once `least` replies are in: True ends the wait with those (k is then
        the number in).
        """
        if self._result is not None:
            return self._result
        n = len(self._slots)
        k = n if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"k: got {k!r}, expected an integer in 1..{n} (the number of sources)")
        timeout = self.transport.resolve_timeout(timeout_s)
        start = time.perf_counter()
        deadline = Deadline(timeout)
        slots = list(self._slots.values())

        def enough() -> bool:
            have = sum(1 for s in slots if s.outcome == ARRIVED)
            if have >= k:
                return True
            if have + sum(1 for s in slots if s.state != _DONE) < k:
                failed = [s.source for s in slots if s.outcome == FAILED]
                gone = [s.source for s in slots if s.state == _DONE and s.outcome not in (ARRIVED, FAILED)]
                failed, gone = self.transport.named(failed), self.transport.named(gone)
                reasons = ([f"rank(s) {', '.join(map(str, failed))} failed (the MPI reports them dead)"] if failed
                           else []) + ([f"rank(s) {', '.join(map(str, gone))} already sent a later iteration "
                                        "instead"] if gone else [])
                raise TooFewWorkers(f"only {have} of the {k} replies needed for {self.envelope} can still arrive: "
                                    + "; ".join(reasons))
            return False

        def poll() -> None:
            if interrupt is not None:
                interrupt()
            if settle is not None and least is not None and len(self.arrived()) >= least and settle():
                raise _Settled()

        try:
            try:
                done = self.transport._progress_until(enough, deadline, poll)
            except _Settled:
                done, k = True, len(self.arrived())
            if not done:
                silent = [s.source for s in slots if s.outcome != ARRIVED]
                named = self.transport.named
                raise WatchdogTimeout(named(silent), str(self.envelope), timeout, named(self.arrived()), k)
            arrived = self.arrived()
            by_source = self._slots
            kth = by_source[arrived[k - 1]].arrival
            self._result = FirstK(self.envelope, k, arrived, max(0.0, kth - start),
                                  {s: by_source[s].out for s in arrived},
                                  [s.source for s in slots if s.outcome != ARRIVED])
        finally:
            self.release()
        return self._result

    def wait_within(self, timeout_s: float, keep: bool = False) -> Dict[int, Any]:
        """Wait up to timeout_s for every reply; return those in by then {source: tensor} (no watchdog).

        `keep`: go on awaiting the others (a later wait() may still take them); else release them.
        """
        slots = list(self._slots.values())
        try:
            self.transport._progress_until(lambda: all(s.state == _DONE for s in slots), Deadline(timeout_s))
        finally:
            if not keep:
                self.release()
        return {s.source: s.out for s in slots if s.outcome == ARRIVED}

    def release(self) -> None:
        """Stop awaiting: replies still outstanding are drained into scratch memory when they come."""
        for slot in self._slots.values():
            slot.awaited = False


class Transport:
    """Move tensors between ranks of one communicator with envelopes, a watchdog and draining.

    Creating a Transport duplicates the communicator (collective over it) so that its tags never
    meet other traffic. `timeout_s` is the watchdog: a blocking wait still unfinished after that
    many seconds raises WatchdogTimeout naming the ranks it still waits for (None waits for ever);
    every wait also takes its own timeout_s. Waits poll the requests (MPI has no timed wait);
    `poll_sleep_s` bounds the sleep between polls once a wait has spun a while (0 spins; None picks
    0 when every rank of the node has a core, else 1 ms). Not thread-safe: one thread per Transport.
    `send_hook`, if given, is called as hook(dest, envelope, nbytes) right before each message is
    posted: the one place every outgoing message passes through; a time it returns holds the message
    back until then (it is posted at the first poll after it, in the order the messages were sent).
    `window` paces the sends: at most that many messages in flight per destination, the rest kept
    back (flow.py; None sends everything at once).
    A request that fails (its peer died) ends that peer's receives; the rank is then in `failed`.
    Payloads received into buffers the transport allocates land on `device` (a torch device; None or
    cpu: host memory), staged through pinned host memory when the MPI is not CUDA-aware.
    """

    def __init__(self, comm: Any = None, *, cuda_aware: Any = "auto", timeout_s: Optional[float] = None,
                 dup: bool = True, send_hook: Optional[SendHook] = None,
                 poll_sleep_s: Optional[float] = None, window: Optional[int] = None, device: Any = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if base == MPI.COMM_NULL:
            raise ValueError("comm: got MPI.COMM_NULL, expected a communicator this rank belongs to")
        tag_ub = base.Get_attr(MPI.TAG_UB)
        if tag_ub is None or tag_ub <= MAX_TAG:
            raise RuntimeError(f"MPI TAG_UB is {tag_ub}, expected above {MAX_TAG} "
                               f"(the standard guarantees {MIN_TAG_UB})")
        self.tag_ub = int(tag_ub)
        self.comm = base.Dup() if dup else base
        self._owns_comm = dup
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        awareness = resolve_cuda_aware(cuda_aware, base)
        self.cuda_aware = awareness.aware
        self.cuda_aware_method = awareness.method
        self.timeout_s = self._check_timeout(timeout_s)
        if poll_sleep_s is not None and not poll_sleep_s >= 0.0:
            raise ValueError(f"poll_sleep_s: got {poll_sleep_s!r}, expected seconds >= 0 or None (automatic)")
        self.poll_sleep_s = auto_poll_sleep(base) if poll_sleep_s is None else float(poll_sleep_s)
        self.send_hook = send_hook
        self.job_ranks: Optional[Sequence[int]] = None  # the rank in the job of each rank of comm, for messages
        self.device = device  # where received payloads are allocated (None: host memory)
        self.stats = TransportStats()
        self._pool = StagingPool()
        self._live: Dict[Tuple[int, int], _Slot] = {}
        # Retired receives whose payload is still on its way: completed by progress, never waited for,
        # so a late reply from a slow rank cannot hold up the rank that moved on.
        self._draining: List[_Slot] = []
        self._kept: Dict[Tuple[int, int], Dict[int, Tuple[Header, np.ndarray]]] = {}
        self._sends: List[SendHandle] = []
        self._statuses: List[Any] = []
        self._mailboxes: List[Mailbox] = []
        self.failed: set = set()  # ranks the MPI reported failed (dead): nothing more goes to or comes from them
        self._departures: Deque[Tuple[float, SendHandle]] = deque()  # held back by the send hook, oldest first
        self.flow = FlowControl(base, window, self._post_message, self.peer_failed,
                                ready=lambda handle: handle.wire is None or handle.wire.ready())

    def allocate(self, dtype: str, shape: Tuple[int, ...]) -> Any:
        """Return an empty tensor to receive a payload into, on this transport's device."""
        return allocate(dtype, shape, self.device)

    # -- sending ------------------------------------------------------------------------------
    def isend(self, dest: int, data: Any, envelope: Envelope, *, urgent: bool = False) -> SendHandle:
        """Start sending `data` to `dest`; do not modify it until the handle says it has left.

        With a window, a message beyond it is kept back until `dest` acknowledges earlier ones;
        `urgent` posts it at once all the same (for the rare control message).
        """
        self._check_rank(dest, "dest")
        wire = send_buffer(data, self.cuda_aware, self._pool)
        info = wire.info
        header = encode_header(envelope, info.dtype, info.shape, info.nbytes)
        if self._sends:
            self._sweep_sends()
        handle = SendHandle(self, dest, envelope, header, wire)
        self.stats.sent_messages += 1
        self.stats.sent_bytes += info.nbytes
        self._sends.append(handle)
        self.flow.submit(dest, handle, urgent)
        return handle

    def send(self, dest: int, data: Any, envelope: Envelope, *, timeout_s: Any = DEFAULT) -> None:
        """Send `data` to `dest` and wait until it has left."""
        self.isend(dest, data, envelope).wait(timeout_s)

    def _post_message(self, handle: SendHandle) -> None:
        """Post one message, header then payload: every message that goes on the wire passes through here."""
        self.flow.posting(handle.dest)
        due = None if self.send_hook is None else self.send_hook(handle.dest, handle.envelope, handle.nbytes)
        if due is not None and (self._departures or due > time.perf_counter()):
            self._departures.append((due, handle))
            return
        self._isend(handle)

    def holding(self) -> bool:
        """Return whether the send hook still holds messages back (on an emulated link)."""
        return bool(self._departures)

    def _next_departure(self) -> Optional[float]:
        """Return when the next message held back by the send hook may go (None: none is held back)."""
        return self._departures[0][0] if self._departures else None

    def _depart(self) -> None:
        """Post the messages the send hook held back whose time has come, in order."""
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
        if dest in self.failed:
            handle.drop()
            return
        try:
            requests = [self.comm.Isend([header, MPI.BYTE], dest, tag)]
            if handle.nbytes:
                requests.append(self.comm.Isend([wire.data, MPI.BYTE], dest, tag))
        except MPI.Exception:
            self.peer_failed(dest)
            handle.drop()
            return
        handle.requests = requests

    def peer_failed(self, rank: int) -> None:
        """Note that the MPI reported `rank` failed: drop what waits for it, end the receives from it."""
        if rank in self.failed:
            return
        self.failed.add(rank)
        self._drop(self.flow.drop(rank))
        for slot in [s for s in list(self._live.values()) + self._draining if s.source == rank]:
            self._finish(slot, FAILED)

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
        return self._drop(self.flow.drop(dest, before))

    def _drop(self, handles: List[SendHandle]) -> int:
        for handle in handles:
            handle.drop()
            self.stats.dropped_messages += 1
            self.stats.dropped_bytes += handle.nbytes
        if handles:
            self._sweep_sends()
        return len(handles)

    def _sweep_sends(self) -> None:
        if self._departures:
            self._depart()
        if self._sends:
            self._sends = [h for h in self._sends if not h.test()]

    def _wait_send(self, handle: SendHandle, timeout: Optional[float]) -> None:
        if handle.test():
            self._sweep_sends()
            return
        deadline = Deadline(timeout)
        backoff = Backoff(self.poll_sleep_s)
        while not handle.test():
            self.progress()
            if deadline.passed():
                raise WatchdogTimeout(self.named([handle.dest]), f"the send of {handle.envelope}", timeout)
            backoff.pause(self._next_departure())
        self._sweep_sends()

    # -- receiving ----------------------------------------------------------------------------
    def recv(self, source: int, envelope: Envelope, out: Any = None, *, timeout_s: Any = DEFAULT) -> Any:
        """Receive one message; into `out` if given, else into a new CPU tensor shaped as sent."""
        self._check_rank(source, "source")
        info = None if out is None else tensor_info(out)
        if self._live or self._sends:
            self.progress()
        slot = self._open_slot(source, envelope, out, info)
        return self._wait_slot(slot, self.resolve_timeout(timeout_s))

    def _wait_slot(self, slot: _Slot, timeout: Optional[float]) -> Any:
        deadline = Deadline(timeout)
        try:
            if not self._progress_until(lambda: slot.state == _DONE, deadline):
                raise WatchdogTimeout(self.named([slot.source]), str(slot.envelope), timeout or 0.0)
        finally:
            slot.awaited = False
        if slot.outcome != ARRIVED:
            raise RuntimeError(f"no message for {slot.envelope} can arrive from rank {slot.source}: "
                               "it already sent a later iteration instead")
        return slot.out

    def post_gather(self, sources: Sequence[int], envelope: Envelope,
                    out: Optional[Mapping[int, Any]] = None) -> Gather:
        """Pre-post receives from every source (into out[source], or new tensors); return the Gather."""
        sources = [int(s) for s in sources]
        if not sources or len(set(sources)) != len(sources):
            raise ValueError(f"sources: got {sources}, expected a non-empty list of distinct ranks")
        for s in sources:
            self._check_rank(s, "source")
        if out is not None:
            missing = [s for s in sources if s not in out]
            if missing:
                raise ValueError(f"out: no receive buffer for source rank(s) {missing}; expected one per source")
        infos = {s: None if out is None else tensor_info(out[s]) for s in sources}  # reject bad buffers early
        self.progress()
        slots = {s: self._open_slot(s, envelope, None if out is None else out[s], infos[s]) for s in sources}
        return Gather(self, envelope, slots)

    def has_message(self, source: int, kind: int, layer: int = 0, phase: int = 0) -> bool:
        """Return whether a message from `source` with this kind, layer and phase waits unclaimed."""
        tag = make_tag(kind, layer, phase)
        if self._kept.get((source, tag)):
            return True
        if source in self.failed:
            return False
        try:
            return bool(self.comm.Iprobe(source, tag))
        except MPI.Exception:
            self.peer_failed(source)
            return False

    def _open_slot(self, source: int, envelope: Envelope, out: Any, info: Optional[TensorInfo]) -> _Slot:
        key = (source, envelope.tag)
        old = self._live.get(key)
        if old is not None:
            if old.awaited:
                raise ValueError(f"a receive from rank {source} for {old.envelope} is still awaited; wait for it "
                                 f"(or release() its gather) before posting one for {envelope}")
            self._retire(old)
        slot = _Slot(source, envelope, out, info)
        slot.arrival = time.perf_counter()
        if not self._take_kept(slot):
            self._live[key] = slot
            self._post_header(slot)
        return slot

    def _take_kept(self, slot: _Slot) -> bool:
        """Serve a slot from a message kept aside earlier; drop kept messages older than it."""
        kept = self._kept.get(slot.key)
        if not kept:
            return False
        want = slot.envelope.iteration
        for iteration in [i for i in kept if i < want]:
            del kept[iteration]
            self.stats.stale_discarded += 1
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

    def _post_header(self, slot: _Slot) -> None:
        slot.state = _HEADER
        slot.request = self.comm.Irecv([slot.header, MPI.BYTE], slot.source, slot.key[1])

    def _post_payload(self, slot: _Slot, buf: Any, state: int) -> None:
        slot.state = state
        slot.request = self.comm.Irecv([buf, MPI.BYTE], slot.source, slot.key[1])

    def _finish(self, slot: _Slot, outcome: str) -> None:
        slot.state = _DONE
        slot.outcome = outcome
        slot.request = None
        if self._live.get(slot.key) is slot:
            del self._live[slot.key]
        if slot.retiring and slot in self._draining:
            self._draining.remove(slot)

    def _arrive(self, slot: _Slot, header: Header) -> None:
        slot.arrival = time.perf_counter()
        self.stats.received_messages += 1
        self._finish(slot, ARRIVED)

    def _check_match(self, slot: _Slot, header: Header, consume: bool = False) -> None:
        """Allocate the destination or check it against the header; raise MessageMismatch if it differs."""
        if slot.out is None:
            slot.out = self.allocate(header.dtype, header.shape)
            slot.info = tensor_info(slot.out)
            return
        info = slot.info
        assert info is not None
        if info.dtype != header.dtype or tuple(info.shape) != header.shape:
            if consume and header.nbytes:  # keep the message stream in step before reporting
                self.comm.Recv([np.empty(header.nbytes, np.uint8), MPI.BYTE], slot.source, slot.key[1])
            self._finish(slot, CANCELLED)
            raise MessageMismatch(f"message from rank {slot.source} for {slot.envelope}: expected "
                                  f"{info.describe()}, got {header.dtype} {header.shape}")

    def _complete(self, slot: _Slot, status: Any) -> None:
        """Advance a slot whose request has completed."""
        if slot.state == _HEADER:
            header = decode_header(slot.header)
            self.flow.received(slot.source, header.ack, header.paced)
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
                self._post_payload(slot, slot.wire.data, _PAYLOAD)
                return
            if not header.nbytes:
                self._settle_other(slot, header, np.empty(0, np.uint8))
                return
            slot.scratch = np.empty(header.nbytes, np.uint8)
            self._post_payload(slot, slot.scratch, _STASH if got.iteration > want.iteration else _DISCARD)
            return
        header = slot.incoming
        assert header is not None
        count = status.Get_count(MPI.BYTE)
        if count != header.nbytes:
            self._finish(slot, CANCELLED)
            raise MessageMismatch(f"message from rank {slot.source} for {slot.envelope}: header announced "
                                  f"{header.nbytes} bytes, {count} arrived")
        self.count_received(count)  # every payload that came in, late ones dropped after it included
        if slot.state == _PAYLOAD:
            wire, slot.wire = slot.wire, None
            assert wire is not None
            wire.done(received=slot.awaited)
            if slot.awaited:
                self._arrive(slot, header)
            else:
                self.stats.late_drained += 1
                self._finish(slot, LATE)
            return
        scratch, slot.scratch = slot.scratch, None
        assert scratch is not None
        self._settle_other(slot, header, scratch)

    def _settle_other(self, slot: _Slot, header: Header, payload: np.ndarray) -> None:
        """Deal with a message that is not the one the slot waits for (or no longer waited for)."""
        got, want = header.envelope.iteration, slot.envelope.iteration
        if got > want:  # the sender has moved on: it will never send `want` after this
            self._kept.setdefault(slot.key, {})[got] = (header, payload)
            self.stats.future_kept += 1
            self._finish(slot, SUPERSEDED)
        elif got == want:  # its own reply, after the round was over
            self.stats.late_drained += 1
            self._finish(slot, LATE)
        else:  # an older round's reply: drop it and keep listening
            self.stats.stale_discarded += 1
            if slot.retiring:
                self._finish(slot, CANCELLED)
            else:
                self._post_header(slot)

    def _retire(self, slot: _Slot) -> bool:
        """End a receive nobody waits for any more; return whether it was cancelled unmatched."""
        slot.awaited = False
        slot.retiring = True
        if slot.state == _HEADER:
            slot.request.Cancel()
            status = MPI.Status()
            try:
                slot.request.Wait(status)
            except MPI.Exception:
                self.peer_failed(slot.source)
                return True
            if status.Is_cancelled():
                self.stats.cancelled += 1
                self._finish(slot, CANCELLED)
                return True
            self._complete(slot, status)
        if slot.state != _DONE:
            # A payload is on its way (its sender posted it with the header). Its receive stays posted
            # ahead of any newer receive for the same source and tag, so MPI's ordering still matches
            # it first; progress() completes it later.
            if self._live.get(slot.key) is slot:
                del self._live[slot.key]
            self._draining.append(slot)
        return False

    # -- mailbox mode ---------------------------------------------------------------------------
    def mailbox(self, source: int) -> Mailbox:
        """Receive everything `source` sends on this transport as it arrives, whatever its tag.

        Use it for every receive from that source: its header receive matches any tag. `progress()`
        and every wait of this transport serve it too, so messages keep moving while the rank computes.
        There is one mailbox per source: asking again returns the same one.
        """
        self._check_rank(source, "source")
        for box in self._mailboxes:
            if box.source == source:
                return box
        box = Mailbox(self, source)
        self._mailboxes.append(box)
        return box

    def wait_until(self, ready: Callable[[], bool], timeout_s: Any = DEFAULT) -> bool:
        """Serve every receive, mailbox and send until ready() holds; False once timeout_s has passed."""
        timeout = self.resolve_timeout(timeout_s)
        deadline = Deadline(timeout)
        backoff = Backoff(self.poll_sleep_s)
        while True:
            self.progress()
            if ready():
                return True
            if deadline.passed():
                return False
            backoff.pause(self._next_departure())

    def receive_buffer(self, out: Any, info: Optional[TensorInfo] = None) -> WireBuffer:
        """Return the wire buffer a payload for `out` is received into (staged when MPI cannot take it)."""
        return recv_buffer(out, self.cuda_aware, self._pool, info)

    def count_received(self, nbytes: int) -> None:
        """Count a payload that came in."""
        self.stats.received_bytes += nbytes

    # -- progress, waiting and draining ---------------------------------------------------------
    def _wait_some(self, requests: List[Any], statuses: List[Any], deadline: Deadline,
                   interrupt: Optional[Callable[[], None]] = None) -> Tuple[List[int], List[int]]:
        """Poll until some requests complete or fail (see test_each) or the deadline passes (nothing then)."""
        backoff = Backoff(self.poll_sleep_s)
        while True:  # MPI has no timed wait: poll, as a blocking MPI wait spins internally anyway
            self.flow.poll()
            if self._departures:
                self._depart()
            if interrupt is not None:
                interrupt()
            done, failed = test_each(requests, statuses)
            if done or failed:
                return done, failed
            if deadline.passed():
                return [], []
            backoff.pause(self._next_departure())

    def _progress_until(self, done: Callable[[], bool], deadline: Deadline,
                        interrupt: Optional[Callable[[], None]] = None) -> bool:
        """Serve all posted receives until done() holds or the deadline passes; return done()."""
        while not done():
            live = list(self._live.values()) + self._draining
            if not live:
                return done()
            completed, failed = self._wait_some([s.request for s in live], self._statuses_for(live), deadline,
                                                interrupt)
            if not completed and not failed:
                return done()
            self._settle(live, completed, failed)
        return True

    def _statuses_for(self, live: List[_Slot]) -> List[Any]:
        statuses = self._statuses
        while len(statuses) < len(live):
            statuses.append(MPI.Status())
        return statuses

    def _settle(self, live: List[_Slot], completed: List[int], failed: List[int]) -> None:
        """Advance the slots whose requests completed; end those whose source failed."""
        for j, i in enumerate(completed):
            self._complete(live[i], self._statuses[j])
        for i in failed:
            self.peer_failed(live[i].source)

    def progress(self) -> int:
        """Serve receives, mailboxes, credits and sends that can move now without blocking; return how many remain."""
        self.flow.poll()
        for box in self._mailboxes:
            box.progress()
        live = list(self._live.values()) + self._draining
        if live:
            self._settle(live, *test_each([s.request for s in live], self._statuses_for(live)))
        self._sweep_sends()
        return len(self._live) + len(self._sends)

    def pending(self) -> Tuple[List[Tuple[int, Envelope]], int]:
        """Return the receives still posted as (source, envelope) and the number of unfinished sends."""
        self._sweep_sends()
        slots = list(self._live.values()) + self._draining
        return [(s.source, s.envelope) for s in slots], len(self._sends)

    def drain(self, timeout_s: float = 0.0) -> DrainReport:
        """Let outstanding receives and sends finish for up to timeout_s, then cancel unanswered receives."""
        if timeout_s is None or timeout_s < 0:
            raise ValueError(f"timeout_s: got {timeout_s!r}, expected a number >= 0")
        deadline = Deadline(timeout_s)
        for slot in self._live.values():
            slot.awaited = False
        before = len(self._live) + len(self._draining)
        self._progress_until(lambda: not self._live and not self._draining, deadline)
        completed = before - len(self._live) - len(self._draining)
        cancelled = sum(self._retire(slot) for slot in list(self._live.values()))
        self._progress_until(lambda: not self._draining, deadline)
        backoff = Backoff(self.poll_sleep_s)
        while self._sends and not deadline.passed():
            self._sweep_sends()
            backoff.pause(self._next_departure())
        self._sweep_sends()
        return DrainReport(completed, cancelled, len(self._sends))

    def close(self, timeout_s: float = 0.0) -> DrainReport:
        """Drain, close the mailboxes, then free the duplicated communicator."""
        report = self.drain(timeout_s)
        for box in self._mailboxes:
            box.close()
        self._mailboxes = []
        self._drop(self.flow.close())
        if self._owns_comm and self.comm != MPI.COMM_NULL:
            self.comm.Free()
        return report

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- checks -------------------------------------------------------------------------------
    def _check_rank(self, rank: int, what: str) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise ValueError(f"{what}: got {rank!r}, expected a rank in 0..{self.size - 1}")

    def named(self, ranks: Sequence[int]) -> List[int]:
        """Return ranks of this transport's communicator as ranks in the job (the names messages give)."""
        return list(ranks) if self.job_ranks is None else [self.job_ranks[r] for r in ranks]

    def resolve_timeout(self, value: Any = DEFAULT) -> Optional[float]:
        """Return the watchdog timeout a wait uses: `value`, or the transport's when DEFAULT."""
        return self.timeout_s if value is DEFAULT else self._check_timeout(value)

    @staticmethod
    def _check_timeout(value: Any) -> Optional[float]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"timeout_s: got {value!r}, expected a positive number of seconds or None")
        return float(value)
