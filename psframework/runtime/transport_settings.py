"""The settings of a rank's transport and node (the config's comm section), kept with the runtime that starts them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class TransportSettings:
    """How ranks move tensors: watchdog, CUDA-awareness, threads, emulated links, dissemination."""

    timeout_s: float = 120.0
    cuda_aware: str = "auto"
    threads: int = 0
    bandwidth_gbps: Optional[float] = None
    latency_us: float = 0.0
    dissemination: str = "direct"
    window: int = 4
    detach_after: int = 2
    progress_thread: str = "auto"
    emulated_ranks: str = "all"  # whose links are emulated: "all" or "servers"
    detach_after_s: float = 1.0  # and silent this many seconds: longer than a working link's stalls
