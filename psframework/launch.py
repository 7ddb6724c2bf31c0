"""Start MPI jobs: mpiexec -n N python -m mpi4py ARGS from Python (sweeps, benchmarks, tests), and srun
with the MPI plugin, task count and CPU binding that fit inside a Slurm allocation (the job templates)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

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


def rank_cores(ranks: int) -> List[int]:
    """Return a core of its own for each of `ranks` ranks, from this process's; ValueError when there are fewer."""
    cores = environment.affinity()
    if ranks > len(cores):
        raise ValueError(f"a core per rank: {ranks} ranks, expected at most the {len(cores)} cores this process "
                         "may use")
    return cores[:ranks]


def mpi_command(n: int, args: Sequence[str], timeout_s: Optional[float] = None,
                env: Optional[Mapping[str, str]] = None, core_per_rank: bool = False) -> tuple:
    """Return (argv, environment) that run `python -m mpi4py ARGS` on n ranks.

    `core_per_rank`: bind each rank to a core of its own (ValueError when there are fewer cores than ranks), so
    that a job's time is its critical path, not the sum of its ranks' work on shared cores.
    """
    mpiexec = mpiexec_path()
    argv: List[str] = [mpiexec, "-n", str(n)]
    full_env: Dict[str, str] = environment.child_environment()
    open_mpi = is_open_mpi(mpiexec)
    if core_per_rank:
        rank_cores(n)
        argv += ["--bind-to", "core"] if open_mpi else ["-bind-to", "core"]
    if open_mpi:
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


# ---------------------------------------------------------------- srun inside a Slurm allocation

SRUN_USAGE = "usage: python -m psframework.launch [-n N] [--fit] [--dry-run] PSF-ARGS... (inside a Slurm allocation)"


class LaunchError(Exception):
    """The launch cannot go ahead as asked: one line says why."""


def mpi_library() -> str:
    """Return the version string of the MPI library mpi4py uses, without initialising MPI."""
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    return MPI.Get_library_version()


def srun_mpi_plugin(env: Mapping[str, str], library: str) -> Optional[str]:
    """Return the srun --mpi plugin for this MPI: PSF_SRUN_MPI, else pmix for Open MPI, pmi2 for MPICH's kin."""
    if env.get("PSF_SRUN_MPI"):
        return env["PSF_SRUN_MPI"]
    if "Open MPI" in library:
        return "pmix"
    if any(kin in library for kin in ("MPICH", "MVAPICH", "Intel(R) MPI", "CRAY MPICH")):
        return "pmi2"
    return None  # leave it to the cluster's MpiDefault


def srun_plugins(srun: str) -> List[str]:
    """Return the MPI plugins this srun offers (srun --mpi=list), or [] when it cannot tell."""
    try:
        out = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    text = out.stdout + out.stderr
    names = [line.strip().split()[-1] for line in text.splitlines() if line.strip() and ":" not in line
             and not line.strip().startswith(("MPI plugin", "specific"))]
    return [n.replace("mpi/", "") for n in names]


def cpu_binding(env: Mapping[str, str]) -> List[str]:
    """Return srun's CPU binding option where the cluster's task plugin binds (PSF_SRUN_CPU_BIND overrides)."""
    if "PSF_SRUN_CPU_BIND" in env:
        value = env["PSF_SRUN_CPU_BIND"]
        return [] if value in ("", "none") else [f"--cpu-bind={value}"]
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    plugin = next((line.split("=", 1)[1] for line in out.stdout.splitlines() if line.startswith("TaskPlugin ")), "")
    return ["--cpu-bind=cores"] if ("affinity" in plugin or "cgroup" in plugin) else []


def train_world_size(psf_args: Sequence[str], env: Mapping[str, str]) -> Tuple[Optional[int], List[str]]:
    """Return (ranks the `psf train` run needs, its arguments); (None, args) for other commands.

    A requeued Slurm job (SLURM_RESTART_COUNT > 0) resumes: train.resume=auto is added unless given.
    """
    args = list(psf_args)
    if not args or args[0] != "train" or len(args) < 2:
        return None, args
    from psframework.errors import ConfigError
    from psframework.schemes.registry import world_size_of
    from psframework.schemes.validate import load_run
    from psframework.sweepindex import point_arguments

    try:
        config, overrides = point_arguments(args[1], [a for a in args[2:] if "=" in a], env)
        cfg = load_run(config, overrides)
    except ConfigError as exc:
        raise LaunchError(str(exc)) from None
    if env.get("SLURM_RESTART_COUNT", "0") not in ("", "0") and not any(a.startswith("train.resume=") for a in args):
        args.append("train.resume=auto")
    return world_size_of(cfg), args


