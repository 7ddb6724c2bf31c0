"""Enveloped point-to-point messages, first-k-of-n receives, a watchdog and draining of late replies.

Every message goes as two MPI messages with the same tag, sent back to back: a 144-byte header
(kind, iteration, layer, phase, dtype, shape, size) and the payload bytes. The tag holds kind,
layer and phase; the full iteration is in the header and is checked on receipt, so a late reply of
round t is never taken for a reply of round t+1. The transport owns its send side (outbox.py: flow
control, the send hook), its receive side (receives.py: posted receives, late replies drained,
later ones kept aside), its first-k gathers (gather.py) and its mailboxes (mailbox.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Set

import numpy as np
from mpi4py import MPI

from .buffers import StagingPool, tensor_info
from .cuda import resolve_cuda_aware
from .envelope import MAX_TAG, MIN_TAG_UB, Envelope
from .gather import Gather
from .locality import off_node_ranks
from .mailbox import Mailbox
from .outbox import Outbox, SendHandle, SendHook
from .polling import DEFAULT, Backoff, Deadline, auto_poll_sleep
from .receives import Receives
from .stats import TransportStats


@dataclass
class DrainReport:
    """What a drain did: late replies completed, receives cancelled, sends still in flight."""

    completed: int
    cancelled: int
    unfinished_sends: int


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
    `outbox` is the send side (kept-back messages, signs of life, dropping) and `receives` the
    receive side (receive buffers, posted receives).
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
        self.off_node = off_node_ranks(self.comm)  # their payloads come over the network: see `moving`
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
        pool = StagingPool()
        self._mailboxes: List[Mailbox] = []
        self.failed: Set[int] = set()  # ranks the MPI reported failed (dead): nothing more goes to or comes from them
        self.outbox = Outbox(self, base, window, pool, self._peer_failed)
        self.flow = self.outbox.flow
        self.receives = Receives(self, pool, self.outbox, self._peer_failed)

    # -- sending ------------------------------------------------------------------------------
    def isend(self, dest: int, data: Any, envelope: Envelope, *, urgent: bool = False) -> SendHandle:
        """Start sending `data` to `dest`; do not modify it until the handle says it has left.

        With a window, a message beyond it is kept back until `dest` acknowledges earlier ones;
        `urgent` posts it at once all the same (for the rare control message).
        """
        self._check_rank(dest, "dest")
        return self.outbox.submit(dest, data, envelope, urgent)

    def send(self, dest: int, data: Any, envelope: Envelope, *, timeout_s: Any = DEFAULT) -> None:
        """Send `data` to `dest` and wait until it has left."""
        self.isend(dest, data, envelope).wait(timeout_s)

    def _peer_failed(self, rank: int) -> None:
        """Note that the MPI reported `rank` failed: drop what waits for it, end the receives from it."""
        if rank in self.failed:
            return
        self.failed.add(rank)
        self.outbox.discard(self.flow.drop(rank))
        self.receives.abandon(rank)

    # -- receiving ----------------------------------------------------------------------------
    def recv(self, source: int, envelope: Envelope, out: Any = None, *, timeout_s: Any = DEFAULT) -> Any:
        """Receive one message; into `out` if given, else into a new CPU tensor shaped as sent."""
        self._check_rank(source, "source")
        info = None if out is None else tensor_info(out)
        if self.receives.live or self.outbox.unfinished():
            self.progress()
        slot = self.receives.open(source, envelope, out, info)
        return self.receives.wait(slot, self.resolve_timeout(timeout_s))

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
        slots = {s: self.receives.open(s, envelope, None if out is None else out[s], infos[s]) for s in sources}
        return Gather(self, envelope, slots)

    def has_message(self, source: int, kind: int, layer: int = 0, phase: int = 0) -> bool:
        """Return whether a message from `source` with this kind, layer and phase waits unclaimed."""
        return self.receives.has_message(source, kind, layer, phase)

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

    # -- progress, waiting and draining ---------------------------------------------------------
    def wait_until(self, ready: Callable[[], bool], timeout_s: Any = DEFAULT) -> bool:
        """Serve every receive, mailbox and send until ready() holds; False once timeout_s has passed."""
        timeout = self.resolve_timeout(timeout_s)
        deadline = Deadline(timeout)
        backoff = Backoff(self.poll_sleep_s, self.moving)
        while True:
            self.progress()
            if ready():
                return True
            if deadline.passed():
                return False
            backoff.pause(self.outbox.next_departure())

    def moving(self) -> bool:
        """Return whether a payload is on its way to this rank over the network (MPI moves it only while polled)."""
        return self.receives.moving(self.off_node) or any(b.moving() for b in self._mailboxes
                                                          if b.source in self.off_node)

    def progress(self) -> int:
        """Serve receives, mailboxes, credits and sends that can move now without blocking; return how many remain."""
        self.flow.poll()
        for box in self._mailboxes:
            box.progress()
        self.receives.poll()
        self.outbox.sweep()
        return len(self.receives.live) + self.outbox.unfinished()

    def drain(self, timeout_s: float = 0.0) -> DrainReport:
        """Let outstanding receives and sends finish for up to timeout_s, then cancel unanswered receives."""
        if timeout_s is None or timeout_s < 0:
            raise ValueError(f"timeout_s: got {timeout_s!r}, expected a number >= 0")
        deadline = Deadline(timeout_s)
        completed, cancelled = self.receives.drain(deadline)
        return DrainReport(completed, cancelled, self.outbox.flush(deadline))

    def close(self, timeout_s: float = 0.0) -> DrainReport:
        """Drain, close the mailboxes, then free the duplicated communicator."""
        report = self.drain(timeout_s)
        for box in self._mailboxes:
            box.close()
        self._mailboxes = []
        self.outbox.discard(self.flow.close())
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
