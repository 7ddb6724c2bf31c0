"""The job templates under a real Slurm: sbatch, preemption with requeue, sweeps as job arrays, reports."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest
import torch

from mpiutil import describe, run_psf
from slurmutil import (ROOT, assert_finished_without, job_environment, kill_rank_once_training, require_slurm, sbatch,
                       wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]
TEMPLATE = os.path.join("jobs", "single-node.sbatch")


@pytest.fixture(autouse=True)
def slurm():
    require_slurm()


def read_rows(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(400)
def test_the_single_node_template_trains_under_sbatch(tmp_path):
    job = sbatch([f"--output={tmp_path}/psf-%j.out", TEMPLATE, "configs/digits_sazd.yaml", "train.epochs=1",
                  f"output.dir={tmp_path}", "output.progress=lines"], job_environment())
    record, = wait_for(job, 300)
    log = (tmp_path / f"psf-{job}.out").read_text()
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", log
    summary = json.loads((tmp_path / "digits_sazd" / "summary.json").read_text())
    assert summary["world_size"] == 5 and summary["iterations"] == 44 and summary["final_test_accuracy"] > 0
    assert "psf: done:" in log and "psf: error" not in log


# Long enough for rank 0 to detach the dead worker and train on: a detach follows within a few dozen iterations.
KILLED_RUN = ["train.max_iterations=600", "train.epochs=100", "train.eval_every=0", "output.progress=lines"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("config,extra", [("configs/digits_sazd.yaml", []),
                                          ("configs/digits_ps.yaml", ["train.backup_workers=1"])],
                         ids=["sazd", "ps-backup"])
def test_a_job_whose_worker_is_killed_trains_on_and_completes_with_exit_0(tmp_path, config, extra):
    """SIGKILL worker rank 2 mid-run: srun reports the task's end, the launcher tells rank 0, which trains on
    without it (sazd decodes from the other k, ps takes the first n - 1), and the job ends with exit 0."""
    job = sbatch([f"--output={tmp_path}/psf-%j.out", TEMPLATE, config, *extra, *KILLED_RUN, f"output.dir={tmp_path}",
                  "name=killed"], job_environment())
    out = tmp_path / f"psf-{job}.out"
    kill_rank_once_training(job, 2, tmp_path / "killed" / "metrics.jsonl.partial", 100, 200, out)
    record, = wait_for(job, 200)
    assert_finished_without(record, out.read_text(), tmp_path / "killed", 2, 600)


REQUEUES = 3


def count_lines(path) -> int:
    """Return how many lines a file has (0 while it does not exist)."""
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def preempt(job: str, out, marker: str, count: int, deadline: float) -> None:
    """Send the job the preemption signal; wait until its log holds `marker` `count` times."""
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    while out.read_text().count(marker) < count:
        assert time.monotonic() < deadline, f"no {marker!r} after preemption {count}: {out.read_text()}"
        time.sleep(0.05)


@pytest.mark.timeout(900)
def test_a_job_preempted_three_times_requeues_itself_each_time_and_ends_as_an_uninterrupted_run(tmp_path):
    """Three preemptions in a row: each one checkpoints, the job is requeued once its step has ended,
    and every requeued run trains again within 60 s of its requeue (Slurm lets a requeued job start
    after its credential lifetime, at its next scheduling pass: 10 s and every 2 s in hpc/slurm-up.sh;
    the test prints the times); the result is bit for bit the uninterrupted run's."""
    args = ["configs/digits_ps.yaml", "train.epochs=4", "output.progress=lines", f"train.max_requeues={REQUEUES}"]
    whole = run_psf(5, ["train", *args, f"output.dir={tmp_path}", "name=whole"], timeout=200)
    assert whole.returncode == 0, describe(whole)
    job = sbatch([f"--output={tmp_path}/psf-%j.out", TEMPLATE, *args, f"output.dir={tmp_path}", "name=cut"],
                 job_environment())
    partial, out = tmp_path / "cut" / "metrics.jsonl.partial", tmp_path / f"psf-{job}.out"
    trained, restarts = 0, []
    for cut in range(REQUEUES + 1):
        requeued = time.monotonic()
        deadline = requeued + (200 if cut == 0 else 60)
        while count_lines(partial) < trained + 10:  # the run has started and trains
            if cut == REQUEUES and (tmp_path / "cut" / "metrics.jsonl").exists():
                break  # the last run finished its few iterations between two looks
            assert time.monotonic() < deadline, f"run {cut + 1} did not train within {deadline - requeued:.0f} s: " \
                                                f"{out.read_text() if out.exists() else ''}"
            time.sleep(0.05)
        restarts.append(time.monotonic() - requeued)
        if cut == REQUEUES:
            break
        preempt(job, out, "psf: requeued Slurm job", cut + 1, deadline + 120)
        trained = count_lines(partial)
    record, = wait_for(job, 400)
    log = out.read_text()
    print(f"requeued runs trained again after {', '.join(f'{t:.1f}' for t in restarts[1:])} s")
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == str(REQUEUES), log
    assert log.count("psf: preempted by SIGUSR2 after iteration") == REQUEUES, log
    assert f"(start {REQUEUES + 1})" in log and "psf: done:" in log, log
    assert f"STEP {job}.0 ON" not in log, log  # no step was cancelled by the requeue: each had ended
    cut, uninterrupted = read_rows(tmp_path / "cut"), read_rows(tmp_path / "whole")
    assert [r["iteration"] for r in cut] == [r["iteration"] for r in uninterrupted] == list(range(1, 177))
    assert [r["loss"] for r in cut] == [r["loss"] for r in uninterrupted]  # exactly, on the CPU
    final = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    reference = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)


