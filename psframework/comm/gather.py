"""First k of n: receives pre-posted from several sources for one envelope, and the wait for the first k replies."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from .envelope import Envelope
from .errors import TooFewWorkers, WatchdogTimeout
from .polling import DEFAULT, Deadline
from .receives import ARRIVED, DONE, FAILED, Receives, Slot


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


class GatherPath(Protocol):
    """What a gather uses of its transport (a Transport): its receives, the watchdog, the names of ranks."""

    receives: Receives

    def resolve_timeout(self, value: Any = DEFAULT) -> Optional[float]:
        """Return the watchdog timeout a wait uses."""

    def named(self, ranks: Sequence[int]) -> List[int]:
        """Return ranks of the communicator as ranks in the job."""


class _Settled(Exception):
    """Ends a gather's wait early: its `settle` said the replies in are enough."""


class Gather:
    """Receives pre-posted from several sources for one envelope; wait for the first k."""

    def __init__(self, transport: GatherPath, envelope: Envelope, slots: Dict[int, Slot]) -> None:
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
            if have + sum(1 for s in slots if s.state != DONE) < k:
                failed = [s.source for s in slots if s.outcome == FAILED]
                gone = [s.source for s in slots if s.state == DONE and s.outcome not in (ARRIVED, FAILED)]
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
                done = self.transport.receives.progress_until(enough, deadline, poll)
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
            self.transport.receives.progress_until(lambda: all(s.state == DONE for s in slots), Deadline(timeout_s))
        finally:
            if not keep:
                self.release()
        return {s.source: s.out for s in slots if s.outcome == ARRIVED}

    def release(self) -> None:
        """Stop awaiting: replies still outstanding are drained into scratch memory when they come."""
        for slot in self._slots.values():
            slot.awaited = False
