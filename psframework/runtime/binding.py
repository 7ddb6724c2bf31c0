"""Local rank on the node and the GPU each rank binds to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from psframework import environment
from psframework.comm.locality import shared_node_comm


@dataclass(frozen=True)
class LocalRank:
    """This rank's index among the ranks of its node, the node's rank count if known, and the source."""

    rank: int
    size: Optional[int]
    source: str


def local_rank(comm: Any = None, environ: Optional[Mapping[str, str]] = None) -> LocalRank:
    """Return the local rank from the launcher's variables, else from a shared-memory split.

    The split is collective over comm; every rank of one launch sees the same variables, so
    either all ranks split or none does.
    """
    launcher = environment.local_rank_vars(environ)
    if launcher is not None:
        return LocalRank(*launcher)
    node = shared_node_comm(comm)
    try:
        return LocalRank(node.Get_rank(), node.Get_size(), "MPI_COMM_TYPE_SHARED split")
    finally:
        node.Free()


def visible_gpu_count() -> int:
    """Return how many CUDA devices this process sees (after CUDA_VISIBLE_DEVICES)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class GpuBinding:
    """The CUDA device a rank uses (None without GPUs) and how it was chosen."""

    local: LocalRank
    visible_gpus: int
    device: Optional[int]

    def describe(self) -> str:
        """Return e.g. 'cuda:1 (local rank 1 from MPI_LOCALRANKID, 4 visible)'."""
        where = "cpu (no GPU visible)" if self.device is None else f"cuda:{self.device}"
        return f"{where} (local rank {self.local.rank} from {self.local.source}, {self.visible_gpus} visible)"


def plan_gpu_binding(comm: Any = None, visible_gpus: Optional[int] = None,
                     environ: Optional[Mapping[str, str]] = None) -> GpuBinding:
    """Return the device for this rank: local rank modulo the visible GPUs."""
    local = local_rank(comm, environ)
    count = visible_gpu_count() if visible_gpus is None else int(visible_gpus)
    if count < 0:
        raise ValueError(f"visible_gpus: got {count}, expected >= 0")
    return GpuBinding(local, count, local.rank % count if count else None)


def bind_gpu(comm: Any = None) -> GpuBinding:
    """Make this rank's GPU the current device for torch (and CuPy if installed); return the binding."""
    return use_gpu(plan_gpu_binding(comm))


def use_gpu(binding: GpuBinding) -> GpuBinding:
    """Make a binding's GPU the current device for torch (and CuPy if installed); return the binding."""
    if binding.device is not None:
        import torch

        torch.cuda.set_device(binding.device)
        try:
            import cupy

            cupy.cuda.Device(binding.device).use()
        except ImportError:
            pass
    return binding


def select_device(setting: str, comm: Any = None) -> Tuple[str, Optional[str]]:
    """Bind this rank's GPU for `cuda` or `auto`; return the torch device and a note.

    Collective over `comm` for every rank alike, GPUs or not (the local rank may need a shared-memory
    split); without `comm` (a single process) the default GPU is used. The note says that `auto`
    found no GPU and falls back to the CPU (None otherwise). `cuda` without a visible GPU was refused
    before start-up (psframework.schemes.preflight).
    """
    if setting == "cpu":
        return "cpu", None
    # Planned on every rank, GPUs or not: a node without any must still take part in the split.
    binding = plan_gpu_binding(comm) if comm is not None else None
    count = binding.visible_gpus if binding is not None else visible_gpu_count()
    if count == 0:
        if setting == "cuda":
            raise RuntimeError("device: cuda, but this rank sees no GPU")
        import socket

        return "cpu", f"psf: device auto: no GPU visible on {socket.gethostname()}, training on the CPU"
    if binding is not None:
        use_gpu(binding)
    return "cuda", None
