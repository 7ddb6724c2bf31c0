"""The multi-node job templates under a real Slurm whose nodes are a cluster's hosts (hpc/netcluster slurm).

One 5-host cluster with its Slurm serves the module's jobs: the CPU template on five hosts, the GPU
template on CPU nodes, a multi-node job preempted and requeued. When the module ends the cluster is
removed and nothing of it may remain: no namespace, no process that lived in one, no file. Other
tests check the configuration and the errors without root, and that a Slurm stopped part way leaves
nothing behind. Where there is no root, no network namespaces or no Slurm to be had, they skip with
the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Set

import pytest
import torch

from netclusterutil import NETCLUSTER, ROOT, cluster, leftovers, netcluster
from psframework.netcluster import cli, hosts, jobs, slurm
from psframework.netcluster.hosts import Cluster, ClusterError
from slurmutil import FINAL_STATES, job_environment, kill_rank_once_training

# One core per rank: the nodes declare 32 CPUs, and ranks with several threads each on the machine's
# 2 cores spin against each other (an iteration took about 20 times as long with two threads per rank).
ONE_CORE = "--cpus-per-task=1"


# ---------------------------------------------------------------- without root

def test_the_configuration_keeps_every_path_and_port_of_its_own():
    made = Cluster("tc", 3, [])
    text = slurm.config_text(made, cpus=32, memory_mb=4000)
    paths = [line.split("=", 1)[1] for line in text.splitlines()
             if line.split("=")[0].endswith(("Location", "Dir", "File"))]
    assert len(paths) == 6 and all(p.startswith("/run/psf-netcluster/tc/slurm/") for p in paths), paths
    assert "SlurmctldHost=tc-sw(198.19.255.254)\n" in text and "SlurmctldPort=6917\n" in text
    assert "SlurmdPort=6918\n" in text and "SlurmdSpoolDir=/run/psf-netcluster/tc/slurm/spool/%n\n" in text
    nodes = [line for line in text.splitlines() if line.startswith("NodeName=")]
    assert nodes == [f"NodeName=tc-h{h} NodeAddr=198.18.0.{h + 1} CPUs=32 RealMemory=4000 State=UNKNOWN"
                     for h in range(3)]
    for setting in ("AuthInfo=cred_expire=5", "SchedulerParameters=sched_interval=2", "JobRequeue=1",
                    "ReturnToService=2", "SlurmdParameters=config_overrides", "KillWait=10"):
        assert setting + "\n" in text  # as in hpc/slurm-up.sh


def test_slurm_commands_pass_their_arguments_on_untouched():
    parsed = cli.slurm_command_args(["sbatch", "--name", "abc", "--nodes=5", "--name=x", "job.sbatch"])
    assert (parsed.verb, parsed.name, parsed.args) == ("sbatch", "abc", ["--nodes=5", "--name=x", "job.sbatch"])
    parsed = cli.slurm_command_args(["squeue", "--name=abc", "-h"])
    assert (parsed.name, parsed.args) == ("abc", ["-h"])
    assert cli.slurm_command_args(["scancel", "7"]).name == cli.DEFAULT_NAME
    assert cli.slurm_command_args(["status"]) is None
    env = slurm.command_environment(Cluster("tc", 2, []))
    assert env["SLURM_CONF"] == "/run/psf-netcluster/tc/slurm/slurm.conf"
    assert all(env[k] == v for k, v in jobs.MPICH_SRUN_NETWORK.items())  # every pair of ranks over the links


# ---------------------------------------------------------------- processes left in a cluster's namespaces

def namespace_inodes(made: Cluster) -> Set[str]:
    """Return the identities of the cluster's network namespaces ('net:[INODE]')."""
    names = [made.switch] + [made.namespace(h) for h in range(made.hosts)]
    return {f"net:[{os.stat(f'/run/netns/{n}').st_ino}]" for n in names}


