"""Run MPI jobs from pytest: mpiexec -n N python -m mpi4py (SCRIPT | -m MODULE | -c CODE) ARGS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence, Union

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_SCRIPTS = os.path.join(ROOT, "tests", "mpi")


def mpiexec_path() -> str:
    """Return the mpiexec next to this Python (the virtualenv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise RuntimeError("no mpiexec found next to the Python interpreter or on PATH")
    return found


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout or "OpenRTE" in out.stdout or "Open MPI" in out.stderr


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
    mpiexec = mpiexec_path()
    launcher = [mpiexec, "-n", str(n)]
    full_env = dict(os.environ)
    if _is_open_mpi(mpiexec):
        launcher.append("--oversubscribe")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        full_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    full_env["MPIEXEC_TIMEOUT"] = str(max(1, int(timeout)))
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, full_env.get("PYTHONPATH")) if p)
    full_env.setdefault("OMP_NUM_THREADS", "1")  # many ranks share few cores in tests
    full_env.update(env or {})
    return subprocess.run(launcher + [sys.executable, "-m", "mpi4py"] + command + list(args),
                          cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout + 15)


def describe(proc: subprocess.CompletedProcess) -> str:
    """Return a failed run's exit status and output, for assertion messages."""
    return (f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}")
