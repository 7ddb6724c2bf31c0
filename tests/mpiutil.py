"""Run MPI jobs from pytest: mpiexec -n N python -m mpi4py (SCRIPT | -m MODULE | -c CODE) ARGS."""

from __future__ import annotations

import os
import subprocess
from typing import Mapping, Optional, Sequence, Union

from psframework.launch import mpi_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_SCRIPTS = os.path.join(ROOT, "tests", "mpi")


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
