"""Threads per rank: share the node's cores among the ranks placed on it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from .binding import _int_var, shared_node_comm

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class ThreadPlan:
    """Threads for this rank and the figures they were derived from."""

    threads: int
    cores_per_node: int
    ranks_per_node: int
    usable_cores: int  # cores this process may run on (its CPU affinity)
    source: str  # where ranks_per_node came from, or 'override'


def usable_cores() -> int:
    """Return how many cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _slurm_tasks_on_node(value: str, node_id: int) -> Optional[int]:
    """Return the task count of node `node_id` from a Slurm list such as '4(x2),3'."""
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def ranks_per_node(comm: Any = None, environ: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """Return the ranks on this node and where that came from (launcher variables, else a shared split)."""
    environ = os.environ if environ is None else environ
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        value = _int_var(environ, name)
        if value:
            return value, name
    if "SLURM_LOCALID" in environ and "SLURM_STEP_TASKS_PER_NODE" in environ:
        count = _slurm_tasks_on_node(environ["SLURM_STEP_TASKS_PER_NODE"], _int_var(environ, "SLURM_NODEID") or 0)
        if count:
            return count, "SLURM_STEP_TASKS_PER_NODE"
    try:
        node = shared_node_comm(comm)
    except ImportError:
        return 1, "no MPI"
    try:
        return node.Get_size(), "MPI_COMM_TYPE_SHARED split"
    finally:
        node.Free()


def plan_threads(comm: Any = None, *, threads: Optional[int] = None, cores_per_node: Optional[int] = None,
                 ranks: Optional[int] = None, environ: Optional[Mapping[str, str]] = None) -> ThreadPlan:
    """Return threads per rank: the node's cores over its ranks, within this process's affinity.

    `threads` (> 0) overrides the result; 0 or None means automatic. `cores_per_node` defaults to
    SLURM_CPUS_ON_NODE, else the machine's core count; `ranks` (ranks per node) to the launcher's
    variables, else a shared-memory split of comm.
    """
    environ = os.environ if environ is None else environ
    for name, value in (("threads", threads), ("cores_per_node", cores_per_node), ("ranks", ranks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}: got {value!r}, expected an integer >= 0 (0 = automatic)")
    cores = cores_per_node or _int_var(environ, "SLURM_CPUS_ON_NODE") or os.cpu_count() or 1
    usable = usable_cores()
    if ranks:
        per_node, source = ranks, "given"
    else:
        per_node, source = ranks_per_node(comm, environ)
    if threads:
        return ThreadPlan(threads, cores, per_node, usable, "override")
    return ThreadPlan(max(1, min(cores // per_node, usable)), cores, per_node, usable, source)


def apply_threads(plan: ThreadPlan) -> None:
    """Set torch, OpenMP and BLAS thread counts of this process to the plan's."""
    n = plan.threads
    for name in THREAD_VARIABLES:  # for libraries loaded later and for child processes
        os.environ[name] = str(n)
    import torch

    torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=n)


def configure_threads(comm: Any = None, threads: Optional[int] = None, **kwargs: Any) -> ThreadPlan:
    """Plan and apply threads per rank; return the plan."""
    plan = plan_threads(comm, threads=threads, **kwargs)
    apply_threads(plan)
    return plan
