"""A real Slurm for the tests: bring it up (hpc/slurm-up.sh), submit jobs and wait for them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Sequence

import pytest

from mpiutil import training_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM_UP = os.path.join(ROOT, "hpc", "slurm-up.sh")
NOT_AVAILABLE = 3  # hpc/slurm-up.sh: Slurm cannot be had on this machine
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED")
_state: Dict[str, str] = {}


def slurm_answers() -> bool:
    """Return whether sinfo shows a usable node."""
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(s.startswith(("idle", "mix", "alloc")) for s in out.stdout.split())


def require_slurm() -> None:
    """Bring up the one-node Slurm if needed; skip (with the reason) only when it cannot be had here."""
    if slurm_answers():
        return
    if "why" not in _state:
        done = subprocess.run(["bash", SLURM_UP], capture_output=True, text=True, timeout=900)
        _state["why"] = "" if done.returncode == 0 else done.stderr.strip()
        _state["status"] = str(done.returncode)
    if _state["why"] and _state["status"] == str(NOT_AVAILABLE):
        pytest.skip(f"no Slurm on this machine and none can be installed: {_state['why']}")
    assert not _state["why"], f"hpc/slurm-up.sh installed Slurm but it did not come up: {_state['why']}"


def sbatch(args: Sequence[str], env: Dict[str, str]) -> str:
    """Submit a batch job from the repository root; return its id."""
    done = subprocess.run(["sbatch", "--parsable", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"sbatch failed: {done.stderr}"
    return done.stdout.strip().split(";")[0]


def job_records(job: str) -> List[Dict[str, str]]:
    """Return scontrol's records of a job (one per array task), each as {key: value}."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
    records = []
    for line in out.stdout.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if fields:
            records.append(fields)
    return records


def wait_for(job: str, timeout_s: float, done: int = 1) -> List[Dict[str, str]]:
    """Wait until `done` records of the job are in a final state; return the records."""
    deadline = time.monotonic() + timeout_s
    records: List[Dict[str, str]] = []
    while time.monotonic() < deadline:
        records = job_records(job)
        if len(records) >= done and all(r.get("JobState") in FINAL_STATES for r in records):
            return records
        time.sleep(1.0)
    subprocess.run(["scancel", job], timeout=30)
    raise AssertionError(f"job {job} did not finish within {timeout_s:.0f} s: "
                         f"{[(r.get('JobId'), r.get('JobState'), r.get('Reason')) for r in records]}")


def job_environment() -> Dict[str, str]:
    """Return the environment a test job is submitted with: this Python's virtual environment."""
    import sys

    env = dict(os.environ)
    env["PSF_VENV"] = os.path.dirname(os.path.dirname(sys.executable))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.pop("SLURM_JOB_ID", None)
    env["PSF_MPI_INIT_TIMEOUT_S"] = "120"  # a start-up that hangs fails the job with a traceback
    return env


def kill_rank_once_training(job: str, rank: int, partial, rows: int, timeout_s: float, log) -> None:
    """SIGKILL a rank of the job once its run has written `rows` metrics rows (`partial`)."""
    deadline = time.monotonic() + timeout_s
    while not partial.exists() or len(partial.read_text().splitlines()) < rows:
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.05)
    pid = training_process([f"SLURM_JOB_ID={job}", f"SLURM_PROCID={rank}"])
    assert pid is not None, f"no process of rank {rank} of job {job}"
    os.kill(pid, signal.SIGKILL)


def assert_finished_without(record: Dict[str, str], log: str, run_dir, rank: int, iterations: int) -> None:
    """Check that a job whose rank was killed completed with exit 0 and that its summary names the rank."""
    import json

    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", log
    assert f"rank(s) {rank} died and the run finished without them" in log and "psf: done:" in log, log
    assert log.count("psf: error") == 0, log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lost_workers"] == [rank] and summary["iterations"] == iterations, summary
