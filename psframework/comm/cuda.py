"""Find out whether the MPI library accepts CUDA device buffers (is CUDA-aware)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, List, Optional, Union

SETTINGS = ("auto", "true", "false")


@dataclass(frozen=True)
class CudaAwareness:
    """Whether device buffers may go to MPI directly, and how that was decided."""

    aware: bool
    method: str


def memory_kinds_allow_cuda(kinds: str) -> bool:
    """Return whether an ``mpi_memory_alloc_kinds`` value lists CUDA device memory."""
    for kind in kinds.split(","):
        name, _, restrictors = kind.strip().partition(":")
        if name == "cuda" and (not restrictors or "device" in restrictors.split(":")):
            return True
    return False


def _info_value(info: Any, key: str, free: bool) -> Optional[str]:
    try:
        return info.Get(key)
    finally:
        if free:
            info.Free()


def _libraries() -> List[str]:
    """Return the MPI extension module and any libmpi mapped into this process."""
    from mpi4py import MPI

    paths = [MPI.__file__]
    try:
        with open("/proc/self/maps") as maps:
            paths += sorted({line.split()[-1] for line in maps
                             if "libmpi" in line and line.split()[-1].startswith("/")})
    except OSError:
        pass
    return paths


def query_cuda_support() -> Optional[int]:
    """Return MPIX_Query_cuda_support() from the loaded MPI library, or None if it has none."""
    for path in _libraries():
        try:
            function = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int
        function.argtypes = []
        return int(function())
    return None


def detect_cuda_aware(comm: Any = None) -> CudaAwareness:
    """Detect CUDA-awareness: mpi_memory_alloc_kinds first, then MPIX_Query_cuda_support."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    for source, info, free in (("communicator", comm.Get_info(), True), ("environment", MPI.INFO_ENV, False)):
        kinds = _info_value(info, "mpi_memory_alloc_kinds", free)
        if kinds is not None and memory_kinds_allow_cuda(kinds):
            return CudaAwareness(True, f"mpi_memory_alloc_kinds={kinds} ({source} info)")
    support = query_cuda_support()
    if support is not None:
        return CudaAwareness(bool(support), f"MPIX_Query_cuda_support()={support}")
    return CudaAwareness(False, "no CUDA memory kind and no MPIX_Query_cuda_support in the MPI library")


def parse_cuda_aware(setting: Union[str, bool]) -> str:
    """Return 'auto', 'true' or 'false' for a cuda_aware setting; raise ValueError otherwise."""
    if isinstance(setting, bool):
        return "true" if setting else "false"
    if isinstance(setting, str) and setting.lower() in SETTINGS:
        return setting.lower()
    raise ValueError(f"cuda_aware: got {setting!r}, expected one of auto, true, false")


def resolve_cuda_aware(setting: Union[str, bool] = "auto", comm: Any = None) -> CudaAwareness:
    """Return the CUDA-awareness to use for a setting of auto, true or false."""
    value = parse_cuda_aware(setting)
    if value == "auto":
        return detect_cuda_aware(comm)
    return CudaAwareness(value == "true", f"set to {value}")
