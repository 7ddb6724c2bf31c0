"""Threads per rank: share the node's cores among the ranks placed on it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from psframework import environment
from psframework.comm.locality import ranks_per_node
from psframework.environment import usable_cores


@dataclass(frozen=True)
class ThreadPlan:
    """Threads for this rank and the figures they were derived from."""

    threads: int
    cores_per_node: int
    ranks_per_node: int
    usable_cores: int  # cores this process may run on (its CPU affinity)
    source: str  # where ranks_per_node came from, or 'override'


def plan_threads(comm: Any = None, *, threads: Optional[int] = None, cores_per_node: Optional[int] = None,
                 ranks: Optional[int] = None, environ: Optional[Mapping[str, str]] = None) -> ThreadPlan:
    """Return threads per rank: the node's cores over its ranks, within this process's affinity.

    Ranks without a binding of their own (affinity = every core of the machine) split the machine's
    cores among them, so a node that declares more CPUs than it has is not oversubscribed.

    `threads` (> 0) overrides the result; 0 or None means automatic. `cores_per_node` defaults to
    SLURM_CPUS_ON_NODE, else the machine's core count; `ranks` (ranks per node) to the launcher's
    variables, else a shared-memory split of comm.
    """
    for name, value in (("threads", threads), ("cores_per_node", cores_per_node), ("ranks", ranks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name}: got {value!r}, expected an integer >= 0 (0 = automatic)")
    cores = cores_per_node or environment.cpus_on_node(environ) or os.cpu_count() or 1
    usable = usable_cores()
    if ranks:
        per_node, source = ranks, "given"
    else:
        per_node, source = ranks_per_node(comm, environ)
    if threads:
        return ThreadPlan(threads, cores, per_node, usable, "override")
    # Unbound ranks (affinity = the whole machine) share its cores, whatever the scheduler declared.
    own = usable // per_node if usable >= (os.cpu_count() or usable) else usable
    return ThreadPlan(max(1, min(cores // per_node, own)), cores, per_node, usable, source)


def apply_threads(plan: ThreadPlan) -> None:
    """Set torch, OpenMP and BLAS thread counts of this process to the plan's."""
    n = plan.threads
    environment.export_threads(n)  # for libraries loaded later and for child processes
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
