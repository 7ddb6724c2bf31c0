"""A core per rank: jobs bound to a core each, ranks that count the cores they have together, the benchmark cases."""

from __future__ import annotations

import os
import subprocess

import pytest

from psframework import launch
from psframework.bench.contenders import Contender
from psframework.netcluster import jobs
from psframework.netcluster.hosts import Cluster, LinkShape
from psframework.plan import validate
from psframework.plan.validation_report import critical_path_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


def test_a_job_with_a_core_per_rank_binds_each_rank_or_says_why_it_cannot(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    argv, _ = launch.mpi_command(2, ["-m", "psframework"], core_per_rank=True)
    assert "core" in argv and argv[argv.index("core") - 1] in ("-bind-to", "--bind-to")
    assert "core" not in launch.mpi_command(2, ["-m", "psframework"])[0]
    with pytest.raises(ValueError, match="a core per rank: 3 ranks, expected at most the 2 cores"):
        launch.mpi_command(3, ["-m", "psframework"], core_per_rank=True)


def test_a_cluster_job_with_a_core_per_rank_runs_rank_r_on_a_core_of_its_own(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 6, 7})
    cluster = Cluster("t", 3, [LinkShape()] * 3)
    argv, _ = jobs.job_command(cluster, 3, ["python", "x.py"], core_per_rank=True)
    segments = " ".join(argv).split(" : ")
    assert [s.split("taskset -c ")[1].split()[0] for s in segments] == ["4", "6", "7"]
    assert all(s.endswith("taskset -c " + c + " python x.py") for s, c in zip(segments, ["4", "6", "7"]))
    assert "taskset" not in jobs.job_command(cluster, 3, ["python", "x.py"])[0]
    with pytest.raises(ValueError, match="4 ranks, expected at most the 3 cores"):
        jobs.job_command(cluster, 4, ["python", "x.py"], core_per_rank=True)


# Rank 0 prints every rank's line: lines that two ranks print at once can interleave in mpiexec's output.
NODE_CORES = ("from mpi4py import MPI; from psframework.comm.locality import node_cores; "
              "from psframework.comm.polling import auto_poll_sleep; import os; w = MPI.COMM_WORLD; c = node_cores(w); "
              "line = f'{len(os.sched_getaffinity(0))} {c} {auto_poll_sleep(w, c)} {auto_poll_sleep(w)}'; "
              "lines = w.gather(line, root=0); w.rank or print(*lines, sep='\\n', flush=True)")


def node_cores_job(core_per_rank: bool) -> list:
    """Run NODE_CORES on 2 ranks; return each rank's line: its cores, the node's, its pause with and without them."""
    argv, env = launch.mpi_command(2, ["-c", NODE_CORES], timeout_s=60, core_per_rank=core_per_rank)
    env["PYTHONPATH"] = ROOT
    env.pop("PSF_POLL_SLEEP_S", None)  # the automatic choice
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=75)
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


@TWO_CORES
def test_ranks_bound_to_a_core_each_count_their_cores_together_and_wait_without_pausing():
    # unbound: each rank may use every core; the node's two ranks have two (or more) and spin
    assert all(line[2] == "0.0" for line in node_cores_job(False))
    # bound: one core each, two together, so the waits spin; counting only its own core, a rank would pause
    assert node_cores_job(True) == [["1", "2", "0.0", "0.001"]] * 2


def test_the_plan_cases_read_a_core_per_rank_and_the_workload_settings_the_setup_takes(tmp_path):
    path = tmp_path / "cases.yaml"
    path.write_text("workloads:\n  m/64: {config: c.yaml, overrides: [train.backup_workers=0]}\n"
                    "validation:\n  - {workloads: [m/64], contenders: [ps], n: [1], k: 1, links: [none],"
                    " core_per_rank: true}\n  - {workloads: [m/64], contenders: [ps], n: [4], links: [none]}\n"
                    "questions: {coded: sazd, stop_go: [ps], profile: m/64}\n")
    ps = Contender("ps", ("scheme=ps", "train.backup_workers=1"))
    pinned, shared = validate.load_cases(str(path), {"ps": ps}).checks
    assert pinned.core_per_rank and not shared.core_per_rank
    assert pinned.label == "m/64: ps, n=1, k=1, no emulation, a core per rank"
    case = validate.peers_cases.Case(ps, 1, "none", "none")
    assert validate.setup_of(pinned, case).backup == 0  # the workload's override is the last word


def test_the_critical_path_table_says_how_many_ranks_work_at_once():
    def row(contender, measured, busy, worker, ranks=2):
        return {"label": f"m: {contender}", "contender": contender, "measured_s": measured,
                "predicted_s": 0.9 * measured,
                "error": -0.1, "measured_cpu_s": 2 * measured, "rank0_busy_s": busy, "worker_compute_s": worker,
                "ranks": ranks, "core_per_rank": True}
    lines = critical_path_lines([row("ps", 0.100, 0.020, 0.080), row("ddp", 0.050, None, 0.045)])
    assert "| m: ps | 100.0 | 20.0 | 80.0 | 1.00 of 2 | 200.0 | 90.0 | -10% |" in lines
    assert "| m: ddp | 50.0 |  | 45.0 |  | 100.0 | 45.0 | -10% |" in lines
    assert critical_path_lines([]) == []
