"""A helper thread that keeps the MPI library moving while a worker computes.

While a worker is inside a long convolution it makes no MPI calls, so the MPI takes none of the
messages sent to it: they hold the senders' message cells, and transfers of messages it has
already posted receives for stand still. During `busy()` a helper thread probes the MPI every
millisecond (a probe on a communicator of its own, which drives the library's progress and touches
none of the transport's state). It needs an MPI thread level of at least MPI_THREAD_SERIALIZED:
the thread's calls never overlap the worker's, a lock sees to that.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

PERIOD_S = 1e-3


class ProgressThread:
    """Probe the MPI from a daemon thread while `busy()` is active."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        from mpi4py import MPI

        self._comm = MPI.COMM_SELF.Dup()
        self._period_s = period_s
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._stop = False
        self.probes = 0
        self._thread = threading.Thread(target=self._run, name="psf-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from mpi4py import MPI

        while not self._stop:
            if not self._busy.wait(0.1):
                continue
            with self._lock:
                if self._busy.is_set() and not self._stop:
                    self._comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
                    self.probes += 1
            time.sleep(self._period_s)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Let the thread drive MPI progress while the body runs (the body must make no MPI calls)."""
        self._busy.set()
        try:
            yield
        finally:
            self._busy.clear()
            with self._lock:  # the thread's probe in flight, if any, is over once this is acquired
                pass

    def close(self) -> None:
        """Stop the thread and free its communicator."""
        self._stop = True
        self._busy.set()
        self._thread.join()
        self._comm.Free()


def start_progress_thread(enabled: bool) -> Optional[ProgressThread]:
    """Return a progress thread if `enabled` and the MPI's thread level allows one, else None."""
    if not enabled:
        return None
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        return None
    return ProgressThread()
