"""Network emulation: make every message cost the time it would take on a slower link.

An emulated link delays the sender: before a message is posted, the sending rank waits
bytes / bandwidth + latency, so the receiver cannot see it earlier than a real link of that speed
would deliver it. Messages a rank sends one after another queue on its link (one network interface
per rank); links of different ranks run in parallel, and contention at the receiving end is not
modelled. The bytes counted by the transport are always the real ones. No MPI here: the emulator
is the transport's send hook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

_SPIN_S = 2e-4  # sleep only up to this close to the deadline, then spin: sleep() overshoots by ~0.1 ms


@dataclass
class LinkEmulator:
    """A send hook that holds each message back for its transfer time on an emulated link."""

    bandwidth_gbps: Optional[float] = None  # None: unlimited bandwidth
    latency_us: float = 0.0
    delayed_s: float = 0.0  # total time senders were held back
    messages: int = 0
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        if self.bandwidth_gbps is not None and not self.bandwidth_gbps > 0:
            raise ValueError(f"bandwidth_gbps: got {self.bandwidth_gbps!r}, expected a positive number or None")
        if not self.latency_us >= 0:
            raise ValueError(f"latency_us: got {self.latency_us!r}, expected microseconds >= 0")

    def transfer_s(self, nbytes: int) -> float:
        """Return how long `nbytes` take on the emulated link (serialisation plus latency)."""
        wire = 0.0 if self.bandwidth_gbps is None else 8.0 * nbytes / (self.bandwidth_gbps * 1e9)
        return wire + self.latency_us * 1e-6

    def __call__(self, dest: int, envelope: Any, nbytes: int) -> None:
        """Wait until the message would have crossed the link."""
        seconds = self.transfer_s(nbytes)
        self.messages += 1
        if seconds <= 0:
            return
        start = self.clock()
        deadline = start + seconds
        if seconds > _SPIN_S:
            time.sleep(seconds - _SPIN_S)
        while self.clock() < deadline:
            pass
        self.delayed_s += self.clock() - start

    @property
    def active(self) -> bool:
        """Return whether the emulator delays anything."""
        return self.bandwidth_gbps is not None or self.latency_us > 0


def link_emulator(bandwidth_gbps: Optional[float], latency_us: float) -> Optional[LinkEmulator]:
    """Return a LinkEmulator for these settings, or None when emulation is off."""
    emulator = LinkEmulator(bandwidth_gbps, latency_us)
    return emulator if emulator.active else None
