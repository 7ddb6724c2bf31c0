"""Preemption: a signal asks the run to checkpoint at the next iteration boundary and stop.

Slurm sends a warning signal before a time limit (`#SBATCH --signal=USR2@120`) or a preemption
(`scancel --signal=USR2`), and SIGTERM before it kills a job. The handler only sets a flag: rank 0
looks at it between iterations and tells the workers (comm/rounds.py) that the run stops there, so
that every rank stops at the same iteration and the checkpoint holds it. A second signal ends the
process at once, as it would have without the handler.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from typing import Dict, List, Mapping, Optional

from psframework import environment
from psframework.fileio import leave_for_launcher

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the run stopped early with a checkpoint and can go on
# Where psframework.launch wants rank 0's requeue request (a file path, in the environment of the step).
REQUEUE_REQUEST = environment.REQUEUE_REQUEST
UNCATCHABLE = ("KILL", "STOP")


class Preempted(Exception):
    """Raised on every rank when the run stopped at `iteration` for a preemption signal."""

    def __init__(self, iteration: int, total: int, signal_name: str, checkpoint: Optional[str] = None) -> None:
        super().__init__(f"preempted by SIG{signal_name} after iteration {iteration} of {total}")
        self.iteration, self.total, self.signal_name, self.checkpoint = iteration, total, signal_name, checkpoint


def signal_number(name: str) -> int:
    """Return the number of a signal named like USR2, SIGUSR2 or 12; raise ValueError for others."""
    text = name.strip().upper()
    if text.isdigit():
        number = int(text)
        if number in {int(s) for s in signal.valid_signals()}:
            return number
        raise ValueError(name)
    text = text[3:] if text.startswith("SIG") else text
    if text in UNCATCHABLE or not hasattr(signal, "SIG" + text):
        raise ValueError(name)
    return int(getattr(signal, "SIG" + text))


class PreemptFlag:
    """The signals that ask for a stop, and whether one came."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.name = ""
        self._previous: Dict[int, object] = {}

    def install(self, names: List[str]) -> None:
        """Catch each signal in `names` (only the main thread may install handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in names:
            number = signal_number(name)
            if number not in self._previous:
                self._previous[number] = signal.signal(number, self._caught)

    def _caught(self, number: int, frame: object) -> None:
        if self._event.is_set():  # a second signal: the default action, now
            self.uninstall()
            os.kill(os.getpid(), number)
            return
        self.name = signal.Signals(number).name[3:]
        self._event.set()

    def uninstall(self) -> None:
        """Restore the handlers that were there before."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def requested(self) -> bool:
        """Return whether a preemption signal came."""
        return self._event.is_set()

    def clear(self) -> None:
        """Forget a signal that came (a new run starts)."""
        self._event.clear()
        self.name = ""


FLAG = PreemptFlag()


def watch(signal_name: str) -> PreemptFlag:
    """Catch the preemption signal (none for "none") and SIGTERM, the fallback; return the flag."""
    FLAG.clear()
    names = ["TERM"] + ([] if signal_name.lower() == "none" else [signal_name])
    FLAG.install(names)
    return FLAG


def slurm_job_to_requeue(env: Mapping[str, str]) -> Optional[str]:
    """Return the Slurm job id to requeue: the array task's own id for job arrays; None outside Slurm."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def restart_count(env: Mapping[str, str]) -> int:
    """Return how often Slurm has requeued this job (SLURM_RESTART_COUNT; 0 outside Slurm or when unreadable)."""
    value = env.get("SLURM_RESTART_COUNT", "0").strip()
    return int(value) if value.isdigit() else 0


def after_stop(caught: str, preempt_signal: str, env: Mapping[str, str], max_requeues: Optional[int] = None) -> str:
    """Requeue the job if the preemption signal stopped it, at most `max_requeues` times (None: always); return
    what happened, in words.

    SIGTERM alone (scancel, or a time limit reached without --signal) stops with a checkpoint but is
    not requeued: a cancelled job must stay cancelled, and Slurm requeues the jobs it preempts itself.
    """
    if preempt_signal.lower() == "none" or signal_number(caught) != signal_number(preempt_signal):
        return f"SIG{caught} is not train.preempt_signal ({preempt_signal}): not requeued; run it again with " \
               "train.resume=auto to go on"
    return requeue(env, max_requeues)


def requeue(env: Mapping[str, str], max_requeues: Optional[int] = None) -> str:
    """Ask Slurm to requeue this job (it runs again and resumes); return what happened, in words.

    Under psframework.launch (REQUEUE_REQUEST set, on the node the launcher runs on) the request is
    left for the launcher, which requeues the job once srun has returned: a requeue from inside the
    job step makes Slurm kill the step while its ranks still finish.
    """
    job = slurm_job_to_requeue(env)
    if job is None:
        return "not a Slurm job: run it again with train.resume=auto to go on"
    if not environment.requeue_allowed(env):
        return f"PSF_REQUEUE=0: job {job} is not requeued; submit it again with train.resume=auto to go on"
    restarts = restart_count(env)
    if max_requeues is not None and restarts >= max_requeues:
        return (f"job {job} was requeued {restarts} times already, the most train.max_requeues={max_requeues} "
                "allows: not requeued; submit it again with train.resume=auto to go on")
    if leave_for_launcher(environment.requeue_request(env), job):
        return f"Slurm job {job} is requeued once every rank has exited (by psframework.launch)"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"no scontrol on PATH: job {job} is not requeued; submit it again with train.resume=auto to go on"
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol requeue {job} failed ({exc}); submit it again with train.resume=auto to go on"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return (f"scontrol requeue {job} failed ({why[-1] if why else f'status {done.returncode}'}); "
                "submit it again with train.resume=auto to go on")
    return f"requeued Slurm job {job}: it starts again and resumes from the checkpoint"
