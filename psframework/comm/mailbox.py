"""A mailbox that takes every message from one source off the wire as soon as it arrives.

The transport's mailbox mode (`Transport.mailbox(source)`): a rank that falls behind (a straggler)
still receives its messages while it computes or sleeps, whatever their tags, so its sender's
buffers and queues never fill up behind it. Messages are kept by envelope until taken. Payloads
arrive through the transport's own receive side (`receives.receive_buffer`, `receives.count_received`):
the mailbox knows its transport only as that `ReceivePath`, so the transport imports the mailbox and
not back.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from mpi4py import MPI

from .envelope import Envelope, Header, decode_header, new_header_buffer
from .errors import WatchdogTimeout
from .flow import FlowControl, test_one
from .polling import DEFAULT


class ReceiveSide(Protocol):
    """What a mailbox uses of its transport's receive side (a Receives): buffers, counts, failures."""

    def allocate(self, dtype: str, shape: Tuple[int, ...]) -> Any:
        """Return an empty tensor to receive a payload into."""

    def receive_buffer(self, out: Any) -> Any:
        """Return the wire buffer a payload for `out` is received into."""

    def count_received(self, nbytes: int) -> None:
        """Count a payload that came in."""

    def fail(self, rank: int) -> None:
        """End everything to and from a rank the MPI reported dead."""


class ReceivePath(Protocol):
    """What a mailbox uses of its transport (a Transport): the communicator, credits, receive side, waits."""

    comm: Any
    flow: FlowControl
    stats: Any  # received_messages is counted here
    receives: ReceiveSide

    def wait_until(self, ready: Callable[[], bool], timeout_s: Any = DEFAULT) -> bool:
        """Serve every receive and send until ready() holds; False once timeout_s has passed."""

    def resolve_timeout(self, value: Any = DEFAULT) -> Optional[float]:
        """Return the watchdog timeout a wait uses."""

    def named(self, ranks: Sequence[int]) -> List[int]:
        """Return ranks of the communicator as ranks in the job."""


class Mailbox:
    """Receive everything `source` sends on `transport`, in order, and hand it out by envelope."""

    def __init__(self, transport: ReceivePath, source: int) -> None:
        self.transport = transport
        self.source = source
        self.kept: Dict[Tuple[int, int], Tuple[Header, Any]] = {}  # (tag, iteration) -> message
        self.newest = -1  # the latest iteration of any message seen from the source
        self._header = new_header_buffer()
        self._pending: Optional[Tuple[Header, Any, Any]] = None  # a payload on its way
        self._request = self._post_header()

    def _post_header(self) -> Any:
        return self.transport.comm.Irecv([self._header, MPI.BYTE], self.source, MPI.ANY_TAG)

    def moving(self) -> bool:
        """Return whether a payload from the source is on its way."""
        return self._pending is not None

    def progress(self) -> None:
        """Take in every message that has arrived by now."""
        status = MPI.Status()
        while self._request is not None:
            outcome = test_one(self._request, status)
            if not outcome:
                if outcome is None:  # the source died: nothing more comes from it
                    self._request = None
                    self.transport.receives.fail(self.source)
                return
            tag = status.Get_tag()
            if self._pending is None:
                header = decode_header(self._header)
                self.transport.flow.received(self.source, header.ack, header.paced)
                if header.envelope.tag != tag:
                    raise RuntimeError(f"message from rank {self.source}: header says {header.envelope}, "
                                       f"tag {tag} does not match")
                if header.nbytes:
                    out = self.transport.receives.allocate(header.dtype, header.shape)
                    wire = self.transport.receives.receive_buffer(out)
                    self._pending = (header, out, wire)
                    # The payload follows its header with the same tag: this receive matches it first.
                    self._request = self.transport.comm.Irecv([wire.data, MPI.BYTE], self.source, tag)
                    continue
                self._keep(header, self.transport.receives.allocate(header.dtype, header.shape))
            else:
                header, out, wire = self._pending
                self._pending = None
                wire.done(received=True)
                self._keep(header, out)
            self._request = self._post_header()

    def _keep(self, header: Header, data: Any) -> None:
        self.newest = max(self.newest, header.envelope.iteration)
        self.transport.stats.received_messages += 1
        self.transport.receives.count_received(header.nbytes)
        self.kept[(header.envelope.tag, header.envelope.iteration)] = (header, data)

    def has(self, envelope: Envelope) -> bool:
        """Return whether the message of `envelope` has arrived."""
        self.progress()
        return self.holds(envelope)

    def holds(self, envelope: Envelope) -> bool:
        """Return whether the message of `envelope` is among those taken in so far (no MPI calls)."""
        return (envelope.tag, envelope.iteration) in self.kept

    def wait_any(self, envelopes: Sequence[Envelope], timeout_s: Any = DEFAULT,
                 interrupt: Optional[Callable[[], None]] = None) -> int:
        """Wait until one of `envelopes` has arrived; return its position (the first, if several), not taking it.

        `interrupt`, if given, is called at every poll: it may raise to end the wait early.
        """
        keys = [(e.tag, e.iteration) for e in envelopes]
        found: List[int] = []

        def ready() -> bool:
            if interrupt is not None:
                interrupt()
            found[:] = [position for position, key in enumerate(keys) if key in self.kept][:1]
            return bool(found)

        if not self.transport.wait_until(ready, timeout_s):
            timeout = self.transport.resolve_timeout(timeout_s)
            raise WatchdogTimeout(self.transport.named([self.source]), " or ".join(map(str, envelopes)), timeout or 0.0)
        return found[0]

    def iterations(self, envelope: Envelope) -> List[int]:
        """Return the iterations of the messages kept with the envelope's kind, layer and phase, ascending."""
        return sorted(it for tag, it in self.kept if tag == envelope.tag)

    def discard(self, keep: Callable[[Envelope], bool]) -> int:
        """Drop every message kept so far whose envelope `keep` rejects; return how many."""
        stale = [key for key, (header, _) in self.kept.items() if not keep(header.envelope)]
        for key in stale:
            del self.kept[key]
        return len(stale)

    def take(self, envelope: Envelope, timeout_s: Any = DEFAULT, interrupt: Optional[Callable[[], None]] = None) -> Any:
        """Wait for the message of `envelope` and return its tensor; the watchdog bounds the wait."""
        self.wait_any([envelope], timeout_s, interrupt)
        header, data = self.kept.pop((envelope.tag, envelope.iteration))
        if header.envelope != envelope:
            raise RuntimeError(f"message from rank {self.source}: expected {envelope}, got {header.envelope}")
        return data

    def close(self) -> None:
        """Cancel the receive waiting for a next message (none may come any more)."""
        if self._request is not None and self._pending is None:
            self._request.Cancel()
            self._request.Wait()
        self._request = None