@pytest.mark.timeout(600)
def test_a_job_preempted_once_more_than_max_requeues_allows_checkpoints_and_stops_with_its_line(tmp_path):
    """train.max_requeues: 1 and two preemptions: the first is requeued, the second checkpoints and stops."""
    args = ["configs/digits_ps.yaml", "train.epochs=20", "output.progress=lines", "train.max_requeues=1",
            f"output.dir={tmp_path}", "name=bounded"]
    job = sbatch([f"--output={tmp_path}/psf-%j.out", TEMPLATE, *args], job_environment())
    partial, out = tmp_path / "bounded" / "metrics.jsonl.partial", tmp_path / f"psf-{job}.out"
    trained = 0
    for cut in range(2):
        deadline = time.monotonic() + (200 if cut == 0 else 90)
        while count_lines(partial) < trained + 10:  # the run has started and trains
            log = out.read_text() if out.exists() else ""
            assert time.monotonic() < deadline, f"run {cut + 1} did not train: {log}"
            time.sleep(0.05)
        preempt(job, out, "psf: preempted by SIGUSR2", cut + 1, deadline + 120)
        trained = count_lines(partial)
    record, = wait_for(job, 200)
    log = out.read_text()
    assert record["Restarts"] == "1", log
    assert log.count("psf: requeued Slurm job") == 1, log
    assert (f"job {job} was requeued 1 times already, the most train.max_requeues=1 allows: not requeued; "
            "submit it again with train.resume=auto to go on") in log, log
    assert (tmp_path / "bounded" / "checkpoint.pt").exists() and "psf: done:" not in log


def png_size(path) -> tuple:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.timeout(600)
def test_a_sweep_runs_as_one_job_array_and_the_report_plots_it(tmp_path):
    env = job_environment()
    argv = [sys.executable, "-m", "psframework", "sweep", "configs/digits_sazd.yaml", "--grid", "code.k=2,3",
            "stragglers.factor=1,4", "--slurm", "--out", str(tmp_path), "train.epochs=1", "stragglers.model=fixed",
            "stragglers.ranks=[2]",
            "output.progress=lines", "--max-parallel", "2"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, describe(done)
    job = done.stdout.split("submitted job array ")[1].split()[0]
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    assert "ArrayTaskThrottle=2" in shown and "%2" in shown, shown
    records = wait_for(job, 540, done=4)
    sweep = tmp_path / "digits_sazd-sweep"
    logs = "".join(p.read_text() for p in sweep.glob("slurm-*.out"))
    assert len(records) == 4 and all(r["JobState"] == "COMPLETED" for r in records), logs
    index = json.loads((sweep / "sweep.json").read_text())
    assert [p["name"] for p in index["points"]] == ["code.k=2,stragglers.factor=1", "code.k=2,stragglers.factor=4",
                                                    "code.k=3,stragglers.factor=1", "code.k=3,stragglers.factor=4"]
    for point in index["points"]:
        summary = json.loads((sweep / point["dir"] / "summary.json").read_text())
        assert summary["k"] == int(point["name"][7]) and summary["world_size"] == 5
    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "(4 finished)" in again.stdout and "submitted" not in again.stdout
    out = tmp_path / "report"
    report = subprocess.run([sys.executable, "-m", "psframework", "report", str(sweep), "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, describe(report)
    text = (out / "report.md").read_text()
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 4 and (out / "runs.csv").read_text().count("\n") == 5
    for png in pngs:
        width, height = png_size(png)
        assert 400 <= width <= 3000 and 300 <= height <= 3000 and png.stat().st_size > 5000, png
        assert f"]({png.name})" in text
    assert "straggler_slowdown.png" in text
