"""Roles of the ranks: rank 0 is the server, ranks 1..n are workers with their own communicator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

from mpi4py import MPI

SERVER = 0


@dataclass(frozen=True)
class Roles:
    """This rank's role, the worker ranks and the worker-only communicator (COMM_NULL on the server)."""

    comm: Any
    rank: int
    size: int
    workers: Tuple[int, ...]
    workers_comm: Any
    server: int = SERVER

    @property
    def is_server(self) -> bool:
        """Return whether this rank is the server."""
        return self.rank == self.server

    @property
    def is_worker(self) -> bool:
        """Return whether this rank is a worker."""
        return self.rank != self.server

    @property
    def n_workers(self) -> int:
        """Return the number of workers."""
        return len(self.workers)

    @property
    def worker_index(self) -> int:
        """Return this worker's index 0..n-1 (its rank in workers_comm); -1 on the server."""
        return self.rank - 1 if self.is_worker else -1

    def free(self) -> None:
        """Free the worker-only communicator."""
        if self.workers_comm != MPI.COMM_NULL:
            self.workers_comm.Free()


def setup_roles(comm: Any = None) -> Roles:
    """Split the communicator into the server (rank 0) and the workers; collective over comm."""
    comm = MPI.COMM_WORLD if comm is None else comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        raise ValueError(f"world size: got {size}, expected at least 2 MPI processes (1 server + n workers); "
                         "launch with mpiexec -n N python -m mpi4py -m psframework ...")
    color = MPI.UNDEFINED if rank == SERVER else 0
    workers_comm = comm.Split(color, rank)
    return Roles(comm, rank, size, tuple(range(1, size)), workers_comm)