def processes_in(inodes: Set[str]) -> List[str]:
    """Return 'PID NAME' of every process living in one of these network namespaces."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") in inodes:
                with open(f"/proc/{pid}/comm") as fh:
                    found.append(f"{pid} {fh.read().strip()}")
        except OSError:
            continue  # ended meanwhile
    return found


def start_or_skip(made: Cluster) -> None:
    """Start the cluster's Slurm; skip the test with the reason where Slurm cannot be had here."""
    started = netcluster("slurm", "--name", made.name, timeout=600)
    if started.returncode == hosts.UNAVAILABLE:
        pytest.skip(f"no Slurm for a cluster of hosts here: {started.stderr.strip()}")
    assert started.returncode == 0, started.stderr


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_slurm_stopped_part_way_leaves_nothing(monkeypatch, capsys):
    with cluster(2) as made:
        no_slurm = netcluster("sbatch", "--name", made.name, "job.sbatch")
        assert no_slurm.returncode == 2 and no_slurm.stderr == \
            f"netcluster: error: cluster {made.name} has no Slurm (start it with: hpc/netcluster slurm " \
            f"--name {made.name})\n"
        bad = netcluster("slurm", "--name", made.name, "--cpus", "0")
        assert bad.returncode == 2 and "--cpus: got 0, expected a positive number" in bad.stderr
        start_or_skip(made)  # then a second start is refused in one line
        again = netcluster("slurm", "--name", made.name)
        assert again.returncode == 2 and f"cluster {made.name} has a Slurm already" in again.stderr
        inodes = namespace_inodes(made)
        slurm.stop(made)
        assert processes_in(inodes) == [] and not os.path.exists(slurm.slurm_dir(made))

        def late(*_):
            raise ClusterError("nodes not idle")

        monkeypatch.setattr(slurm, "wait_for_nodes", late)
        with pytest.raises(ClusterError, match="nodes not idle"):  # the start undoes itself
            slurm.start(made)
        assert processes_in(inodes) == [] and not os.path.exists(slurm.slurm_dir(made))
        monkeypatch.setattr(slurm, "stop", lambda _: None)  # as a start killed part way leaves it
        with pytest.raises(ClusterError):
            slurm.start(made)
        daemons = [p.split()[1] for p in processes_in(inodes)]
        assert daemons.count("slurmctld") == 1 and daemons.count("slurmd") == 2, daemons
        assert os.path.exists(slurm.conf_path(made))
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        assert cli.main(["slurm", "--name", made.name]) == hosts.UNAVAILABLE
        assert capsys.readouterr().err == "netcluster: unavailable: Slurm's daemons need root (run as root or " \
                                          "with sudo)\n"
        monkeypatch.undo()
        down = netcluster("down", "--name", made.name)
        assert down.returncode == 0, down.stderr
    assert processes_in(inodes) == [] and leftovers(made.name) == []


# ---------------------------------------------------------------- jobs on five hosts

@pytest.fixture(scope="module")
def five_nodes():
    """A 5-host cluster (1 Gb/s links) with its Slurm, for the module's jobs; nothing of it remains after."""
    with cluster(5, "--rate", "1gbit") as made:
        inodes = namespace_inodes(made)
        start_or_skip(made)
        yield made
    assert leftovers(made.name) == [] and processes_in(inodes) == []


