"""Link faults are stragglers too: one worker's link slowed, lossy or cut while a job runs across hosts.

Each test makes a cluster of 5 hosts (tests/netclusterutil.py: removed whatever happens), runs the job
with rank r on host r, and changes the link of one worker's host from here (hosts.set_link), reading
the run's progress from its metrics file as it is written, as tests/test_stragglers_real.py does for
frozen processes. `pytest -s tests/test_link_faults.py` prints the figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from netclusterutil import cluster
from psframework.cli import main
from psframework.netcluster import hosts, jobs
from psframework.runtime.preempt import EXIT_PREEMPTED
from psframework.comm.server_link import MPIServerLink
from test_coded_path import FakeTransport
from test_schemes_coded import CALM, assert_same_model, losses
from test_stragglers_real import KEPT_PACE, Job, used_ranks_after

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_sazd.yaml")
HOSTS = 5
LINK = "1gbit"
FAULTS = {"slow": {"rate": "10mbit"}, "loss": {"loss": "5%"}}  # 1% of the others' rate; 5% of packets lost
FAULT_S = 5.0  # how long the link is slow or lossy
CUT_S = 15.0  # how long the link is cut
# Rank 0's watchdog: longer than a cut and TCP's retransmission backoff after it (the next retransmission
# after a 15 s cut comes about 25 s after the cut began); the worker waits twice as long for rank 0.
WATCHDOG_S = 30


class LinkJob(Job):
    """A training job on a cluster's hosts (rank r on host r mod N) whose links the test changes."""

    def __init__(self, net, out, *overrides, timeout=300):  # noqa: super().__init__ launches on one host
        self.run_dir = out / "run"
        self.mark = uuid.uuid4().hex
        self.timeout = timeout
        program = jobs.psf_program(["train", CONFIG, "name=run", f"output.dir={out}", "output.progress=lines",
                                    f"comm.timeout_s={WATCHDOG_S}", *overrides])
        env = {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PSF_TEST_JOB": self.mark}
        argv, full_env = jobs.job_command(net, HOSTS, program, timeout_s=timeout, env=env)
        self.log = open(out / "output.txt", "w+")
        self.proc = subprocess.Popen(argv, env=full_env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        """Stop the run at the next iteration (SIGTERM to every rank, as Slurm does); return its exit status."""
        for rank in range(HOSTS):
            os.kill(self.pid(rank), signal.SIGTERM)
        return self.proc.wait(timeout=self.timeout)


def fault(net, host, name):
    """Apply fault `name` to host `host`'s link: slow, loss or cut."""
    if name == "cut":
        hosts.set_link(net, host, None, "down")
    else:
        hosts.set_link(net, host, net.shapes[host].merged(**FAULTS[name]), None)


def mend(net, host, name, shape):
    """Undo fault `name` on host `host`'s link, back to `shape`."""
    hosts.set_link(net, host, shape if name != "cut" else None, "up" if name == "cut" else None)


def every_event(output, rank, what):
    """Return every iteration at which rank 0 said `rank` was `what` (detached or readmitted), in order."""
    mark = f"psf: rank {rank} {what} at iteration "
    return [int(line.split(mark)[1].split(":")[0]) for line in output.splitlines() if mark in line]


def wait_until_used(job, rank, after, limit_s=60.0):
    """Wait until `rank` answers a round after iteration `after` (it has caught up, or been readmitted)."""
    end = time.monotonic() + limit_s
    while rank not in used_ranks_after(job.run_dir, after):
        assert job.proc.poll() is None, f"the job ended early:\n{job.output()}"
        assert time.monotonic() < end, f"rank {rank} unused after iteration {after} for {limit_s} s:\n{job.output()}"
        time.sleep(0.05)


def run_faults(job, net, host, rank):
    """Apply each fault to `host` in turn; return {fault: (rate before, rate during, iteration it ended at)}."""
    figures = {}
    healthy = net.shapes[host]
    for name in ("slow", "loss", "cut"):
        before, _ = job.rate(3.0)
        fault(net, host, name)
        try:
            during, until = job.rate(CUT_S if name == "cut" else FAULT_S)
        finally:
            mend(net, host, name, healthy)
        figures[name] = (before, during, until)
        wait_until_used(job, rank, until)
    return figures


FAULTED_RANK = 2  # on host 2


def test_a_worker_heard_within_the_detach_seconds_is_not_detached():
    # Both workers are 2 iterations behind and silent since those iterations began (fast iterations,
    # 50 ms each); rank 1 was last heard 0.3 s ago (a link that stalls, as TCP does for 0.2 s and more
    # after a lost packet), rank 2 1.5 s ago (stopped).
    now = time.monotonic()
    transport = FakeTransport(oldest={1: 8, 2: 8}, heard={1: now - 0.3, 2: now - 1.5})
    link = MPIServerLink(transport, [1, 2], detach_after=2, say=lambda line: None, detach_after_s=1.0)
    link.roster.iteration = 10
    link.roster.started = {8: now - 0.15, 9: now - 0.1, 10: now - 0.05}
    link.roster.detach_laggards([1, 2])
    assert transport.detached == [2] and list(link.members.detached) == [2]


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("overrides", [
    ["scheme=sazd"],
    ["scheme=ps", "train.backup_workers=1"],
], ids=["sazd", "ps"])
def test_a_faulty_link_does_not_hold_training_up(tmp_path, overrides):
    with cluster(HOSTS, "--rate", LINK) as net:
        job = LinkJob(net, tmp_path, "train.epochs=1000", "train.max_iterations=100000", *overrides)
        job.wait_lines(30)
        figures = run_faults(job, net, FAULTED_RANK, FAULTED_RANK)
        code = job.stop()
    output = job.output()
    for name, (before, during, until) in figures.items():
        print(f"\n{' '.join(overrides)}: host {FAULTED_RANK} {name}: {before:.1f} it/s before, {during:.1f} during "
              f"({during / before:.2f}), over by iteration {until}")
    print(f"membership: {[line for line in job.text().splitlines() if 'detached' in line or 'readmitted' in line]}")
    assert code == EXIT_PREEMPTED and "watchdog" not in output, output
    for name, (before, during, _) in figures.items():
        assert during >= KEPT_PACE * before, \
            f"{name}: {during:.1f} it/s during the fault, {before:.1f} before\n{output}"
    detached, readmitted = every_event(job.text(), FAULTED_RANK, "detached"), \
        every_event(job.text(), FAULTED_RANK, "readmitted")
    # A cut link is a stopped worker: it is detached during the cut and readmitted after the mend. A slow
    # or lossy one answers, but may fall behind for good on a link of 1% (TCP stalls past the detach
    # window when its shallow queue overflows): then it too is detached, and readmitted. Nothing is lost:
    # every detach has its readmission, and the worker answers again (wait_until_used above).
    assert any(figures["loss"][2] < at <= figures["cut"][2] for at in detached), output
    assert len(readmitted) == len(detached) and all(r > d for d, r in zip(detached, readmitted)), output


# CALM, whose rounding differences do not grow: the whole run can be held to the reference.
EQUAL_ITERATIONS = 120
# Iterations at which the slow and lossy phases (4 iterations each) and the cut begin: set by
# iterations, not seconds. The readmission after the cut waits for TCP's retransmission backoff (a second
# or two): at 60 iterations a fast machine ended the run before it.
PHASES = {"slow": 2, "loss": 7, "cut": 12}
PARITY_RANK = 4  # holds the parity packet: with it detached, rounds decode from the systematic packets


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}", *CALM,
                 f"train.max_iterations={EQUAL_ITERATIONS}"]) == 0
    return out / "ref"


