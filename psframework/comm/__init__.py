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
    "Transport": "transport", "TransportStats": "transport", "FirstK": "transport", "Gather": "transport",
    "SendHandle": "transport", "DrainReport": "transport",
    "RelayedPackets": "relay", "gather_packets": "relay", "send_packet": "relay", "Mailbox": "mailbox",
    "Roles": "roles", "setup_roles": "roles",
    "MPIServerLink": "rounds", "MPIWorkerLink": "rounds", "ShardedWorkerLink": "rounds", "Msg": "rounds",
    "Replies": "rounds", "WorkerReport": "rounds",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from .buffers import TensorInfo, host_empty, tensor_info
    from .cuda import CudaAwareness, detect_cuda_aware, resolve_cuda_aware
    from .envelope import Envelope, Header, Kind, Phase, make_tag, split_tag
    from .errors import MessageMismatch, TooFewWorkers, WatchdogTimeout
    from .relay import RelayedPackets, gather_packets, send_packet
    from .mailbox import Mailbox
    from .roles import Roles, setup_roles
    from .rounds import MPIServerLink, MPIWorkerLink, Msg, Replies, ShardedWorkerLink, WorkerReport
    from .transport import DrainReport, FirstK, Gather, SendHandle, Transport, TransportStats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