def fit_to_allocation(psf_args: Sequence[str], needed: int, allocated: int, env: Mapping[str, str]) -> List[str]:
    """Return `psf train` arguments that train on `allocated` ranks where the config needs more: fewer workers
    per server, as many spare ones as the config has (code.n - code.k), the true weights re-encoded on resume.

    A requeued job that Slurm starts on fewer nodes (sbatch --nodes=MIN-MAX) goes on with what it got.
    """
    from psframework.schemes.validate import load_run
    from psframework.sweepindex import point_arguments

    config, overrides = point_arguments(psf_args[1], [a for a in psf_args[2:] if "=" in a], env)
    cfg = load_run(config, overrides)
    servers, n, k = cfg.train.servers, cfg.code.n, cfg.code.k
    fitted = allocated // servers - 1
    if fitted < 1 or fitted - (n - k) < 1:
        raise LaunchError(f"the run needs {needed} ranks but the Slurm allocation has {allocated} tasks "
                          f"(SLURM_NTASKS), too few for {servers} server(s) with {n - k + 1} or more workers each: "
                          f"submit with sbatch --ntasks={needed}")
    fit = [f"code.n={fitted}", f"code.k={fitted - (n - k)}"]
    print(f"psf: the Slurm allocation has {allocated} of the {needed} tasks the config asks for: training with "
          f"{' '.join(fit)} (was code.n={n} code.k={k})", file=sys.stderr, flush=True)
    return list(psf_args) + fit


def srun_command(psf_args: Sequence[str], ntasks: Optional[int], env: Mapping[str, str],
                 fit: bool = False) -> List[str]:
    """Return the srun command that runs `python -m mpi4py -m psframework PSF-ARGS` in this allocation.

    With `fit`, a `psf train` run that needs more ranks than the allocation has trains on those it has
    (`fit_to_allocation`) instead of stopping with an error.
    """
    srun = shutil.which("srun") or "srun"
    needed, args = train_world_size(psf_args, env)
    ntasks = ntasks or needed
    allocated = env.get("SLURM_NTASKS")
    if ntasks and allocated and allocated.isdigit() and int(allocated) < ntasks:
        if not (fit and needed):
            raise LaunchError(f"the run needs {ntasks} ranks but the Slurm allocation has {allocated} tasks "
                              f"(SLURM_NTASKS): submit with sbatch --ntasks={ntasks}")
        args = fit_to_allocation(args, ntasks, int(allocated), env)
        ntasks, _ = train_world_size(args, env)
    argv = [srun]
    library = mpi_library()
    plugin = srun_mpi_plugin(env, library)
    if plugin is not None:
        offered = srun_plugins(srun) if os.path.isabs(srun) else []
        if offered and plugin not in offered and not any(o.startswith(plugin + "_") for o in offered):
            raise LaunchError(f"srun --mpi={plugin} (for {library.splitlines()[0].strip()}) is not offered "
                              f"here; srun --mpi=list shows {', '.join(offered)}: set PSF_SRUN_MPI to one of them")
        argv.append(f"--mpi={plugin}")
    if ntasks:
        argv += ["-n", str(ntasks)]
    if environment.fault_tolerant(env):
        # A worker that dies must not end the step (a site may set KillOnBadExit=1): the rest train on.
        argv.append("--kill-on-bad-exit=0")
    argv += cpu_binding(env) + shlex.split(env.get("PSF_SRUN_ARGS", ""))
    return argv + [sys.executable, "-m", "mpi4py", "-m", "psframework"] + args


