"""Start MPI jobs from Python (benchmark drivers, tests): mpiexec -n N python -m mpi4py ARGS."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from psframework import environment


def mpiexec_path() -> str:
    """Return the mpiexec next to this Python (a virtualenv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise RuntimeError("no mpiexec found next to the Python interpreter or on PATH; install "
                           "psframework[mpich] or load your cluster's MPI module")
    return found


@functools.lru_cache(maxsize=None)
def is_open_mpi(mpiexec: str) -> bool:
    """Return whether `mpiexec` belongs to Open MPI (it needs --oversubscribe and root flags)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout


def mpi_command(n: int, args: Sequence[str], timeout_s: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None) -> tuple:
    """Return (argv, environment) that run `python -m mpi4py ARGS` on n ranks."""
    mpiexec = mpiexec_path()
    argv: List[str] = [mpiexec, "-n", str(n)]
    full_env: Dict[str, str] = environment.child_environment()
    if is_open_mpi(mpiexec):
        argv.append("--oversubscribe")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if timeout_s is not None:
        full_env["MPIEXEC_TIMEOUT"] = str(max(1, int(timeout_s)))
    full_env.update(env or {})
    return argv + [sys.executable, "-m", "mpi4py"] + list(args), full_env


def run_mpi(n: int, args: Sequence[str], timeout_s: float = 600.0, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, capture: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m mpi4py ARGS` on n ranks; MPIEXEC_TIMEOUT and a subprocess timeout bound it."""
    argv, full_env = mpi_command(n, args, timeout_s, env)
    return subprocess.run(argv, cwd=cwd, env=full_env, capture_output=capture, text=True,
                          timeout=timeout_s + 15)
