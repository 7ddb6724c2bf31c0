"""MPI runtime: roles, enveloped tensor messages, first-k-of-n receives, shard exchange, stragglers.

Names are loaded on first use, so that the parts without MPI (envelopes, straggler injection,
thread planning) import without initialising MPI; mpi4py is imported by this package only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

_EXPORTS = {
    "Envelope": "envelope", "Kind": "envelope", "Phase": "envelope", "Header": "envelope",
    "make_tag": "envelope", "split_tag": "envelope",
    "WatchdogTimeout": "errors", "MessageMismatch": "errors",
    "TensorInfo": "buffers", "tensor_info": "buffers", "host_empty": "buffers",
    "CudaAwareness": "cuda", "detect_cuda_aware": "cuda", "resolve_cuda_aware": "cuda",
    "Transport": "transport", "TransportStats": "transport", "FirstK": "transport", "Gather": "transport",
    "SendHandle": "transport", "RecvHandle": "transport", "DrainReport": "transport",
    "ShardExchange": "exchange", "exchange_shards": "exchange", "Mailbox": "mailbox",
    "Roles": "roles", "setup_roles": "roles",
    "StragglerSpec": "stragglers", "Stragglers": "stragglers",
    "ThreadPlan": "threads", "plan_threads": "threads", "apply_threads": "threads",
    "configure_threads": "threads",
    "LocalRank": "binding", "GpuBinding": "binding", "local_rank": "binding", "plan_gpu_binding": "binding",
    "bind_gpu": "binding", "LinkEmulator": "emulate", "link_emulator": "emulate",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .binding import GpuBinding, LocalRank, bind_gpu, local_rank, plan_gpu_binding
    from .buffers import TensorInfo, host_empty, tensor_info
    from .cuda import CudaAwareness, detect_cuda_aware, resolve_cuda_aware
    from .emulate import LinkEmulator, link_emulator
    from .envelope import Envelope, Header, Kind, Phase, make_tag, split_tag
    from .errors import MessageMismatch, WatchdogTimeout
    from .exchange import ShardExchange, exchange_shards
    from .mailbox import Mailbox
    from .roles import Roles, setup_roles
    from .stragglers import StragglerSpec, Stragglers
    from .threads import ThreadPlan, apply_threads, configure_threads, plan_threads
    from .transport import DrainReport, FirstK, Gather, RecvHandle, SendHandle, Transport, TransportStats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
