"""The process environment: every environment variable psframework reads or sets, in one place.

Accessors take an optional `environ` mapping (for tests and for launchers' variables seen from
elsewhere); without it they read os.environ at the time of the call. A value that is set but
malformed raises ValueError naming the variable, the value and what was expected; an unset or
empty variable means "not given". No MPI and no torch here: any layer may import this module.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Tuple

POLL_SLEEP = "PSF_POLL_SLEEP_S"  # longest sleep between polls of a wait, seconds
DECODE_THREADS = "PSF_DECODE_THREADS"  # host threads of a large zigzag decode
NO_MPI = "PSF_NO_MPI"  # run the command line without MPI even under a launcher
MPI_INIT_TIMEOUT = "PSF_MPI_INIT_TIMEOUT_S"  # longest wait for MPI_Init before the rank gives up, seconds
TERMINAL = "PSF_TERMINAL"  # 1: the launcher's output goes to a terminal (the ranks see only pipes)
REQUEUE = "PSF_REQUEUE"  # 0: a preempted Slurm job is not requeued (it stops with its checkpoint)
REQUEUE_REQUEST = "PSF_REQUEUE_REQUEST"  # the file where psframework.launch wants rank 0's requeue request
NOTICE_PID = "PSF_NOTICE_PID"  # the file where rank 0 leaves its process id for psframework.launch's notices
LOST_RANKS = "PSF_LOST_RANKS"  # the file where psframework.launch wants the ranks a finished run went on without
FAULT_TOLERANT = "PSF_FAULT_TOLERANT"  # 0: launch without the safeguards that let training outlive a dead worker
SWEEP_POINT = "PSF_SWEEP_POINT"  # the point of a sweep index that `psf train runs/SWEEP/sweep.json` trains
ARRAY_TASK = "SLURM_ARRAY_TASK_ID"  # a job array task's number: the sweep point when PSF_SWEEP_POINT is unset
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"

# Any of these means an MPI launcher (mpiexec, mpirun, srun) started the process.
MPI_LAUNCH_MARKERS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
                      "SLURM_STEP_ID")

# Launcher variables (local rank, local size), most specific first: under mpirun/mpiexec started
# inside a Slurm allocation the ranks may inherit the SLURM_LOCALID of the daemon that spawned them,
# so the MPI launcher's own variables win over Slurm's.
LOCAL_RANK_VARIABLES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI mpirun
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH / Intel MPI hydra
    ("SLURM_LOCALID", None),  # srun
)
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")

# Thread counts exported for OpenMP and BLAS libraries loaded later and for child processes.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def _view(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    """Return `environ`, or this process's environment when it is None."""
    return os.environ if environ is None else environ


def _bad(name: str, value: str, expected: str) -> ValueError:
    """Return the error for a malformed variable."""
    return ValueError(f"environment variable {name}: got {value!r}, expected {expected}")


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return the variable's value stripped of blanks, or None when it is unset or empty."""
    value = _view(environ).get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def int_var(name: str, environ: Optional[Mapping[str, str]] = None, minimum: int = 0) -> Optional[int]:
    """Return the variable as an integer >= `minimum`, or None when it is unset or empty."""
    return _number(name, environ, minimum, int, f"an integer >= {minimum}")


def float_var(name: str, environ: Optional[Mapping[str, str]] = None, minimum: float = 0.0) -> Optional[float]:
    """Return the variable as a number >= `minimum`, or None when it is unset or empty."""
    return _number(name, environ, minimum, float, f"a number >= {minimum:g}")


def _number(name: str, environ: Optional[Mapping[str, str]], minimum: Any, convert: Callable[[str], Any],
            expected: str) -> Any:
    raw = get(name, environ)
    if raw is None:
        return None
    try:
        number = convert(raw)
    except ValueError:
        raise _bad(name, raw, expected) from None
    if not number >= minimum:  # also rejects nan
        raise _bad(name, raw, expected)
    return number


