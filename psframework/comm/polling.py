"""How the transport's waits poll: the DEFAULT timeout, deadlines that skip time the process was stopped,
the pause between polls and the longest pause this node needs.

MPI has no timed wait, so every blocking wait of comm polls its requests; the mailbox, the
collectives and the transport share these pieces.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from psframework import environment

from .locality import ranks_per_node

DEFAULT: Any = object()  # "use the transport's timeout_s"


# Polling waits yield the core after each fruitless poll: free when a rank has its core to itself,
# and it keeps oversubscribed nodes (more ranks than cores) moving.
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
FIRST_SLEEP_S = 20e-6


STALL_S = 0.5  # a gap this long between two polls of one wait: this process did not run meanwhile


class Deadline:
    """When a wait gives up: after `timeout_s` of waiting, not counting time this process was stopped.

    A process that was frozen (SIGSTOP), swapped out or descheduled finds its deadline long past when
    it runs again, though no peer was silent: a gap of more than STALL_S between two polls moves the
    deadline on by the gap.
    """

    __slots__ = ("end", "last")

    def __init__(self, timeout_s: Optional[float]) -> None:
        now = time.monotonic()
        self.end = None if timeout_s is None else now + timeout_s
        self.last = now

    def passed(self) -> bool:
        """Return whether the wait has lasted its timeout (call it at every poll)."""
        now = time.monotonic()
        if self.end is not None and now - self.last > STALL_S:
            self.end += now - self.last
        self.last = now
        return self.end is not None and now >= self.end


class Backoff:
    """Pause between polls of a wait: yield the core, or sleep, doubling up to `max_sleep_s`.

    With a core per rank (`max_sleep_s` 0) a wait polls at full speed, as a blocking MPI wait spins.
    When ranks outnumber cores every poll takes the CPU from the ranks that compute, so a wait sleeps
    from its first fruitless poll: on the 2-core machine of the benchmarks this took a sixth off both
    the iteration time and the processor time of sazd (5 ranks), where a 2 ms spin before sleeping had
    been meant for large transfers. Intranode payloads are copied by the receiver in one poll (CMA).
    A payload coming over the network moves only while its receiver polls (UCX's TCP transport reads
    a little of it per poll): while `moving()` says one is on its way, a wait yields instead of
    sleeping. With 1 ms sleeps 2 MiB took 45 ms to reach each of 4 hosts on 10 Gb/s links, against
    17 ms polled without pause (docs/design.md#polling).
    """

    __slots__ = ("max_sleep_s", "sleep_s", "moving")

    def __init__(self, max_sleep_s: float, moving: Optional[Callable[[], bool]] = None) -> None:
        self.max_sleep_s = max_sleep_s
        self.sleep_s = FIRST_SLEEP_S
        self.moving = moving

    def pause(self, until: Optional[float] = None) -> None:
        """Wait a little before the next poll; not past `until` (time.perf_counter), when given."""
        if self.max_sleep_s <= 0.0 or (self.moving is not None and self.moving()):
            _yield()
            return
        sleep_s = self.sleep_s if until is None else min(self.sleep_s, max(0.0, until - time.perf_counter()))
        time.sleep(sleep_s)
        self.sleep_s = min(2.0 * self.sleep_s, self.max_sleep_s)


def auto_poll_sleep(comm: Any, cores: Optional[int] = None) -> float:
    """Return PSF_POLL_SLEEP_S if set, else 0 (spin) when this node has a core per rank, else 1 ms.

    `cores`: the cores this node's ranks may run on together (locality.node_cores); by default this rank's,
    which undercounts them where every rank is bound to a core of its own.
    """
    configured = environment.poll_sleep_s()
    if configured is not None:
        return configured
    ranks, _ = ranks_per_node(comm)
    return 0.0 if ranks <= (environment.usable_cores() if cores is None else cores) else 1e-3
