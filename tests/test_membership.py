"""Who is detached: only a worker that has stopped, never a healthy one; and a readmission at the very end.

The runs train the benchmark config (vgg-small, batch 64, n = 4) for a few iterations on 5 ranks
with no straggler and check that summary.json lists no detach; the relay run is the command that
detached a healthy worker and then hung before relay decoded wide symbols. The last test stops a
worker (SIGSTOP) until it is detached and lets it go (SIGCONT) three iterations before the end: it is
readmitted in one of the last iterations and the run ends as any run does.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from mpiutil import ROOT, describe, run_mpi, run_psf
from test_stragglers_real import Job

BENCH = os.path.join(ROOT, "configs", "bench_stanza.yaml")
NO_LINKS = ["comm.emulate.bandwidth_gbps=null", "comm.emulate.latency_us=0"]


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("overrides", [
    ["scheme=sazd", "comm.dissemination=relay", "code.k=3", *NO_LINKS, "train.max_iterations=10", "train.epochs=100",
     "train.eval_every=0"],
    ["scheme=sazd", "comm.dissemination=direct", *NO_LINKS, "train.max_iterations=10"],
    ["scheme=sazd-naive", *NO_LINKS, "train.max_iterations=10"],
    ["scheme=poly", *NO_LINKS, "train.max_iterations=10"],
    ["scheme=uncoded", "code.k=4", *NO_LINKS, "train.max_iterations=10"],
    ["scheme=ps", "train.backup_workers=1", *NO_LINKS, "train.max_iterations=10"],
    ["scheme=stanza", "train.backup_workers=1", *NO_LINKS, "train.max_iterations=10"],
], ids=["sazd-relay", "sazd-direct", "sazd-naive", "poly", "uncoded", "ps", "stanza"])
def test_no_healthy_worker_is_detached(tmp_path, overrides):
    argv = ["train", BENCH, "name=run", f"output.dir={tmp_path}", "output.progress=off", *overrides]
    # The relay run in a job of its own (every rank's first iteration after start-up, the case that
    # detached a healthy worker); the others one after another in a warm pool job.
    relay = "comm.dissemination=relay" in overrides
    proc = run_mpi(5, ["-m", "psframework", *argv], timeout=240) if relay else run_psf(5, argv, timeout=240)
    assert proc.returncode == 0 and "watchdog" not in proc.stderr, describe(proc)
    summary = summary_of(tmp_path / "run")
    assert summary["membership"] == [] and summary["lost_workers"] == [], summary["membership"]
    assert summary["iterations"] == 10
    cpu = summary["cpu_s_per_iteration"]
    assert cpu["total"] == pytest.approx(cpu["server"] + cpu["workers"]) and cpu["workers"] > 0


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dissemination", ["direct", "relay"])
def test_a_worker_readmitted_in_the_last_iterations_ends_with_the_run(tmp_path, dissemination):
    # 20 ms of emulated latency per message makes an iteration last a few hundred milliseconds, so
    # that the worker can be let go while the run still has iterations left.
    last, frozen = 12, 2
    job = Job(tmp_path, f"comm.dissemination={dissemination}", "comm.emulate.latency_us=20000",
              f"train.max_iterations={last}", "train.epochs=100", "train.eval_every=0", "comm.timeout_s=30")
    job.wait_lines(1)
    pid = job.pid(frozen)
    os.kill(pid, signal.SIGSTOP)
    try:
        job.wait_lines(last - 3)  # written a row behind: the run is in iteration last - 1 or so
        detached = [line for line in job.output().splitlines() if f"rank {frozen} detached" in line]
    finally:
        os.kill(pid, signal.SIGCONT)
    summary, output = job.finish()
    assert detached, output
    events = [e for e in summary["membership"] if e["rank"] == frozen]
    assert len(events) == 1 and events[0]["readmitted_at"] is not None, (summary["membership"], output)
    assert last - 2 <= events[0]["readmitted_at"] <= last, summary["membership"]
    assert summary["lost_workers"] == [] and summary["iterations"] == last
    assert str(frozen) in summary["workers"]  # it answered the stop with its report