def slurm_command(made: Cluster, verb: str, *args: str) -> subprocess.CompletedProcess:
    """Run hpc/netcluster VERB --name NAME ARGS from the repository root, with the tests' job environment."""
    env = dict(job_environment(), PSF_PYTHON=sys.executable)
    return subprocess.run([NETCLUSTER, verb, "--name", made.name, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def submit(made: Cluster, out, *args: str) -> str:
    """Submit a job through hpc/netcluster sbatch, its log in `out`; return its id."""
    done = slurm_command(made, "sbatch", "--parsable", f"--output={out}/psf-%j.out", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def record(made: Cluster, job: str) -> Dict[str, str]:
    """Return scontrol's record of a job as {key: value}."""
    out = slurm_command(made, "scontrol", "-o", "show", "job", job).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def wait_for(made: Cluster, job: str, timeout_s: float, restarts: int = 0) -> Dict[str, str]:
    """Wait until the job is in a final state after `restarts` requeues; return its record."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = record(made, job)
        if found.get("JobState") in FINAL_STATES and int(found.get("Restarts", "0")) >= restarts:
            return found
        time.sleep(0.5)
    slurm_command(made, "scancel", job)
    raise AssertionError(f"job {job} did not finish within {timeout_s:.0f} s: {found}")


def names(made: Cluster, count: int) -> List[str]:
    return [made.hostname(h) for h in range(count)]


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_job_steps_see_their_hosts_interfaces_and_not_the_machines(five_nodes):
    # UCX follows /sys/class/net/eth0 to the interface's device for its bandwidth: through the machine's
    # /sys it would find the machine's own card (or none, and then the ranks cannot start).
    machine = sorted(os.listdir("/sys/class/net"))
    show = 'echo "$(hostname) $(ls /sys/class/net | tr "\\n" " ")$(readlink -f /sys/class/net/eth0)"'
    done = slurm_command(five_nodes, "srun", "--nodes=5", "--ntasks-per-node=1", "sh", "-c", show)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"{name} eth0 lo /sys/devices/virtual/net/eth0"
                                                for name in names(five_nodes, 5)]
    assert sorted(os.listdir("/sys/class/net")) == machine


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_the_multi_node_template_puts_a_rank_on_each_of_five_hosts(five_nodes, tmp_path):
    before = hosts.counters(five_nodes)
    job = submit(five_nodes, tmp_path, "--nodes=5", ONE_CORE, "jobs/multi-node.sbatch", "configs/digits_sazd.yaml",
                 "train.epochs=1", f"output.dir={tmp_path}", "output.progress=lines")
    found = wait_for(five_nodes, job, 300)
    moved = jobs.traffic(before, hosts.counters(five_nodes))
    log = (tmp_path / f"psf-{job}.out").read_text()
    assert found["JobState"] == "COMPLETED" and found["ExitCode"] == "0:0", log
    summary = json.loads((tmp_path / "digits_sazd" / "summary.json").read_text())
    assert summary["hosts"] == names(five_nodes, 5) and summary["world_size"] == 5 and summary["iterations"] == 44
    # Rank 0 is alone on host 0: what it sent and received crossed host 0's cable.
    assert moved[0]["tx_bytes"] >= summary["server_bytes_sent"] > 0, moved
    assert moved[0]["rx_bytes"] >= summary["server_bytes_received"] > 0, moved


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_the_gpu_template_runs_on_nodes_without_gpus_with_device_cpu(five_nodes, tmp_path):
    """--gpus-per-task=0 on the command line overrides the template's one GPU per task; two ranks a node."""
    job = submit(five_nodes, tmp_path, "--nodes=2", "--ntasks-per-node=2", "--gpus-per-task=0", ONE_CORE,
                 "jobs/multi-node-gpu.sbatch", "configs/digits_sazd.yaml", "code.n=3", "code.k=2", "device=cpu",
                 "train.max_iterations=10", f"output.dir={tmp_path}", "output.progress=lines")
    found = wait_for(five_nodes, job, 300)
    log = (tmp_path / f"psf-{job}.out").read_text()
    assert found["JobState"] == "COMPLETED" and found["ExitCode"] == "0:0", log
    on_nodes = [five_nodes.hostname(h) for h in (0, 0, 1, 1)]  # srun places ranks in blocks
    doctor = [line.split() for line in log.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [row[1] for row in doctor] == on_nodes and all(row[10] == "cpu" for row in doctor), log  # psf doctor
    summary = json.loads((tmp_path / "digits_sazd" / "summary.json").read_text())
    assert summary["hosts"] == on_nodes and summary["iterations"] == 10 and summary["k"] == 2


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_a_multi_node_job_whose_worker_is_killed_on_its_own_host_ends_with_one_error_line(five_nodes, tmp_path):
    """SIGKILL worker rank 2, alone on host 2. MPICH over OFI's TCP provider retries a send to the dead rank
    for ever inside MPI_Isend, so rank 0 cannot train on: once it has started no iteration for
    SETUP_PATIENCE x comm.timeout_s after srun reported the death, it ends the job with one error line."""
    job = submit(five_nodes, tmp_path, "--nodes=5", ONE_CORE, "jobs/multi-node.sbatch", "configs/digits_sazd.yaml",
                 "comm.timeout_s=5", "train.max_iterations=600", "train.epochs=100", "train.eval_every=0",
                 "output.progress=lines", f"output.dir={tmp_path}", "name=killed")
    out = tmp_path / f"psf-{job}.out"
    kill_rank_once_training(job, 2, tmp_path / "killed" / "metrics.jsonl.partial", 100, 240, out)
    killed = time.monotonic()
    found = wait_for(five_nodes, job, 120)
    log = out.read_text()
    assert found["JobState"] == "FAILED" and time.monotonic() - killed < 90, log
    stalled = "psf: error: rank 0: no iteration started for 20 s after a rank of the job died"
    assert log.count("psf: error") == 1 and stalled in log, log


def rows(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(500)
def test_a_preempted_multi_node_job_requeues_and_ends_as_its_uninterrupted_twin(five_nodes, tmp_path):
    """scancel --signal=USR2: every rank stops at one iteration with a checkpoint, the job requeues itself
    and resumes on five hosts; losses and model are bit for bit those of the same job left alone, which
    runs meanwhile."""
    args = [ONE_CORE, "jobs/multi-node.sbatch", "configs/digits_ps.yaml", "train.epochs=2", "output.progress=lines",
            f"output.dir={tmp_path}"]
    twin = submit(five_nodes, tmp_path, *args, "name=whole")
    job = submit(five_nodes, tmp_path, *args, "name=cut")
    partial, out = tmp_path / "cut" / "metrics.jsonl.partial", tmp_path / f"psf-{job}.out"
    deadline = time.monotonic() + 240
    while not partial.exists() or len(partial.read_text().splitlines()) < 10:  # the run trains
        assert time.monotonic() < deadline, out.read_text() if out.exists() else "no log"
        time.sleep(0.05)
    assert slurm_command(five_nodes, "scancel", "--signal=USR2", job).returncode == 0
    found, alone = wait_for(five_nodes, job, 300, restarts=1), wait_for(five_nodes, twin, 120)
    log = out.read_text()
    assert found["JobState"] == "COMPLETED" and found["Restarts"] == "1" and alone["JobState"] == "COMPLETED", log
    stopped = int(log.split("psf: preempted by SIGUSR2 after iteration ")[1].split()[0])
    assert 10 <= stopped < 88 and "psf: requeued Slurm job" in log and "(start 2)" in log, log
    assert f"iterations {stopped + 1}..88" in log and "psf: done:" in log, log
    cut, whole = rows(tmp_path / "cut"), rows(tmp_path / "whole")
    assert [r["iteration"] for r in cut] == [r["iteration"] for r in whole] == list(range(1, 89))
    assert [r["loss"] for r in cut] == [r["loss"] for r in whole]  # exactly, on the CPU
    final = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    reference = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["hosts"] == names(five_nodes, 5)
