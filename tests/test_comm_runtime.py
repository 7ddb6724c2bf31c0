"""Local ranks, GPU binding, threads per rank and CUDA-awareness settings (no MPI needed)."""

from __future__ import annotations

import os

import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from psframework.comm.cuda import memory_kinds_allow_cuda, parse_cuda_aware, resolve_cuda_aware
from psframework.environment import THREAD_VARIABLES, slurm_tasks_on_node
from psframework.runtime.binding import local_rank, plan_gpu_binding
from psframework.runtime.threads import apply_threads, plan_threads, ranks_per_node, usable_cores


def test_local_rank_prefers_the_mpi_launchers_variables():
    env = {"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    got = local_rank(environ=env)
    assert (got.rank, got.size, got.source) == (3, 8, "OMPI_COMM_WORLD_LOCAL_RANK")
    env.pop("OMPI_COMM_WORLD_LOCAL_RANK")
    got = local_rank(environ=env)
    assert (got.rank, got.size, got.source) == (2, 4, "MPI_LOCALRANKID")
    got = local_rank(environ={"SLURM_LOCALID": "5"})
    assert (got.rank, got.size, got.source) == (5, None, "SLURM_LOCALID")


def test_bad_launcher_variables_are_named():
    with pytest.raises(ValueError, match="SLURM_LOCALID: got 'x'"):
        local_rank(environ={"SLURM_LOCALID": "x"})


def test_gpu_binding_is_local_rank_modulo_visible_gpus():
    b = plan_gpu_binding(visible_gpus=4, environ={"MPI_LOCALRANKID": "5"})
    assert b.device == 1 and b.describe() == "cuda:1 (local rank 5 from MPI_LOCALRANKID, 4 visible)"
    one = plan_gpu_binding(visible_gpus=1, environ={"SLURM_LOCALID": "3"})  # --gpus-per-task=1
    assert one.device == 0
    none = plan_gpu_binding(visible_gpus=0, environ={"SLURM_LOCALID": "3"})
    assert none.device is None and none.describe().startswith("cpu (no GPU visible)")


# (case, launcher variables of each rank, GPUs each rank sees, the GPU index each rank must bind)
LAYOUTS = [
    ("2 nodes x 4 GPUs, mpirun", [{"OMPI_COMM_WORLD_LOCAL_RANK": str(r % 4), "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
                                  for r in range(8)], 4, [0, 1, 2, 3, 0, 1, 2, 3]),
    ("1 GPU shared by 5 ranks", [{"MPI_LOCALRANKID": str(r), "MPI_LOCALNRANKS": "5"} for r in range(5)], 1,
     [0, 0, 0, 0, 0]),
    ("srun --gpus-per-task=1 (each task sees its own GPU as device 0)",
     [{"SLURM_LOCALID": str(r % 4)} for r in range(8)], 1, [0] * 8),
    ("srun, 2 GPUs per node for 4 tasks (two ranks per GPU)", [{"SLURM_LOCALID": str(r)} for r in range(4)], 2,
     [0, 1, 0, 1]),
]


@pytest.mark.parametrize("case,environs,visible,expected", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_every_rank_of_a_layout_binds_its_gpu(case, environs, visible, expected):
    assert [plan_gpu_binding(visible_gpus=visible, environ=env).device for env in environs] == expected


def test_auto_falls_back_to_the_cpu_with_a_note_and_cpu_binds_nothing(monkeypatch):
    from psframework.runtime import binding

    assert binding.select_device("cpu") == ("cpu", None)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto binds it")
    monkeypatch.setenv("MPI_LOCALRANKID", "0")  # no collective split needed
    device, note = binding.select_device("auto")
    assert device == "cpu" and "device auto: no GPU visible" in note and "training on the CPU" in note


def test_threads_share_the_node_cores_among_its_ranks():
    usable = usable_cores()
    plan = plan_threads(cores_per_node=64, environ={"MPI_LOCALNRANKS": "4"})
    assert plan.ranks_per_node == 4 and plan.source == "MPI_LOCALNRANKS"
    unbound = usable >= (os.cpu_count() or usable)  # unbound ranks split the machine's cores among them
    assert plan.threads == max(1, min(16, usable // 4 if unbound else usable)) and plan.usable_cores == usable
    crowded = plan_threads(cores_per_node=2, environ={"OMPI_COMM_WORLD_LOCAL_SIZE": "6"})
    assert crowded.threads == 1  # oversubscribed: one thread each, never zero
    assert plan_threads(threads=3, environ={"MPI_LOCALNRANKS": "4"}).threads == 3
    assert plan_threads(threads=3, environ={"MPI_LOCALNRANKS": "4"}).source == "override"
    slurm = plan_threads(ranks=1, environ={"SLURM_CPUS_ON_NODE": "1"})
    assert slurm.cores_per_node == 1 and slurm.threads == 1


def test_slurm_task_lists_are_read_per_node():
    assert slurm_tasks_on_node("4(x2),3", 0) == 4
    assert slurm_tasks_on_node("4(x2),3", 1) == 4
    assert slurm_tasks_on_node("4(x2),3", 2) == 3
    assert slurm_tasks_on_node("4(x2),3", 3) is None
    assert slurm_tasks_on_node("four", 0) is None
    env = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2,5", "SLURM_NODEID": "1"}
    assert ranks_per_node(environ=env) == (5, "SLURM_STEP_TASKS_PER_NODE")


def test_bad_thread_settings_are_rejected():
    with pytest.raises(ValueError, match="threads: got -1"):
        plan_threads(threads=-1, environ={"MPI_LOCALNRANKS": "1"})


def test_apply_threads_sets_torch_and_the_environment(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.setenv(name, "7")
    before = torch.get_num_threads()
    try:
        with threadpool_limits(limits=None):  # puts the BLAS limits back on exit
            apply_threads(plan_threads(threads=1, environ={"MPI_LOCALNRANKS": "1"}))
            assert torch.get_num_threads() == 1
            assert all(os.environ[name] == "1" for name in THREAD_VARIABLES)
            assert all(lib["num_threads"] == 1 for lib in threadpool_info())
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kinds, aware", [
    ("mpi,system", False), ("mpi,system,cuda:device", True), ("cuda", True), ("mpi,cuda:host", False),
    ("mpi, cuda:host:device", True), ("", False), ("rocm:device", False),
])
def test_memory_alloc_kinds_are_read(kinds, aware):
    assert memory_kinds_allow_cuda(kinds) is aware


def test_cuda_aware_settings():
    assert parse_cuda_aware("AUTO") == "auto"
    assert parse_cuda_aware(True) == "true" and parse_cuda_aware(False) == "false"
    assert resolve_cuda_aware("true").aware is True and resolve_cuda_aware("true").method == "set to true"
    assert resolve_cuda_aware("false").aware is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="cuda_aware: got"):
            parse_cuda_aware(bad)
