"""Place MPI ranks on a cluster's hosts: rank r on host r mod N, every pair of ranks on the network.

One mpiexec starts the job (MPMD: one segment per rank), and each rank is started inside its host's
namespace with a host name of its own (a UTS namespace), so `hostname` and summary.json tell the hosts
apart. Ranks on different hosts share no network path but their cables; MPI's shared-memory path,
which would join them through the machine's /dev/shm, is turned off: MPICH talks over UCX's TCP
transport on each host's interface (MPIR_CVAR_NOLOCAL=1; under srun, over OFI's), Open MPI over its
TCP BTL. The interfaces' byte counters, read before and after a job, show what crossed each host's link.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from psframework import environment
from psframework.launch import is_open_mpi, mpiexec_path, rank_cores
from psframework.netcluster.hosts import DEVICE, Cluster, as_host, counters

# UCX_TCP_KEEPIDLE=inf: UCX turns TCP keepalive on for its connections (10 s idle, then probes), so a
# link cut for 15 s kills the idle connections between the cut host and the others, and MPI_Finalize
# then fails on both ends ("error during flush: Connection reset by remote peer") although training
# recovered. psframework's own watchdog and detach rules decide when a host is gone.
MPICH_NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp",
                 "UCX_NET_DEVICES": DEVICE, "UCX_TCP_KEEPIDLE": "inf"}
# Jobs that srun starts run over OFI's TCP provider instead: MPICH's UCX netmod sends each node's address
# to the process manager as 4096 bytes, mostly the memory that follows it, and Slurm's pmi2 plugin reads a
# request in one read of 1024 bytes, so the ranks of a multi-node srun step fail in MPI_Init whenever that
# memory holds few zero bytes. mpiexec's process manager reads whole requests.
# A worker's death ends such a step: OFI's sockets provider reports a send to a dead peer, but MPICH marks
# that completion error fatal and aborts the step; the TCP provider retries for ever, so rank 0's stall
# watchdog can end the job with its one line.
MPICH_SRUN_NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp",
                      "FI_TCP_IFACE": DEVICE}
OPEN_MPI_NETWORK = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", DEVICE]


def host_of(rank: int, cluster: Cluster) -> int:
    """Return the host rank `rank` runs on."""
    return rank % cluster.hosts


def enter_host(cluster: Cluster, host: int) -> List[str]:
    """Return the command prefix that runs a program on host `host`: its namespace and host name.

    `ip netns exec` also mounts the namespace's own /sys, where UCX looks up the host's interfaces.
    """
    return ["ip", "netns", "exec", cluster.namespace(host), *as_host(cluster.hostname(host))]


def network_environment(mpiexec: str) -> Dict[str, str]:
    """Return the variables that put every pair of ranks on the hosts' interfaces."""
    return {} if is_open_mpi(mpiexec) else dict(MPICH_NETWORK)


def job_command(cluster: Cluster, ranks: int, program: Sequence[str], timeout_s: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None,
                placement: Optional[Sequence[int]] = None,
                core_per_rank: bool = False) -> Tuple[List[str], Dict[str, str]]:
    """Return (argv, environment) of an MPI job of `ranks` ranks, each running `program` on its host:
    rank r on host `placement[r]`, by default host r mod N; with `core_per_rank`, rank r on core r of the
    machine the hosts share (ValueError when there are fewer cores than ranks)."""
    placement = placement or [host_of(rank, cluster) for rank in range(ranks)]
    cores = rank_cores(ranks) if core_per_rank else []
    mpiexec = mpiexec_path()
    argv: List[str] = [mpiexec]
    full_env = environment.child_environment()
    if is_open_mpi(mpiexec):
        argv += ["--oversubscribe", *OPEN_MPI_NETWORK]
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    full_env.update(network_environment(mpiexec))
    if timeout_s is not None:
        full_env["MPIEXEC_TIMEOUT"] = str(max(1, int(timeout_s)))
    full_env.update(env or {})
    for rank in range(ranks):
        if rank:
            argv.append(":")
        pin = ["taskset", "-c", str(cores[rank])] if core_per_rank else []
        argv += ["-n", "1", *enter_host(cluster, placement[rank]), *pin, *program]
    return argv, full_env


def psf_program(psf_args: Sequence[str]) -> List[str]:
    """Return the program of a psf job: python -m mpi4py -m psframework ARGS (an error on a rank ends the job)."""
    return [sys.executable, "-m", "mpi4py", "-m", "psframework", *psf_args]


def traffic(before: List[Dict[str, int]], after: List[Dict[str, int]]) -> List[Dict[str, int]]:
    """Return the bytes each host's interface sent and received between two counter readings."""
    return [{key: a[key] - b[key] for key in a} for b, a in zip(before, after)]


def run_job(cluster: Cluster, ranks: int, program: Sequence[str], timeout_s: Optional[float] = None,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, capture: bool = False,
            placement: Optional[Sequence[int]] = None) -> Tuple[subprocess.CompletedProcess, List[Dict[str, int]]]:
    """Run a job on the cluster; return it and the bytes each host's link carried meanwhile."""
    argv, full_env = job_command(cluster, ranks, program, timeout_s, env, placement)
    before = counters(cluster)
    limit = None if timeout_s is None else timeout_s + 30
    done = subprocess.run(argv, env=full_env, cwd=cwd or os.getcwd(), capture_output=capture, text=True,
                          timeout=limit)
    return done, traffic(before, counters(cluster))
