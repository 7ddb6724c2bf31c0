"""Training schemes: the registry, the one driver, and one module per scheme with its server and worker sides."""

from __future__ import annotations

from typing import Any, Dict, Optional

from psframework.schemes.registry import Scheme, SchemeError, get_scheme, register, scheme_names
from psframework.settings import Settings


def train(settings: Settings, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run this rank's part of a training run; rank 0 (or the single process) returns the summary."""
    from psframework.comm.rounds import ServerRounds, WorkerRounds
    from psframework.runtime.node import LOSS, start_node
    from psframework.schemes.common import build_problem
    from psframework.schemes.driver import Problem, run_server, run_worker

    scheme = get_scheme(settings.run.scheme)
    if not scheme.mpi:
        side = scheme.load(scheme.server)(settings, Problem(*build_problem(settings)))
        return run_server(settings, side)
    relay = scheme.coded and settings.transport.dissemination == "relay"
    node = start_node(settings.transport, comm, peers=relay)
    if node.roles.is_server:
        link = ServerRounds(node.transport, node.roles.workers, node.roles, node.emulation,
                            detach_after=settings.transport.detach_after, lost=LOSS)
        side = scheme.load(scheme.server)(settings, Problem(*build_problem(settings)), link)
        return run_server(settings, side, node.roles.size)
    from psframework.runtime.progress import start_progress_thread
    from psframework.runtime.stragglers import start_freezer

    progress = start_progress_thread(node.wants_progress_thread())
    link = WorkerRounds(node.transport, node.roles, node.peers, progress_thread=progress)
    side = scheme.load(scheme.worker)(settings, link)
    freezer = start_freezer(settings.stragglers, node.roles.rank)
    try:
        run_worker(settings, side)
    finally:
        if freezer is not None:
            freezer.stop()
        if progress is not None:
            progress.close()
    return None


__all__ = ["Scheme", "SchemeError", "get_scheme", "register", "scheme_names", "train"]
