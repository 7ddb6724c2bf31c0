"""This process's MPI job: its rank, size and communicator, or a process alone when no launcher started it;
and which of its ranks reports a fatal error."""

from __future__ import annotations

import contextlib
import faulthandler
import struct
import sys
import time
from typing import Any, Iterator, List, Optional, Tuple

from psframework import environment


def mpi_world() -> Tuple[int, int, Optional[Any]]:
    """Return (rank, size, comm) of the MPI job, or (0, 1, None) when MPI is not running."""
    if "mpi4py" not in sys.modules and not environment.launched_by_mpi():
        return 0, 1, None
    with _init_watchdog():
        from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size(), comm


@contextlib.contextmanager
def _init_watchdog() -> Iterator[None]:
    """Bound the wait in MPI_Init (PSF_MPI_INIT_TIMEOUT_S) when MPI is not initialised yet.

    MPI_Init holds the interpreter while it waits for the other ranks: faulthandler's C-level watchdog
    turns a start-up that never completes into a traceback and exit status 1 instead of a silent hang.
    """
    timeout_s = environment.mpi_init_timeout_s()
    armed = "mpi4py.MPI" not in sys.modules
    if armed:
        try:
            faulthandler.dump_traceback_later(timeout_s, exit=True, file=sys.__stderr__)
        except (ValueError, OSError, AttributeError):  # no standard error with a file descriptor
            armed = False
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


CLAIM = struct.Struct("<dq")  # (time the error was seen, rank)
CLAIM_TAG = 1


class FirstError:
    """Let one rank of the job print a fatal error's line: the one that saw its error first.

    Several ranks can fail at once (two servers' watchdogs on the same silent worker): each tells every
    other rank when it saw its error, on a communicator of its own, and waits `window_s` for their
    claims; only the earliest (the lowest rank on a tie) prints. The others stay silent and leave the
    abort to it. A claim needs no answer, so a frozen or dead rank holds nobody up.
    """

    def __init__(self, comm: Any, window_s: float) -> None:
        self.comm = comm.Dup()  # collective: every rank builds it at the same point of the start
        self.rank, self.size, self.window_s = comm.Get_rank(), comm.Get_size(), window_s
        self.sends: List[Any] = []  # the claims in flight, kept until the abort (they need no completion)

    def first(self, seen_at: Optional[float] = None) -> bool:
        """Claim the report of an error seen at `seen_at` (now by default); return whether this rank makes it."""
        from mpi4py import MPI

        mine = (time.time() if seen_at is None else seen_at, self.rank)
        payload = bytearray(CLAIM.pack(*mine))
        self.sends = [self.comm.Isend([payload, MPI.BYTE], dest=r, tag=CLAIM_TAG)
                      for r in range(self.size) if r != self.rank]
        earliest, box = mine, bytearray(CLAIM.size)
        deadline = time.monotonic() + self.window_s
        while time.monotonic() < deadline:
            # Probed, not posted: a run that ends well leaves no receive pending at MPI_Finalize.
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=CLAIM_TAG):
                self.comm.Recv([box, MPI.BYTE], source=MPI.ANY_SOURCE, tag=CLAIM_TAG)
                earliest = min(earliest, CLAIM.unpack(bytes(box)))
            time.sleep(0.01)
        return earliest == mine
