"""Run MPI jobs from pytest: mpiexec -n N python -m mpi4py (SCRIPT | -m MODULE | -c CODE) ARGS."""

from __future__ import annotations

import os
import subprocess
from typing import Mapping, Optional, Sequence, Union

from psframework.launch import is_open_mpi
from psframework.launch import mpi_command as launch_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_SCRIPTS = os.path.join(ROOT, "tests", "mpi")
# PSF_TEST_NETWORK=tcp puts every pair of ranks of every test job on TCP, as between nodes: the
# transport a cluster's ranks use, where the default lets ranks of one machine share memory.
NETWORKS = ("shared", "tcp")
MPICH_TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp"}
OPEN_MPI_TCP = ["--mca", "btl", "tcp,self"]


def job_network() -> str:
    """Return the transport the test jobs use between ranks: PSF_TEST_NETWORK, 'shared' by default."""
    network = os.environ.get("PSF_TEST_NETWORK", "shared") or "shared"
    if network not in NETWORKS:
        raise ValueError(f"PSF_TEST_NETWORK: got {network!r}, expected one of {', '.join(NETWORKS)}")
    return network


def mpi_command(n: int, args: Sequence[str], timeout_s: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None) -> tuple:
    """Return (argv, environment) of a test job on n ranks, over TCP where PSF_TEST_NETWORK says so."""
    argv, full_env = launch_command(n, args, timeout_s=timeout_s, env=env)
    if job_network() == "tcp":
        if is_open_mpi(argv[0]):
            argv[1:1] = OPEN_MPI_TCP
        else:
            full_env.update(MPICH_TCP)
    return argv, full_env


def run_mpi(n: int, target: Union[str, Sequence[str]], *args: str, timeout: float = 60.0,
            env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run `target` on n ranks under mpiexec and return the completed process (stdout, stderr as text).

    `target` is a script path (relative paths are looked up in tests/mpi, then the repository), or
    an argument list for python -m mpi4py such as ["-m", "psframework", "train", "cfg.yaml"].
    MPIEXEC_TIMEOUT makes mpiexec kill a hung job after `timeout` seconds; the subprocess timeout
    (a few seconds longer) is the last resort and raises subprocess.TimeoutExpired.
    """
    if isinstance(target, str):
        script = target
        if not os.path.isabs(script):
            candidate = os.path.join(MPI_SCRIPTS, script)
            script = candidate if os.path.exists(candidate) else os.path.join(ROOT, script)
        if not os.path.exists(script):
            raise ValueError(f"target: got script {target!r}, expected a file in tests/mpi or the repository")
        command = [script]
    else:
        command = list(target)
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # many ranks share few cores in tests
    extra.update(env or {})
    argv, full_env = mpi_command(n, command + list(args), timeout_s=timeout, env=extra)
    return subprocess.run(argv, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout + 15)


def describe(proc: subprocess.CompletedProcess) -> str:
    """Return a failed run's exit status and output, for assertion messages."""
    return (f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}")
