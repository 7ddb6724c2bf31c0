"""The environment module: typed accessors, their errors, and the runtime package's MPI-free import."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
from mpiutil import ROOT, describe

from psframework import environment


def test_unset_and_empty_variables_are_not_given():
    assert environment.poll_sleep_s({}) is None
    assert environment.poll_sleep_s({"PSF_POLL_SLEEP_S": " "}) is None
    assert environment.decode_threads({"PSF_DECODE_THREADS": ""}) is None
    assert environment.local_rank_vars({}) is None and environment.local_size_vars({}) is None
    assert environment.cpus_on_node({}) is None and environment.cuda_visible_devices({}) == ""


def test_values_are_read_with_their_types():
    assert environment.poll_sleep_s({"PSF_POLL_SLEEP_S": "0.002"}) == 0.002
    assert environment.decode_threads({"PSF_DECODE_THREADS": " 3 "}) == 3
    assert environment.cpus_on_node({"SLURM_CPUS_ON_NODE": "64"}) == 64
    assert environment.cuda_visible_devices({"CUDA_VISIBLE_DEVICES": "1,0"}) == "1,0"


@pytest.mark.parametrize("read, name, raw, expected", [
    (environment.poll_sleep_s, "PSF_POLL_SLEEP_S", "soon", "a number >= 0"),
    (environment.poll_sleep_s, "PSF_POLL_SLEEP_S", "-1", "a number >= 0"),
    (environment.poll_sleep_s, "PSF_POLL_SLEEP_S", "nan", "a number >= 0"),
    (environment.decode_threads, "PSF_DECODE_THREADS", "0", "an integer >= 1"),
    (environment.decode_threads, "PSF_DECODE_THREADS", "2.5", "an integer >= 1"),
    (environment.cpus_on_node, "SLURM_CPUS_ON_NODE", "-4", "an integer >= 0"),
])
def test_bad_values_name_the_variable_the_value_and_what_is_expected(read, name, raw, expected):
    with pytest.raises(ValueError) as error:
        read({name: raw})
    assert str(error.value) == f"environment variable {name}: got {raw!r}, expected {expected}"


def test_a_launcher_is_recognised_unless_psf_no_mpi_is_set():
    assert not environment.launched_by_mpi({})
    assert environment.launched_by_mpi({"PMI_RANK": "0"})
    assert environment.launched_by_mpi({"SLURM_STEP_ID": "3"})
    assert not environment.launched_by_mpi({"PMI_RANK": "0", "PSF_NO_MPI": "1"})


def test_local_sizes_come_from_the_launcher_then_slurm():
    assert environment.local_size_vars({"MPI_LOCALNRANKS": "4"}) == (4, "MPI_LOCALNRANKS")
    assert environment.local_size_vars({"MPI_LOCALNRANKS": "0"}) is None
    slurm = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3(x2),1", "SLURM_NODEID": "2"}
    assert environment.local_size_vars(slurm) == (1, "SLURM_STEP_TASKS_PER_NODE")


def test_thread_counts_are_exported_and_children_get_a_copy():
    target = {"OMP_NUM_THREADS": "8"}
    environment.export_threads(2, target)
    assert target == dict.fromkeys(environment.THREAD_VARIABLES, "2")
    child = environment.child_environment(target)
    child["OMP_NUM_THREADS"] = "5"
    assert target["OMP_NUM_THREADS"] == "2"


def test_the_requeue_switch_and_the_sweep_point_are_read_here():
    assert environment.requeue_allowed({}) and environment.requeue_allowed({"PSF_REQUEUE": "1"})
    assert not environment.requeue_allowed({"PSF_REQUEUE": " 0 "})
    assert environment.requeue_request({"PSF_REQUEUE_REQUEST": "/tmp/x/requeue"}) == "/tmp/x/requeue"
    assert environment.lost_ranks_file({"PSF_LOST_RANKS": "/tmp/x/lost"}) == "/tmp/x/lost"
    assert environment.notice_pid_file({}) is None and environment.notice_pid_file({"PSF_NOTICE_PID": "/p"}) == "/p"
    assert environment.fault_tolerant({}) and not environment.fault_tolerant({"PSF_FAULT_TOLERANT": "0"})
    assert environment.sweep_point({}) is None and environment.sweep_point({"PSF_SWEEP_POINT": ""}) is None
    assert environment.sweep_point({"SLURM_ARRAY_TASK_ID": "3"}) == "3"
    assert environment.sweep_point({"PSF_SWEEP_POINT": "1", "SLURM_ARRAY_TASK_ID": "3"}) == "1"


# Read where they are used, by the srun launcher (python -m psframework.launch) and a benchmark's own processes.
READ_ELSEWHERE = {"PSF_SRUN_MPI", "PSF_SRUN_CPU_BIND", "PSF_SRUN_ARGS", "PSF_BENCH_JOB"}


def test_every_psf_variable_is_named_in_the_environment_module_only():
    """A PSF_ variable's name as a whole string (a read or a write) appears only in psframework/environment.py."""
    table = {value for name, value in vars(environment).items() if name.isupper() and isinstance(value, str)}
    found = {}
    package = os.path.join(ROOT, "psframework")
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == os.path.join(package, "environment.py"):
                continue
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("PSF_") \
                        and node.value.isidentifier() and node.value not in READ_ELSEWHERE:
                    found.setdefault(node.value, os.path.relpath(path, ROOT))
    assert not found, f"PSF_ variables named outside psframework/environment.py (read them there): {found}"
    assert {"PSF_REQUEUE", "PSF_REQUEUE_REQUEST", "PSF_SWEEP_POINT"} <= table


def test_runtime_and_environment_import_without_mpi():
    code = ("import sys; import psframework.runtime, psframework.environment, psframework.comm; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'; print(psframework.runtime.Stragglers.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == "psframework.runtime.stragglers"


def test_a_rank_that_cannot_start_mpi_gives_up_with_a_traceback(tmp_path):
    import socket
    import time

    from psframework.environment import mpi_init_timeout_s

    assert mpi_init_timeout_s({}) == 600.0 and mpi_init_timeout_s({"PSF_MPI_INIT_TIMEOUT_S": "5"}) == 5.0
    with pytest.raises(ValueError, match="PSF_MPI_INIT_TIMEOUT_S"):
        mpi_init_timeout_s({"PSF_MPI_INIT_TIMEOUT_S": "0"})
    root = ROOT
    with socket.socket() as silent:  # a process manager that never answers: MPI_Init waits for ever
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        env = dict(environment.child_environment(), PMI_PORT=f"127.0.0.1:{silent.getsockname()[1]}", PMI_RANK="0",
                   PMI_SIZE="2", PMI_ID="0", PSF_MPI_INIT_TIMEOUT_S="3", PYTHONPATH=root)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "mpi4py", "-m", "psframework", "train",
                               f"{root}/configs/digits_sazd.yaml", f"output.dir={tmp_path}"],
                              env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and time.monotonic() - t0 < 60
    assert "Timeout (0:00:03)!" in proc.stderr and "in mpi_world" in proc.stderr
