"""Sums among ranks of one role: the servers of the groups, the holders of one packet index.

A sum is a nonblocking MPI allreduce over host float32 values. Its wait polls, as the transport's
waits do: between polls it runs a `serve` callback (a worker keeps taking its server's messages
while it waits for its peers) and gives up with a watchdog error naming the peers after the
timeout. Payload bytes are counted as each rank's contribution out and the sum back in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .errors import WatchdogTimeout
from .polling import Backoff, Deadline


def wait_quietly(request: Any, max_sleep_s: float) -> None:
    """Wait for a nonblocking MPI request, sleeping up to `max_sleep_s` between tests.

    A blocking MPI wait spins: where ranks outnumber cores, ranks waiting at start-up for rank 0 would
    take the CPU from it.
    """
    backoff = Backoff(max_sleep_s)
    while not request.Test():
        backoff.pause()


@dataclass
class CollectiveStats:
    """Payload bytes this rank put into sums and took out of them, and seconds it waited for them."""

    sent_bytes: int = 0
    received_bytes: int = 0
    wait_s: float = 0.0


class Sum:
    """One sum in flight: `wait` returns the summed values (in the array that was given)."""

    def __init__(self, peers: "Peers", values: np.ndarray, request: Any, what: str) -> None:
        self.peers, self.values, self.request, self.what = peers, values, request, what

    def done(self) -> bool:
        """Return whether the sum has completed (without waiting)."""
        return self.request is None or bool(self.request.Test())

    def wait(self, serve: Optional[Callable[[], Any]] = None) -> np.ndarray:
        """Wait for the sum (running `serve` between polls); return it. The watchdog names the peers."""
        import time

        t0 = time.perf_counter()
        deadline, backoff = Deadline(self.peers.timeout_s), Backoff(self.peers.poll_sleep_s)
        while not self.done():
            if serve is not None:
                serve()
            if deadline.passed():
                others = [name for i, name in enumerate(self.peers.names) if i != self.peers.rank]
                raise WatchdogTimeout(others, self.what, self.peers.timeout_s or 0.0)
            backoff.pause()
        self.request = None
        self.peers.stats.wait_s += time.perf_counter() - t0
        return self.values


class Peers:
    """Ranks of one role that sum together; `names` are their world ranks, for the watchdog's message."""

    def __init__(self, comm: Any, names: Sequence[int], timeout_s: Optional[float], poll_sleep_s: float = 0.0,
                 send_hook: Optional[Callable[[int, Any, int], Optional[float]]] = None) -> None:
        self.comm = comm
        self.names = list(names)
        self.timeout_s = timeout_s
        self.poll_sleep_s = poll_sleep_s
        self.send_hook = send_hook  # the rank's emulated link, as for its messages: a sum's payload crosses it too
        self.stats = CollectiveStats()

    @property
    def size(self) -> int:
        """Return how many ranks sum together."""
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        """Return this rank's place among its peers."""
        return self.comm.Get_rank()

    def start_sum(self, values: np.ndarray, what: str) -> Sum:
        """Start summing a contiguous float32 or float64 host array over the peers, in place."""
        floats = (np.float32, np.float64)
        if not (isinstance(values, np.ndarray) and values.flags.c_contiguous and values.dtype in floats):
            raise ValueError(f"sum of {what}: expected a contiguous float32 or float64 NumPy array")
        self.stats.sent_bytes += values.nbytes
        self.stats.received_bytes += values.nbytes
        if self.send_hook is not None:  # a sum is a blocking transfer: wait until the link has carried it
            due = self.send_hook(-1, None, values.nbytes)
            if due is not None:
                time.sleep(max(0.0, due - time.perf_counter()))
        if self.size == 1:
            return Sum(self, values, None, what)
        request = self.comm.Iallreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        return Sum(self, values, request, what)

    def sum(self, values: np.ndarray, what: str, serve: Optional[Callable[[], Any]] = None) -> np.ndarray:
        """Return the sum over the peers of `values` (in place)."""
        return self.start_sum(values, what).wait(serve)

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """Return `obj` from the root peer (pickled; small objects and start-up state)."""
        return self.comm.bcast(obj, root=root)

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        """Return every peer's `obj` on the root (in peer order), None elsewhere."""
        return self.comm.gather(obj, root=root)

    def free(self) -> None:
        """Free the communicator (collective over the peers)."""
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
