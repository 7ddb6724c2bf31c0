"""Roles of the ranks: G groups of one server and n workers; rank 0 is the lead server.

Group g holds world ranks g*(n+1) .. g*(n+1)+n: its server first, then worker j = 0..n-1 (packet
index j). Every group has its own communicator in which its server is rank 0 and its workers 1..n,
so the rounds of one group are the rounds of a one-server job. Across groups, the servers share a
communicator (rank g = group g) and so do the G workers of each packet index (their coded weights
are one packet); every worker of the job shares one more (data-parallel reductions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

from mpi4py import MPI

SERVER = 0


@dataclass(frozen=True)
class Roles:
    """This rank's role in its group, the group's worker ranks and the communicators across groups.

    `comm`, `rank`, `size`, `workers` and `workers_comm` are the group's (with one group, the job's);
    `world_rank` and `groups` place the group in the job. A communicator this rank is not part of is COMM_NULL.
    """

    comm: Any
    rank: int
    size: int
    workers: Tuple[int, ...]
    workers_comm: Any
    server: int = SERVER
    world: Any = None  # the job's communicator
    world_rank: int = 0
    group: int = 0
    groups: int = 1
    servers_comm: Any = None  # the G servers (only with G > 1)
    packet_comm: Any = None  # the G workers of this packet index (only with G > 1)
    all_workers_comm: Any = None  # every worker of every group (only with G > 1)
    job_workers: Tuple[int, ...] = ()  # the world ranks of every worker of every group
    job_ranks: Tuple[int, ...] = ()  # the world rank of each rank of `comm`
    owned: Tuple[Any, ...] = ()  # the communicators made for these roles, freed by `free`

    @property
    def is_server(self) -> bool:
        """Return whether this rank is a server."""
        return self.rank == self.server

    @property
    def is_lead(self) -> bool:
        """Return whether this rank is the lead server (world rank 0)."""
        return self.world_rank == 0

    @property
    def is_worker(self) -> bool:
        """Return whether this rank is a worker."""
        return self.rank != self.server

    @property
    def worker_index(self) -> int:
        """Return this worker's index 0..n-1 in its group (its packet index); -1 on a server."""
        return self.rank - 1 if self.is_worker else -1

    def free(self) -> None:
        """Free the communicators made for these roles (the servers' own: see comm.collective.Peers.free)."""
        for comm in self.owned:
            if comm != MPI.COMM_NULL:
                comm.Free()


def setup_roles(comm: Any = None, groups: int = 1) -> Roles:
    """Split the communicator into `groups` groups of a server and its workers; collective over comm."""
    comm = MPI.COMM_WORLD if comm is None else comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if groups == 1 and size < 2:
        raise ValueError(f"world size: got {size}, expected at least 2 MPI processes (1 server + n workers); "
                         "launch with mpiexec -n N python -m mpi4py -m psframework ...")
    if size < 2 * groups or size % groups:
        raise ValueError(f"world size: got {size}, expected {groups} groups of 1 server + n workers "
                         f"(a multiple of {groups}, at least {2 * groups}); launch with mpiexec -n G*(n+1) "
                         "python -m mpi4py -m psframework ...")
    group_size = size // groups
    group, local = divmod(rank, group_size)
    group_comm = comm if groups == 1 else comm.Split(group, rank)
    workers_comm = group_comm.Split(MPI.UNDEFINED if local == SERVER else 0, local)
    across = dict(servers_comm=None, packet_comm=None, all_workers_comm=None)
    if groups > 1:
        across["servers_comm"] = comm.Split(0 if local == SERVER else MPI.UNDEFINED, rank)
        across["packet_comm"] = comm.Split(MPI.UNDEFINED if local == SERVER else local, rank)
        across["all_workers_comm"] = comm.Split(MPI.UNDEFINED if local == SERVER else 0, rank)
    job_workers = tuple(g * group_size + r for g in range(groups) for r in range(1, group_size))
    owned = (workers_comm, across["packet_comm"], across["all_workers_comm"]) + ((group_comm,) if groups > 1 else ())
    job_ranks = tuple(group * group_size + r for r in range(group_size))
    return Roles(group_comm, local, group_size, tuple(range(1, group_size)), workers_comm, SERVER, comm, rank,
                 group, groups, **across, job_workers=job_workers, job_ranks=job_ranks,
                 owned=tuple(c for c in owned if c is not None))


def shard_roles(roles: Roles) -> List[Roles]:
    """Return this rank's roles in the communicators of the parameter shards: shard s is server s with every
    worker of the job (server rank 0, workers 1..N in job order). A server gets its own shard's, a worker
    every shard's, in shard order. Collective over the job's communicator."""
    world, made = roles.world, []
    everyone = world.Get_group()
    for s in range(roles.groups):
        members = everyone.Incl([s * roles.size, *roles.job_workers])
        comm = world.Create(members)
        members.Free()
        if comm != MPI.COMM_NULL:
            size = comm.Get_size()
            made.append(Roles(comm, comm.Get_rank(), size, tuple(range(1, size)), MPI.COMM_NULL, SERVER, world,
                              roles.world_rank, job_workers=roles.job_workers,
                              job_ranks=(s * roles.size, *roles.job_workers), owned=(comm,)))
    everyone.Free()
    return made