def poll_sleep_s(environ: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """Return PSF_POLL_SLEEP_S in seconds (>= 0), or None when it is not set."""
    return float_var(POLL_SLEEP, environ)


def decode_threads(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """Return PSF_DECODE_THREADS (>= 1), or None when it is not set."""
    return int_var(DECODE_THREADS, environ, minimum=1)


def mpi_init_timeout_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """Return PSF_MPI_INIT_TIMEOUT_S (>= 1; default 600): how long a rank may wait in MPI_Init."""
    value = float_var(MPI_INIT_TIMEOUT, environ, minimum=1.0)
    return 600.0 if value is None else value


def on_terminal(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Return whether PSF_TERMINAL says the launcher's standard error is a terminal (hpc/psf-mpirun sets it)."""
    return _view(environ).get(TERMINAL, "") == "1"


def requeue_allowed(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Return whether PSF_REQUEUE lets a preempted Slurm job be requeued (anything but 0; default yes)."""
    return get(REQUEUE, environ) != "0"


def requeue_request(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return PSF_REQUEUE_REQUEST, the file psframework.launch reads a requeue request from, or None."""
    return get(REQUEUE_REQUEST, environ)


def notice_pid_file(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return PSF_NOTICE_PID, the file where rank 0 leaves its process id for psframework.launch, or None."""
    return get(NOTICE_PID, environ)


def lost_ranks_file(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return PSF_LOST_RANKS, the file psframework.launch reads the ranks a finished run went on without from."""
    return get(LOST_RANKS, environ)


def fault_tolerant(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Return whether PSF_FAULT_TOLERANT lets training outlive a worker that dies (anything but 0; default yes)."""
    return get(FAULT_TOLERANT, environ) != "0"


def sweep_point(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Return the sweep point to train as given (PSF_SWEEP_POINT, else SLURM_ARRAY_TASK_ID), or None."""
    return get(SWEEP_POINT, environ) or get(ARRAY_TASK, environ)


def launched_by_mpi(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Return whether an MPI launcher started this process and PSF_NO_MPI does not opt out."""
    view = _view(environ)
    return any(m in view for m in MPI_LAUNCH_MARKERS) and NO_MPI not in view


def local_rank_vars(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, Optional[int], str]]:
    """Return (local rank, ranks on the node or None, variable read) from the launcher, or None."""
    for rank_var, size_var in LOCAL_RANK_VARIABLES:
        rank = int_var(rank_var, environ)
        if rank is not None:
            return rank, None if size_var is None else int_var(size_var, environ), rank_var
    return None


def slurm_tasks_on_node(value: str, node_id: int) -> Optional[int]:
    """Return the task count of node `node_id` from a Slurm list such as '4(x2),3'."""
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def local_size_vars(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, str]]:
    """Return (ranks on this node, variable read) from the launcher's variables, or None."""
    view = _view(environ)
    for name in LOCAL_SIZE_VARIABLES:
        value = int_var(name, view)
        if value:
            return value, name
    if "SLURM_LOCALID" in view and "SLURM_STEP_TASKS_PER_NODE" in view:
        count = slurm_tasks_on_node(view["SLURM_STEP_TASKS_PER_NODE"], int_var("SLURM_NODEID", view) or 0)
        if count:
            return count, "SLURM_STEP_TASKS_PER_NODE"
    return None


def cpus_on_node(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """Return SLURM_CPUS_ON_NODE, or None outside Slurm."""
    return int_var(CPUS_ON_NODE, environ)


def affinity() -> List[int]:
    """Return the cores this process may run on (its CPU affinity; every core where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """Return how many cores this process may run on (its CPU affinity)."""
    return len(affinity())


def cuda_visible_devices(environ: Optional[Mapping[str, str]] = None) -> str:
    """Return CUDA_VISIBLE_DEVICES as set ('' when unset)."""
    return _view(environ).get(CUDA_VISIBLE_DEVICES, "")


def export_threads(threads: int, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Set OMP_NUM_THREADS and the BLAS thread variables to `threads`."""
    target = os.environ if environ is None else environ
    for name in THREAD_VARIABLES:
        target[name] = str(threads)


def child_environment(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Return a copy of the environment to start a child process with."""
    return dict(_view(environ))
