"""Launch tooling: psf doctor, psf bench comm, hpc/psf-mpirun and the sbatch templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mpiutil import ROOT, describe, run_mpi
from psframework.launch import mpiexec_path

pytestmark = pytest.mark.timeout(120, method="thread")
WRAPPER = os.path.join(ROOT, "hpc", "psf-mpirun")


def run_python(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run Python on one process, outside any MPI launch (no launcher variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MPI_LOCAL", "OMPI_", "PMI_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_doctor_prints_a_row_per_rank_under_mpiexec():
    proc = run_mpi(3, ["-m", "psframework.doctor"], timeout=60)
    assert proc.returncode == 0, describe(proc)
    out = proc.stdout
    for line in ("MPI library      MPICH", "world size       3", "thread level", "CUDA-aware MPI   no",
                 "torch            ", "CuPy             "):
        assert line in out, out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert [r[0] for r in rows] == ["0", "1", "2"], out
    assert [r[3] for r in rows] == ["0", "1", "2"] and all(r[4] == "MPI_LOCALRANKID" for r in rows), out
    assert all(r[-1] == "cpu" for r in rows), out


def test_doctor_works_on_one_process_and_as_json():
    proc = run_python("-m", "psframework.doctor", "--json")
    assert proc.returncode == 0, describe(proc)
    report = json.loads(proc.stdout)
    assert report["global"]["world_size"] == 1 and len(report["ranks"]) == 1
    assert report["global"]["cuda_aware"] is False and report["ranks"][0]["threads"] >= 1
    assert report["ranks"][0]["local_rank_source"] == "MPI_COMM_TYPE_SHARED split"


def test_roles_need_a_server_and_a_worker():
    proc = run_python("-c", "from psframework.comm import setup_roles; setup_roles()")
    assert proc.returncode != 0
    assert "world size: got 1, expected at least 2 MPI processes" in proc.stderr, describe(proc)


def test_bench_comm_writes_its_report(tmp_path):
    out = tmp_path / "bench"
    proc = run_mpi(2, ["-m", "psframework.bench.comm", "--quick", "--max-size", "65536", "--out", str(out)],
                   timeout=90)
    assert proc.returncode == 0, describe(proc)
    report = json.loads((out / "comm.json").read_text())
    sizes = [row["bytes"] for row in report["bandwidth"]]
    assert sizes == [1 << i for i in range(10, 17)]
    for row in report["bandwidth"]:
        assert row["pingpong_MBps"] > 0 and row["server_to_worker_MBps"] > 0 and row["worker_to_server_MBps"] > 0
    assert report["first_k"] and report["first_k"][0]["workers"] == 1
    assert report["acceptance"]["passed"] is None  # no message of 4 MiB in a quick run
    md = (out / "comm.md").read_text()
    assert "| 64 KiB |" in md and "mpiexec -n 2 python -m mpi4py -m psframework bench comm" in md
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_bench_comm_on_one_process_says_how_to_run_it():
    proc = run_python("-c", "import sys; from psframework.bench.comm import main; sys.exit(main([]))")
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs at least 2 MPI processes, got 1" in lines[0]
    assert "mpiexec -n 2 python -m mpi4py -m psframework bench comm" in lines[0]


def test_psf_mpirun_builds_the_mpiexec_and_srun_commands():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.pop("PSF_LAUNCHER", None)
    proc = subprocess.run([WRAPPER, "--dry-run", "-n", "3", "train", "cfg.yaml", "code.n=2"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split() == [mpiexec_path(), "-n", "3", os.path.join(ROOT, ".venv", "bin", "python"),
                                   "-m", "mpi4py", "-m", "psframework", "train", "cfg.yaml", "code.n=2"]
    slurm = dict(env, SLURM_JOB_ID="42", PSF_LAUNCHER="srun")
    proc = subprocess.run([WRAPPER, "--dry-run", "train", "cfg.yaml"], env=slurm, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0 and proc.stdout.split()[:2] == ["srun", "--mpi=pmix"], describe(proc)
    proc = subprocess.run([WRAPPER, "train", "cfg.yaml"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "give the number of ranks" in proc.stderr
    proc = subprocess.run([WRAPPER, "-n", "0", "doctor"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "-n: got '0'" in proc.stderr


def test_psf_mpirun_runs_psf_under_mpi():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1")
    proc = subprocess.run([WRAPPER, "-n", "2", "doctor"], env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, describe(proc)
    assert "world size       2" in proc.stdout, describe(proc)


@pytest.mark.parametrize("name", ["single-node.sbatch", "multi-node-gpu.sbatch"])
def test_sbatch_templates_launch_psf_train_through_mpi4py(name):
    path = os.path.join(ROOT, "jobs", name)
    text = open(path).read()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --ntasks" in text
    assert 'srun --mpi=pmix --cpu-bind=cores python -m mpi4py -m psframework train "$@"' in text
    assert subprocess.run(["bash", "-n", path], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run(["bash", path], capture_output=True, text=True, timeout=30)  # no config given
    assert proc.returncode == 2 and "usage: sbatch jobs/" in proc.stderr