def wait_for(job, what, limit_s=60.0):
    """Wait until `what(job)` holds (the job still running); return its value."""
    end = time.monotonic() + limit_s
    while not what(job):
        assert job.proc.poll() is None, f"the job ended early:\n{job.output()}"
        assert time.monotonic() < end, f"not seen within {limit_s} s:\n{job.output()}"
        time.sleep(0.02)
    return what(job)


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_a_run_through_link_faults_matches_the_reference(tmp_path, long_reference):
    # code.subsets=rotate waits for every worker and decodes each round from the next k-subset: while the
    # parity holder's link is slow or lossy it is waited for; once cut it is detached (silent for
    # comm.detach_after_s), rounds decode from the first k, and after the mend it is readmitted with a
    # state decoded from k workers. The run must still equal the reference trainer's.
    healthy_iterations = []
    with cluster(HOSTS, "--rate", LINK) as net:
        # comm.detach_after_s=0.3: the cut, mended once the worker is detached, stays short, and so does
        # TCP's retransmission backoff after it: the readmission comes well before the run's end.
        job = LinkJob(net, tmp_path, "scheme=sazd", "code.subsets=rotate", *CALM, "comm.detach_after_s=0.3",
                      f"train.max_iterations={EQUAL_ITERATIONS}", timeout=150)
        healthy = net.shapes[PARITY_RANK]
        for name in ("slow", "loss"):
            job.wait_lines(PHASES[name])
            fault(net, PARITY_RANK, name)
            job.wait_lines(PHASES[name] + 4)
            mend(net, PARITY_RANK, name, healthy)
        # A lossy link can leave the worker behind for good, and then it is detached at about the cut's
        # iteration: cut it only once it answers again, so that the cut's own detach is the one waited for,
        # and not while a readmission is still settling (it answers the round after next as well).
        wait_until_used(job, PARITY_RANK, PHASES["cut"])
        wait_until_used(job, PARITY_RANK, job.lines() + 1)
        healthy_iterations.append(job.lines())
        before = len(every_event(job.text(), PARITY_RANK, "detached"))
        fault(net, PARITY_RANK, "cut")
        try:
            wait_for(job, lambda j: len(every_event(j.text(), PARITY_RANK, "detached")) > before)
        finally:
            mend(net, PARITY_RANK, "cut", healthy)
        code = job.proc.wait(timeout=job.timeout)
    output = job.output()
    summary = json.loads((job.run_dir / "summary.json").read_text())
    print(f"\nsazd rotate through link faults: {summary['membership']}, cut at iteration "
          f"{healthy_iterations[0]}")
    assert code == 0 and "watchdog" not in output, output
    events = [(e["rank"], e["readmitted_at"] is not None) for e in summary["membership"]]
    assert events and set(events) == {(PARITY_RANK, True)}, output  # every detach of the parity holder undone
    drift = [abs(a - b) for a, b in zip(losses(job.run_dir), losses(long_reference))]
    print(f"largest loss difference from the reference: {max(drift):.1e}")
    assert_same_model(job.run_dir, long_reference)
    assert max(drift) < 1e-4, drift
