"""The ranks that share this node: the launcher's variables, else an MPI shared-memory split (no MPI on import)."""

from __future__ import annotations

from typing import Any, FrozenSet, Mapping, Optional, Tuple

from psframework import environment


def shared_node_comm(comm: Any = None) -> Any:
    """Return a communicator of the ranks sharing this node's memory (collective; free it after use)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def ranks_per_node(comm: Any = None, environ: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """Return the ranks on this node and where that came from (launcher variables, else a shared split)."""
    launcher = environment.local_size_vars(environ)
    if launcher is not None:
        return launcher
    try:
        node = shared_node_comm(comm)
    except ImportError:
        return 1, "no MPI"
    try:
        return node.Get_size(), "MPI_COMM_TYPE_SHARED split"
    finally:
        node.Free()


def node_cores(comm: Any = None) -> int:
    """Return how many cores the ranks sharing this node may run on together: the union of their CPU affinities
    (collective). Ranks bound to a core each count their own cores; unbound ones all count the same."""
    cores = environment.affinity()
    try:
        node = shared_node_comm(comm)
    except ImportError:
        return len(cores)
    try:
        return len(set().union(*node.allgather(cores)))
    finally:
        node.Free()


def off_node_ranks(comm: Any) -> FrozenSet[int]:
    """Return the ranks of `comm` that do not share this rank's memory: MPI reaches them by network (collective)."""
    node = shared_node_comm(comm)
    node_group, group = node.Get_group(), comm.Get_group()
    try:
        here = node_group.Translate_ranks(None, group)
    finally:
        node_group.Free()
        group.Free()
        node.Free()
    return frozenset(range(comm.Get_size())) - frozenset(here)
