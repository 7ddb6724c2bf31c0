"""MPI transport and rounds: roles, enveloped tensor messages, first-k-of-n receives, the message vocabulary.

Names are loaded on first use, so that the parts without MPI (envelopes, errors) import without
initialising MPI. Threads, GPU binding, stragglers and network emulation live in psframework.runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

_EXPORTS = {
    "Envelope": "envelope", "Kind": "envelope", "Phase": "envelope", "Header": "envelope",
    "make_tag": "envelope", "split_tag": "envelope",
    "WatchdogTimeout": "errors", "MessageMismatch": "errors", "TooFewWorkers": "errors",
    "TensorInfo": "buffers", "tensor_info": "buffers", "host_empty": "buffers",
    "CudaAwareness": "cuda", "detect_cuda_aware": "cuda", "resolve_cuda_aware": "cuda",
    "Transport": "transport", "DrainReport": "transport", "TransportStats": "stats", "FirstK": "gather",
    "Gather": "gather", "SendHandle": "outbox",
    "RelayedPackets": "relay", "gather_packets": "relay", "send_packet": "relay", "Mailbox": "mailbox",
    "Roles": "roles", "setup_roles": "roles",
    "MPIServerLink": "server_link", "MPIWorkerLink": "worker_link", "ShardedWorkerLink": "worker_link",
    "Msg": "rounds", "Replies": "rounds", "WorkerReport": "rounds",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .buffers import TensorInfo, host_empty, tensor_info
    from .cuda import CudaAwareness, detect_cuda_aware, resolve_cuda_aware
    from .envelope import Envelope, Header, Kind, Phase, make_tag, split_tag
    from .errors import MessageMismatch, TooFewWorkers, WatchdogTimeout
    from .gather import FirstK, Gather
    from .relay import RelayedPackets, gather_packets, send_packet
    from .mailbox import Mailbox
    from .outbox import SendHandle
    from .roles import Roles, setup_roles
    from .rounds import Msg, Replies, WorkerReport
    from .server_link import MPIServerLink
    from .stats import TransportStats
    from .transport import DrainReport, Transport
    from .worker_link import MPIWorkerLink, ShardedWorkerLink


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
