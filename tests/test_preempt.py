"""Preemption: a signal stops every rank at one iteration with a checkpoint; train.resume=auto goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from mpiutil import ROOT, describe, mpi_command, run_psf
from psframework.cli import main
from psframework.runtime.preempt import (EXIT_PREEMPTED, REQUEUE_REQUEST, after_stop, signal_number,
                                         slurm_job_to_requeue)


def rank_pids(root_pid: int) -> list:
    """Return the pids of the psframework processes below `root_pid` (the ranks under mpiexec)."""
    children: dict = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if b"psframework" in argv and b"train" in argv and not argv[0].endswith(b"mpiexec"):
                found.append(child)
    return found


def rows(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def interrupt(ranks: int, args: list, partial, after_rows: int, sig: int = signal.SIGUSR2) -> tuple:
    """Start a run, send every rank `sig` once `after_rows` rows are written; return (status, stderr)."""
    argv, env = mpi_command(ranks, ["-m", "psframework", "train", *args], timeout_s=200,
                            env={"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while not (partial.exists() and len(partial.read_text().splitlines()) >= after_rows):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    pids = rank_pids(proc.pid)
    assert len(pids) == ranks, pids
    for pid in pids:
        os.kill(pid, sig)
    out, err = proc.communicate(timeout=200)
    return proc.returncode, err


@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config, exact, resumed_on", [("digits_ps.yaml", True, []), ("digits_stanza.yaml", True, []),
                                                       ("digits_sazd.yaml", False, ["code.n=3", "code.k=2"])],
                         ids=["ps", "stanza", "sazd-on-fewer-nodes"])
def test_a_signalled_run_stops_at_one_iteration_and_resumes_to_the_uninterrupted_result(tmp_path, config, exact,
                                                                                        resumed_on):
    """Preempt on 5 ranks and resume; a coded run resumes on 4 (n = 3, k = 2), as a requeue onto fewer nodes does
    (the checkpoint holds decoded weights, which the new code re-encodes), and is compared with the reference."""
    args = [os.path.join("configs", config), "train.epochs=3", f"output.dir={tmp_path}", "output.progress=off",
            "code.subsets=rotate" if not exact else "train.eval_every=7"]
    # the coded run's oracle is the reference trainer (one process) itself
    whole = run_psf(5, ["train", *args, "name=whole"], timeout=200) if exact else \
        run_psf(1, ["train", *args, "name=whole", "scheme=reference"], timeout=200)
    assert whole.returncode == 0, describe(whole)
    status, err = interrupt(5, args + ["name=cut"], tmp_path / "cut" / "metrics.jsonl.partial", 15)
    assert status == EXIT_PREEMPTED, err
    line, = [x for x in err.splitlines() if x.startswith("psf:")]
    stopped = int(line.split("after iteration ")[1].split()[0])
    assert 15 <= stopped < 132 and "not a Slurm job: run it again with train.resume=auto" in line
    kept = (tmp_path / "cut" / "metrics.jsonl.partial").read_text().splitlines()
    assert [json.loads(r)["iteration"] for r in kept] == list(range(1, stopped + 1))
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["iteration"] == stopped
    again = run_psf(5 - (1 if resumed_on else 0), ["train", *args, "name=cut", "train.resume=auto", *resumed_on],
                    timeout=200)
    assert again.returncode == 0, describe(again)
    got, want = rows(tmp_path / "cut"), rows(tmp_path / "whole")
    assert [r["iteration"] for r in got] == list(range(1, 133))
    final = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    reference = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    if exact:  # the same arithmetic in the same order: bit for bit
        assert [r["loss"] for r in got] == [r["loss"] for r in want]
        assert all(torch.equal(final[k], reference[k]) for k in final)
    else:  # a coded resume re-encodes the decoded weights: equal up to rounding (the oracle's 1e-4 relative)
        assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want)) < 1e-4
        for k in final:
            scale = reference[k].float().abs().max().clamp_min(1e-12)
            assert float((final[k].float() - reference[k].float()).abs().max() / scale) <= 1e-4, k


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_signalled_stanza_run_with_a_backup_worker_stops_at_one_iteration(tmp_path):
    # Rank 0 goes on without the slowest worker: in the stopping iteration that worker waits for a
    # message that never comes (Stanza: the features' gradient or the next iteration's parameters),
    # so the stop itself must end its wait; before that, its watchdog aborted the job. (ps: the
    # real-straggler tests stop their runs the same way.)
    args = [os.path.join("configs", "digits_stanza.yaml"), "train.backup_workers=1", "train.epochs=100",
            f"output.dir={tmp_path}", "output.progress=off", "comm.timeout_s=4", "name=cut"]
    status, err = interrupt(5, args, tmp_path / "cut" / "metrics.jsonl.partial", 100, signal.SIGTERM)
    assert status == EXIT_PREEMPTED and "watchdog" not in err, err
    line, = [x for x in err.splitlines() if x.startswith("psf:")]
    stopped = int(line.split("after iteration ")[1].split()[0])
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["iteration"] == stopped


@pytest.mark.timeout(300)
def test_a_single_process_run_stops_on_sigterm_and_resume_auto_goes_on(tmp_path):
    args = [os.path.join("configs", "digits_reference.yaml"), "train.epochs=2", f"output.dir={tmp_path}",
            "name=run", "output.progress=off"]
    proc = subprocess.Popen([sys.executable, "-m", "psframework", "train", *args], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    partial = tmp_path / "run" / "metrics.jsonl.partial"
    while not (partial.exists() and len(partial.read_text().splitlines()) >= 5):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "preempted by SIGTERM" in err and "is not train.preempt_signal (USR2): not requeued" in err
    assert main(["train", *args, "train.resume=auto"]) == 0
    total = json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"]
    assert [r["iteration"] for r in rows(tmp_path / "run")] == list(range(1, total + 1)) and total == 88
    assert main(["train", *args, "train.resume=auto"]) == 0  # finished: nothing to do


def test_resume_auto_starts_afresh_without_a_checkpoint_and_skips_a_torn_one(tmp_path):
    args = ["train", os.path.join(ROOT, "configs", "digits_reference.yaml"), "train.max_iterations=3",
            f"output.dir={tmp_path}", "name=run", "output.progress=off", "train.resume=auto",
            "train.lr_schedule=constant"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl.partial").write_text('{"iteration": 1, "loss": 9.0}\n{"iter')
    assert main(args) == 0
    assert [r["loss"] != 9.0 for r in rows(tmp_path / "run")] == [True] * 3
    first = [r["loss"] for r in rows(tmp_path / "run")]
    os.replace(tmp_path / "run" / "checkpoint.pt", tmp_path / "run" / "checkpoint-3.pt")
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"torn")  # the newest is unreadable: the older one serves
    os.utime(tmp_path / "run" / "checkpoint.pt", (time.time() + 5, time.time() + 5))
    assert main(args[:2] + ["train.max_iterations=4"] + args[3:]) == 0
    assert [r["loss"] for r in rows(tmp_path / "run")][:3] == first and len(rows(tmp_path / "run")) == 4


def test_signal_names_and_what_happens_after_a_stop():
    assert signal_number("USR2") == signal_number("SIGUSR2") == signal_number("usr2") == signal.SIGUSR2
    for bad in ("KILL", "SIGSTOP", "NOPE", "99999"):
        with pytest.raises(ValueError):
            signal_number(bad)
    assert slurm_job_to_requeue({"SLURM_JOB_ID": "7"}) == "7"
    assert slurm_job_to_requeue({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2"}) == "7_2"
    assert slurm_job_to_requeue({}) is None
    assert "not a Slurm job" in after_stop("USR2", "USR2", {})
    assert "not requeued" in after_stop("TERM", "USR2", {"SLURM_JOB_ID": "7"})
    assert "not requeued" in after_stop("USR2", "none", {"SLURM_JOB_ID": "7"})
    assert "PSF_REQUEUE=0" in after_stop("USR2", "SIGUSR2", {"SLURM_JOB_ID": "7", "PSF_REQUEUE": "0"})


def test_a_job_is_requeued_at_most_max_requeues_times(tmp_path):
    request = tmp_path / "requeue"  # the launcher's request file: nothing is sent to a real Slurm here
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "2", REQUEUE_REQUEST: str(request)}
    stop = after_stop("USR2", "USR2", env, max_requeues=2)
    assert stop == ("job 7 was requeued 2 times already, the most train.max_requeues=2 allows: not requeued; "
                    "submit it again with train.resume=auto to go on")
    assert not request.exists()
    again = after_stop("USR2", "USR2", {**env, "SLURM_RESTART_COUNT": "1"}, max_requeues=2)
    assert again == "Slurm job 7 is requeued once every rank has exited (by psframework.launch)"
    assert request.read_text() == "7"
    assert "not requeued" in after_stop("USR2", "USR2", {**env, "SLURM_RESTART_COUNT": "0"}, max_requeues=0)
