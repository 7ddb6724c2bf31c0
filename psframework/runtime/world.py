"""This process's MPI job: its rank, size and communicator, or a process alone when no launcher started it."""

from __future__ import annotations

import contextlib
import faulthandler
import sys
from typing import Any, Iterator, Optional, Tuple

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
