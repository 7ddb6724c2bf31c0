"""Node runtime: threads per rank, GPU binding, straggler injection and network emulation (no MPI on import)."""

from .binding import GpuBinding, LocalRank, bind_gpu, local_rank, plan_gpu_binding
from .emulate import LinkEmulator, link_emulator
from .stragglers import StragglerSpec, Stragglers
from .threads import ThreadPlan, apply_threads, configure_threads, plan_threads

__all__ = ["GpuBinding", "LinkEmulator", "LocalRank", "StragglerSpec", "Stragglers", "ThreadPlan", "apply_threads",
           "bind_gpu", "configure_threads", "link_emulator", "local_rank", "plan_gpu_binding", "plan_threads"]
