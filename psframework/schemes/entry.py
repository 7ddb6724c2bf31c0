"""The entry point of a training run: build this rank's side, agree at each start-up point, run it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from psframework.schemes.registry import get_scheme
from psframework.settings import Settings

if TYPE_CHECKING:  # the groups need torch: the command line starts without it
    from psframework.comm.links import ServerLink
    from psframework.schemes.groups import Group


def train(settings: Settings, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run this rank's part of a training run; rank 0 (or the single process) returns the summary.

    Raises startup.RunEnds on every rank when any rank finds a bad input before training starts, and
    runtime.preempt.Preempted on every rank when a preemption signal stopped it early with a checkpoint.
    """
    from psframework.runtime.preempt import watch
    from psframework.schemes.startup import attempt, preflight

    from psframework.comm.timeline import TIMELINE
    from psframework.runtime.preempt import Preempted

    rank = comm.Get_rank() if comm is not None else 0
    flag = watch(settings.run.preempt_signal)  # from the start: a signal during start-up stops after iteration 1
    run = settings.run
    TIMELINE.configure(run.trace, run.trace_iterations, run.trace_window)
    try:
        opening, outcome = attempt(lambda: preflight(settings, rank, comm))
        _agree_or_close(comm, outcome, opening)
        try:
            summary = _train(settings, comm, opening)
        except Preempted:
            write_trace(settings, comm)
            raise
        finally:
            opening.close()
        write_trace(settings, comm)
        return summary
    finally:
        flag.uninstall()


def write_trace(settings: Settings, comm: Any) -> None:
    """Gather every rank's timeline on rank 0 and write trace.json (atomically) into the run directory."""
    from psframework.comm.timeline import TIMELINE, newest_of_job, trace_json
    from psframework.fileio import atomic_write_text

    run = settings.run
    if not run.trace:
        return
    spans = list(TIMELINE.spans)
    every = [spans] if comm is None else comm.gather(spans, root=0)
    if every is None:
        return
    if run.trace_window is None:
        every = newest_of_job(every, run.trace_iterations)
    servers = run.servers if get_scheme(run.scheme).mpi else len(every)
    names = [f"rank {r} ({'server' if r % (len(every) // servers) == 0 else 'worker'})" for r in range(len(every))]
    atomic_write_text(os.path.join(run.run_dir, "trace.json"), trace_json(every, names))


def _train(settings: Settings, comm: Any, opening: Any) -> Optional[Dict[str, Any]]:
    """Build this rank's side, agree that every rank could, and run it."""
    from psframework.schemes.groups import SoleServer
    from psframework.schemes.startup import agree, attempt

    scheme = get_scheme(settings.run.scheme)
    if not scheme.mpi:
        from psframework.runtime.binding import select_device

        note = select_device(settings.device)[1]
        if note:
            print(note, flush=True)
        server = scheme.load(scheme.server)
        group = SoleServer(settings.optim.label_smoothing)
        side, outcome = attempt(lambda: _server_side(settings, server, opening, None, group))
        _agree_or_close(None, outcome, opening)
        from psframework.schemes.driver import run_server

        return run_server(settings, side, opening)
    from psframework.schemes.topology import join

    topology = join(settings, scheme, comm)
    node = topology.node
    if node.device_note and node.roles.is_lead:
        print(node.device_note, flush=True)
    if node.roles.is_server:
        side, outcome = attempt(lambda: _server_side(settings, topology.side, opening, topology.link, topology.group))
        _agree_or_close(comm, outcome, opening)
        from psframework.schemes.driver import run_server

        return run_server(settings, side, opening, node.roles.world.Get_size(), node.hosts)
    side, outcome = attempt(lambda: topology.side(settings, topology.link))
    agree(comm, outcome)
    _run_worker(settings, side, node)
    return None


def _server_side(settings: Settings, server: Any, opening: Any, link: Optional["ServerLink"], group: "Group") -> Any:
    """Build a server's side with its problem and restore the checkpoint it resumes from (the lead's)."""
    from psframework.schemes.common import build_problem
    from psframework.schemes.driver import Problem, resume

    side = server(settings, Problem(*build_problem(settings)), link, group)
    resume(side, opening.checkpoint)
    return side


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
    side.link.use_progress_thread(progress)
    freezers: List[Any] = []  # the freeze model stalls training, not set-up: it starts once the server knows
    try:
        run_worker(settings, side, lambda: freezers.append(start_freezer(settings.stragglers, node.roles.world_rank)))
    finally:
        for freezer in filter(None, freezers):
            freezer.stop()
        if progress is not None:
            progress.close()
