"""Training schemes: the registry, the one driver, and one module per scheme with its server and worker sides."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from psframework.schemes.registry import Scheme, SchemeError, get_scheme, register, scheme_names
from psframework.settings import Settings

if TYPE_CHECKING:  # the groups need torch: the command line starts without it
    from psframework.schemes.groups import Group


def train(settings: Settings, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run this rank's part of a training run; rank 0 (or the single process) returns the summary.

    Raises startup.RunEnds on every rank when any rank finds a bad input before training starts, and
    runtime.preempt.Preempted on every rank when a preemption signal stopped it early with a checkpoint.
    """
    from psframework.runtime.preempt import watch
    from psframework.schemes.startup import attempt, preflight

    rank = comm.Get_rank() if comm is not None else 0
    flag = watch(settings.run.preempt_signal)  # from the start: a signal during start-up stops after iteration 1
    try:
        opening, outcome = attempt(lambda: preflight(settings, rank, comm))
        _agree_or_close(comm, outcome, opening)
        try:
            return _train(settings, comm, opening)
        finally:
            opening.close()
    finally:
        flag.uninstall()


def _train(settings: Settings, comm: Any, opening: Any) -> Optional[Dict[str, Any]]:
    """Build this rank's side, agree that every rank could, and run it."""
    from psframework.schemes.startup import agree, attempt

    from psframework.schemes.groups import ServerGroup, SoleServer

    scheme = get_scheme(settings.run.scheme)
    if not scheme.mpi:
        from psframework.runtime.binding import select_device

        note = select_device(settings.device)[1]
        if note:
            print(note, flush=True)
        side, outcome = attempt(lambda: _server_side(settings, scheme, opening, None, SoleServer()))
        _agree_or_close(None, outcome, opening)
        from psframework.schemes.driver import run_server

        return run_server(settings, side, opening)
    from psframework.comm.rounds import ServerRounds, WorkerRounds
    from psframework.runtime.node import LOSS, start_node

    relay = scheme.coded and settings.transport.dissemination == "relay"
    groups = settings.run.servers
    sharded = groups > 1 and scheme.shards_parameters
    node = start_node(settings.transport, comm, peers=relay, device=settings.device, groups=groups, shards=sharded)
    if node.device_note and node.roles.is_lead:
        print(node.device_note, flush=True)
    if node.roles.is_server:
        roles, transport = node.shards[0] if sharded else (node.roles, node.transport)
        link = ServerRounds(transport, roles.workers, roles, node.emulation,
                            detach_after=_detach_after(settings), lost=LOSS)
        group = ServerGroup(node.across, node.roles.group, groups) if groups > 1 else SoleServer()
        side, outcome = attempt(lambda: _server_side(settings, scheme, opening, link, group))
        _agree_or_close(comm, outcome, opening)
        from psframework.schemes.driver import run_server

        return run_server(settings, side, opening, node.roles.world.Get_size())
    worker = scheme.load(scheme.sides(groups)[1])
    link = WorkerRounds(node.transport, node.roles, node.peers, across=node.across, all_workers=node.all_workers)
    if sharded:
        from psframework.comm.rounds import ShardedWorkerRounds

        link = ShardedWorkerRounds([WorkerRounds(t, r) for r, t in node.shards])
    side, outcome = attempt(lambda: worker(settings, link))
    agree(comm, outcome)
    _run_worker(settings, side, node)
    return None


def _server_side(settings: Settings, scheme: Scheme, opening: Any, link: Any, group: "Group") -> Any:
    """Build a server's side with its problem and restore the checkpoint it resumes from (the lead's)."""
    from psframework.schemes.common import build_problem
    from psframework.schemes.driver import Problem, resume

    server = scheme.load(scheme.sides(group.count)[0])
    side = server(settings, Problem(*build_problem(settings)), link, group)
    resume(side, opening.checkpoint)
    return side


def _detach_after(settings: Settings) -> Optional[int]:
    """Return how far a worker may lag before its server detaches it; None: never.

    With several servers no worker is detached: DEU workers sum their coded gradients with the
    workers of the same packet in the other groups every update (Stanza's workers their conv
    gradients with every worker), so a worker that skipped ahead would pair its sums with the wrong
    iteration's; and a worker of sharded servers would have to rejoin each of them. A slow worker is
    waited for or, with backup workers, left out of the rounds it is late for.
    """
    return None if settings.run.servers > 1 else settings.transport.detach_after


def _agree_or_close(comm: Any, outcome: Any, opening: Any) -> None:
    """Agree on the second start-up point; a failure releases the run directory and what was made for it."""
    from psframework.schemes.startup import agree

    try:
        agree(comm, outcome)
    except BaseException:
        if opening is not None:
            opening.close(failed=True)
        raise


def _run_worker(settings: Settings, side: Any, node: Any) -> None:
    """Run a worker's side with its progress thread and straggler freezer."""
    from psframework.runtime.progress import start_progress_thread
    from psframework.runtime.stragglers import start_freezer
    from psframework.schemes.driver import run_worker

    progress = start_progress_thread(node.wants_progress_thread())
    side.link.progress_thread = progress
    freezers: List[Any] = []  # the freeze model stalls training, not set-up: it starts once the server knows
    try:
        run_worker(settings, side, lambda: freezers.append(start_freezer(settings.stragglers, node.roles.world_rank)))
    finally:
        for freezer in filter(None, freezers):
            freezer.stop()
        if progress is not None:
            progress.close()


__all__ = ["Scheme", "SchemeError", "get_scheme", "register", "scheme_names", "train"]