def main(argv: Sequence[str]) -> int:
    """Run `psf` under srun in the current Slurm allocation (`python -m psframework.launch [-n N] ARGS`).

    --fit: a run that needs more ranks than the allocation has trains with fewer workers (the templates).
    """
    args, ntasks, dry_run, fit = list(argv), None, False, False
    if args[:1] in (["-h"], ["--help"]):
        print(f"{SRUN_USAGE}\n{main.__doc__}\nEnvironment: PSF_SRUN_MPI (plugin), PSF_SRUN_CPU_BIND (none: no "
              "binding), PSF_SRUN_ARGS (extra srun arguments).")
        return 0
    while args and args[0] in ("-n", "--dry-run", "--fit", "--"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--dry-run":
            dry_run = True
        elif flag == "--fit":
            fit = True
        elif not args or not args[0].isdigit() or int(args[0]) < 1:
            print(f"psf-launch: -n: got {args[0] if args else 'nothing'!r}, expected a positive number of ranks",
                  file=sys.stderr)
            return 2
        else:
            ntasks = int(args.pop(0))
    if not args:
        print(SRUN_USAGE, file=sys.stderr)
        return 2
    try:
        command = srun_command(args, ntasks, os.environ, fit)
    except LaunchError as exc:
        print(f"psf: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if dry_run:
        print(" ".join(shlex.quote(a) for a in command))
        return 0
    if not os.path.isabs(command[0]):
        print("psf: error: no srun on PATH: run inside a Slurm allocation, or use mpiexec", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return run_step(command, os.environ)


# Signals that srun handles for its tasks: the launcher outlives them to requeue after the step.
PASSED_ON = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")


def run_step(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the srun step; requeue the job once it has ended if rank 0 asked to; return the run's status.

    A requeue from inside the step would make Slurm kill the step while its ranks still finish, and
    the requeued job, whose first step has the same id, could start while the old one is torn down.
    A run that finished without a dead worker ends with 0, not with the dead rank's status (`finished`).
    """
    from psframework.runtime.preempt import requeue

    folder = tempfile.mkdtemp(prefix="psf-launch-")
    request, lost, pid = (os.path.join(folder, name) for name in ("requeue", "lost", "rank0.pid"))
    caught = {name: signal.signal(getattr(signal, name), lambda *_: None) for name in PASSED_ON}
    try:
        step_env = {**env, environment.REQUEUE_REQUEST: request, environment.LOST_RANKS: lost,
                    environment.NOTICE_PID: pid}
        step = subprocess.Popen(list(command), env=step_env, stderr=subprocess.PIPE, text=True, bufsize=1)
        watch_task_ends(step.stderr, pid, lambda: end_step(step))
        status = step.wait()
    finally:
        for name, handler in caught.items():
            signal.signal(getattr(signal, name), handler)
    if os.path.exists(request):
        print(f"psf: every rank has exited: requeueing Slurm job {open(request).read().strip()}", flush=True)
        print(f"psf: {requeue({k: v for k, v in env.items() if k != environment.REQUEUE_REQUEST})}", flush=True)
    status = status if status >= 0 else 128 - status  # srun ended by a signal: as a shell reports it
    status = finished(status, lost)
    shutil.rmtree(folder, ignore_errors=True)
    return status


# srun's line for tasks that ended before the step: "srun: error: NODE: task(s) 2,5-7: Killed"
TASK_ENDED = re.compile(r"^srun: error: [^:]+: tasks? ([0-9,-]+): ")


def watch_task_ends(lines: Iterable[str], pid_file: str, rank0_ended: Callable[[], None]) -> None:
    """Pass srun's standard error on; tell rank 0 (SIGUSR1) when srun reports that another task ended.

    It is the notice hydra gives under -disable-auto-cleanup (runtime.node.RankLossNotice): no MPI
    tells every rank reliably that a peer died, but srun sees each of its tasks end. When rank 0
    itself ends before the step (`rank0_ended`), the run is over: the other ranks must not wait for it.
    """
    for line in lines:
        sys.stderr.write(line)
        sys.stderr.flush()
        ended = TASK_ENDED.match(line)
        tasks = task_numbers(ended.group(1)) if ended else []
        if 0 in tasks:
            rank0_ended()
        if any(task != 0 for task in tasks) and os.path.exists(pid_file):
            try:
                os.kill(int(open(pid_file).read()), signal.SIGUSR1)
            except (OSError, ValueError):
                pass  # rank 0 has gone too


def end_step(step: subprocess.Popen) -> None:
    """Abort an srun step (srun aborts it on a second interrupt within a second)."""
    for _ in range(2):
        if step.poll() is None:
            step.send_signal(signal.SIGINT)
            time.sleep(0.2)


def task_numbers(ranges: str) -> List[int]:
    """Return the task numbers of srun's list of ranges ("0-1,3" -> [0, 1, 3])."""
    numbers: List[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        numbers += range(int(low), int(high or low) + 1)
    return numbers


def finished(status: int, lost: str) -> int:
    """Return the run's status from srun's: 0 where rank 0 finished the run without ranks that died (it left
    their numbers in the file `lost`), else srun's own."""
    if status == 0 or not os.path.exists(lost):
        return status
    with open(lost) as f:
        ranks = f.read().split()
    print(f"psf: srun ended with status {status}: rank(s) {', '.join(ranks)} died and the run finished without "
          "them (summary.json: lost_workers)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
