"""Network emulation: make every message cost the time it would take on a slower link.

An emulated link is a queue in front of the rank's network interface: each message takes
bytes / bandwidth of the link's time after the messages before it, then latency more to arrive, and
the transport posts it no earlier than that (`__call__` returns the time). The sender is not held
up meanwhile: it computes, or waits for replies, while its link is busy, as with a real interface
(the transport posts a message that is due at its next poll). Links of different ranks run in
parallel, and contention at the receiving end is not modelled. The bytes counted by the transport
are always the real ones. No MPI here: the emulator is the transport's send hook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

_SPIN_S = 2e-4  # sleep only up to this close to the deadline, then spin: sleep() overshoots by ~0.1 ms


@dataclass
class LinkEmulator:
    """A send hook that queues each message on an emulated link and says when it may be posted."""

    bandwidth_gbps: Optional[float] = None  # None: unlimited bandwidth
    latency_us: float = 0.0
    delayed_s: float = 0.0  # total time messages were held back (queueing, wire time and latency)
    messages: int = 0
    clock: Callable[[], float] = time.perf_counter
    free_at: float = 0.0  # when the link has carried every message queued so far

    def __post_init__(self) -> None:
        if self.bandwidth_gbps is not None and not self.bandwidth_gbps > 0:
            raise ValueError(f"bandwidth_gbps: got {self.bandwidth_gbps!r}, expected a positive number or None")
        if not self.latency_us >= 0:
            raise ValueError(f"latency_us: got {self.latency_us!r}, expected microseconds >= 0")

    def wire_s(self, nbytes: int) -> float:
        """Return how long `nbytes` occupy the link (serialisation)."""
        return 0.0 if self.bandwidth_gbps is None else 8.0 * nbytes / (self.bandwidth_gbps * 1e9)

    def transfer_s(self, nbytes: int) -> float:
        """Return how long `nbytes` take on an idle emulated link (serialisation plus latency)."""
        return self.wire_s(nbytes) + self.latency_us * 1e-6

    def __call__(self, dest: int, envelope: Any, nbytes: int) -> float:
        """Queue a message of `nbytes` on the link; return the clock time at which it has crossed."""
        now = self.clock()
        self.free_at = max(now, self.free_at) + self.wire_s(nbytes)
        due = self.free_at + self.latency_us * 1e-6
        self.messages += 1
        self.delayed_s += due - now
        return due

    def wait(self, nbytes: int) -> None:
        """Queue `nbytes` on the link and wait until they have crossed (for blocking transfers)."""
        sleep_until(self(-1, None, nbytes), self.clock)

    @property
    def active(self) -> bool:
        """Return whether the emulator delays anything."""
        return self.bandwidth_gbps is not None or self.latency_us > 0


def sleep_until(deadline: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Wait until `clock()` reaches `deadline`: sleep most of the way, spin the last fraction of a millisecond."""
    left = deadline - clock()
    if left > _SPIN_S:
        time.sleep(left - _SPIN_S)
    while clock() < deadline:
        pass


def link_emulator(bandwidth_gbps: Optional[float], latency_us: float) -> Optional[LinkEmulator]:
    """Return a LinkEmulator for these settings, or None when emulation is off."""
    emulator = LinkEmulator(bandwidth_gbps, latency_us)
    return emulator if emulator.active else None
