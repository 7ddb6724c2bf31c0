"""Run MPI jobs from pytest: mpiexec -n N python -m mpi4py (SCRIPT | -m MODULE | -c CODE) ARGS."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, Mapping, Optional, Sequence, Union

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
    argv, full_env = mpi_command(n, command + list(args), timeout_s=timeout, env=_job_extra(env))
    return subprocess.run(argv, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout + 15)


def _job_extra(env: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Return the environment a test job adds: the repository on the path, one thread per rank, `env`."""
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # many ranks share few cores in tests
    extra.update(env or {})
    return extra


def describe(proc: subprocess.CompletedProcess) -> str:
    """Return a failed run's exit status and output, for assertion messages."""
    return (f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}")


POOL_SCRIPT = os.path.join(MPI_SCRIPTS, "pool.py")
POOL_LIFETIME_S = 4 * 3600  # MPIEXEC_TIMEOUT of a pool job: it ends with the test session anyway


class Pool:
    """One MPI job that runs `psf` command lines one after another (tests/mpi/pool.py).

    A run in a pool skips the start-up of a job (Python, torch and MPI in every rank: several
    seconds on a loaded machine); it runs the same code on the same number of ranks.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.dir = tempfile.mkdtemp(prefix=f"psf-pool{n}-")
        self.count = 0
        argv, env = mpi_command(n, [POOL_SCRIPT], timeout_s=POOL_LIFETIME_S, env=_job_extra(None))
        self.log = open(os.path.join(self.dir, "job.log"), "w+")
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=self.log,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def alive(self) -> bool:
        """Return whether the pool job still runs."""
        return self.process.poll() is None

    def run(self, argv: Sequence[str], timeout: float, keep_mpi: bool = False) -> subprocess.CompletedProcess:
        """Run `psf ARGV` in the pool; return it as a completed process (output in rank order).

        keep_mpi: a run that ends with an error line leaves MPI initialized, so the pool goes on.
        """
        self.count += 1
        out = os.path.join(self.dir, f"run{self.count}")
        request = {"argv": list(argv), "out": out, "keep_mpi": keep_mpi}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while not os.path.exists(out + ".status"):
            if not self.alive() or time.monotonic() > deadline:
                return self._failed(argv, out, timeout)
            time.sleep(0.02)
        status, more = map(int, open(out + ".status").read().split())
        done = subprocess.CompletedProcess(["psf", *argv], status, *self._output(out))
        if not more:  # the run finalized MPI: the job ends
            self.end()
        return done

    def _output(self, out: str) -> tuple:
        """Return (stdout, stderr) of a run: every rank's, in rank order."""
        def read(rank: int, kind: str) -> str:
            path = f"{out}.{rank}.{kind}"
            return open(path).read() if os.path.exists(path) else ""
        return tuple("".join(read(r, kind) for r in range(self.n)) for kind in ("out", "err"))

    def _failed(self, argv: Sequence[str], out: str, timeout: float) -> subprocess.CompletedProcess:
        """End the pool job (hung, or ended by an exception on a rank); return the run as failed."""
        hung = self.alive()
        self.close(0)
        self.log.seek(0)
        stdout, stderr = self._output(out)
        why = f"pool: the run did not end within {timeout:.0f} s\n" if hung else ""
        done = subprocess.CompletedProcess(["psf", *argv], 124 if hung else self.process.returncode or 1,
                                           stdout, stderr + why + self.log.read()[-6000:])
        self.end()
        return done

    def end(self) -> None:
        """End the pool job and remove its files."""
        self.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self, grace_s: float = 10.0) -> None:
        """End the pool job: the end of its input stops it; a kill after grace_s seconds."""
        try:
            self.process.stdin.close()
            self.process.wait(grace_s)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


_POOLS: Dict[int, Pool] = {}


def run_psf(n: int, argv: Sequence[str], timeout: float = 60.0, keep_mpi: bool = False) -> subprocess.CompletedProcess:
    """Run `psf ARGV` on n ranks in a warm pool job (one per n, started on first use, ended at exit).

    For runs that end well or with an error line: a run that takes the job down (an exception on one
    rank, a watchdog's abort) is reported as failed and the next run starts a new pool.
    """
    pool = _POOLS.get(n)
    if pool is None or not pool.alive():
        pool = _POOLS[n] = Pool(n)
    return pool.run(argv, timeout, keep_mpi)


@atexit.register
def close_pools() -> None:
    """End every pool job."""
    while _POOLS:
        _POOLS.popitem()[1].end()


def training_process(environment: Sequence[str], without: bytes = b"") -> Optional[int]:
    """Return the pid of a `python -m mpi4py` process whose environment holds every `environment` entry
    (and whose command line lacks `without`, if given), or None."""
    from psframework.bench.peers_runs import find_process

    wanted = {entry.encode() for entry in environment}
    return find_process(lambda env, cmdline: wanted <= env and b"mpi4py" in cmdline
                        and not (without and without in cmdline))
