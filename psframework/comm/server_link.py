"""Rank 0's side of the rounds over MPI: send to the workers, take the first k replies (or all), time the round.

Workers are named by their packet index j = 0..n-1. Which workers are live (detached, readmitted,
lost) is the roster's (membership.py). Nothing here knows models, codes or the config.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .envelope import Envelope, Kind
from .errors import WatchdogTimeout
from .membership import Membership, RankLoss, Roster
from .rounds import SETUP_PATIENCE, Msg, Replies, WorkerReport, cpu_per_iteration, probe_fields, rotating_subsets
from .timeline import TIMELINE


def _kind_name(envelope: Envelope) -> str:
    """Return a message's kind in words (a timeline span's name)."""
    try:
        return Kind(envelope.kind).name.lower()
    except ValueError:
        return str(envelope.kind)


@dataclass
class RoundClock:
    """Seconds and bytes of the current iteration's rounds."""

    timings: Dict[str, float] = field(default_factory=lambda: {"wait_s": 0.0, "comm_s": 0.0})
    used: List[List[int]] = field(default_factory=list)
    sent0: int = 0
    received0: int = 0


STOP_GRACE_S = 5.0  # how long the stop waits for the workers' reports before it asks whether a rank died


class MPIServerLink:
    """Rank 0's side of every round: send to workers, take the first replies, name workers by index.

    A worker that has stopped is detached, and readmitted when it asks to rejoin: `roster` applies
    the rule (membership.py) and `members` records it. A worker that is behind but still answering
    is slow, not stopped: it keeps its backlog and catches up by skipping the replies the server no
    longer needs.
    """

    def __init__(self, transport: Any, workers: Sequence[int], roles: Any = None, emulation: Any = None,
                 detach_after: Optional[int] = 2, say: Callable[[str], None] = print,
                 lost: Optional[RankLoss] = None, detach_after_s: float = 1.0) -> None:
        self.transport = transport
        self.workers = list(workers)
        self.n = len(self.workers)
        self._index = {rank: j for j, rank in enumerate(self.workers)}
        self.roles, self.emulation = roles, emulation
        self.clock = RoundClock()
        self.subsets: Optional[Iterator[tuple]] = None
        self.members = Membership(detach_after, detach_after_s)
        self.say = say
        self.rank_died = lost or RankLoss()  # whether a rank of the job died (told, or seen by the rounds)
        self.roster = Roster(transport, self.workers, self.members, self._index, say, self.rank_died)

    @property
    def job_workers(self) -> Sequence[int]:
        """Return the ranks in the job of every worker of every group (straggler models name workers so)."""
        return self.workers if self.roles is None else self.roles.job_workers

    def job_rank(self, index: int) -> int:
        """Return the rank in the job of the worker with packet index `index`."""
        if self.roles is None:
            return self.workers[index]
        return self.roles.job_workers[self.roles.group * self.n + index]

    @property
    def live(self) -> List[int]:
        """Return the worker ranks that are not detached."""
        return self.roster.live

    def require(self, needed: int) -> None:
        """Declare how many workers a round needs: below that, rank 0 waits for detached ones to rejoin."""
        self.members.needed = needed

    def start_iteration(self, iteration: int, state_for: Callable[[int, int], Any], readmit: bool = True) -> None:
        """Readmit the detached workers that asked to rejoin (`readmit`: an optimizer step starts here), waiting
        for one while too few are live."""
        self.roster.start_iteration(iteration, state_for, readmit)

    def rotate_subsets(self, k: int) -> None:
        """Decode every round from the next k-subset in turn (waiting for all), to exercise every path."""
        self.subsets = rotating_subsets(self.n, k)

    def index(self, rank: int) -> int:
        """Return the packet index of a worker rank."""
        return self._index[rank]

    def announce(self, values: Any) -> None:
        """Tell every worker where the run starts (a collective broadcast)."""
        self.transport.comm.bcast(values, root=0)

    def await_workers(self, start: int) -> None:
        """Wait until every worker has started (the watchdog names the ones that have not).

        The first iteration begins only then: a worker still setting up would otherwise look silent
        to the detach rule once the others had run `detach_after` iterations without it.
        """
        try:
            timeout = self.transport.resolve_timeout()
            patience = None if timeout is None else SETUP_PATIENCE * timeout
            self.transport.post_gather(self.workers, Msg.started(start), None).wait(self.n, timeout_s=patience)
        except WatchdogTimeout as exc:
            raise WatchdogTimeout(exc.ranks, "their set-up before the first iteration", exc.timeout_s, exc.arrived,
                                  exc.needed) from None

    def begin_iteration(self) -> None:
        """Start timing a new iteration's rounds."""
        stats = self.transport.stats
        self.clock = RoundClock(sent0=stats.sent_bytes, received0=stats.received_bytes)

    def iteration_fields(self) -> Dict[str, Any]:
        """Return the current iteration's bytes, the workers each round used and how many are attached."""
        stats = self.transport.stats
        return {"bytes_sent": stats.sent_bytes - self.clock.sent0,
                "bytes_received": stats.received_bytes - self.clock.received0, "used": list(self.clock.used),
                "workers_live": len(self.live)}

    def expect(self, reply: Envelope, ranks: Optional[Sequence[int]] = None) -> Any:
        """Pre-post the receives of a round's replies (before sending, so that none waits unmatched)."""
        t0 = time.perf_counter()
        gather = self.transport.post_gather(self.live if ranks is None else ranks, reply)
        self.clock.timings["comm_s"] += time.perf_counter() - t0
        return gather

    def send(self, payloads: Any, envelope: Envelope, ranks: Optional[Sequence[int]] = None) -> None:
        """Start sending payloads[i] to ranks[i] (every worker by default; one tensor goes to all).

        Detached workers are skipped; a worker that falls too far behind is detached here.
        """
        ranks = self.workers if ranks is None else list(ranks)
        if not isinstance(payloads, (list, tuple)):
            payloads = [payloads] * len(ranks)
        t0 = time.perf_counter()
        live = [(rank, payload) for rank, payload in zip(ranks, payloads) if rank not in self.members.detached]
        for rank, payload in live:
            self.transport.isend(rank, payload, envelope)
        self.roster.detach_laggards([rank for rank, _ in live])
        self.clock.timings["comm_s"] += time.perf_counter() - t0
        TIMELINE.add("send", f"send {_kind_name(envelope)}", t0, time.perf_counter() - t0)

    def collect(self, gather: Any, need: int, rotate: bool = True) -> Replies:
        """Wait for the first `need` replies (or, rotating, for all and use the next subset)."""
        t0 = time.perf_counter()
        if rotate and self.subsets is not None and need < self.n and not self.members.detached:
            # Every reply, while every worker answers: one that has stopped is detached, and the first k decode.
            result = gather.wait(len(gather.sources), least=need, settle=lambda: bool(self._silent(gather)))
            if len(result.arrived) == len(gather.sources):
                chosen = [self.workers[i] for i in next(self.subsets)]
            else:
                for rank in self._silent(gather):
                    if self.roster.can_detach():
                        self.roster.detach(rank)
                chosen = result.arrived[:need]
        else:
            result = gather.wait(need)
            chosen = result.first
        self.clock.timings["wait_s"] += result.wait_s
        self.clock.timings["comm_s"] += max(0.0, time.perf_counter() - t0 - result.wait_s)
        TIMELINE.add("wait", f"wait for {need} of {len(gather.sources)}", t0, result.wait_s)
        self.clock.used.append(sorted(chosen))
        return Replies({self.index(r): result.data[r] for r in chosen}, sorted(chosen))

    def _silent(self, gather: Any) -> List[int]:
        """Return the workers whose reply a gather still waits for and that have stopped (silent for detach_after_s)."""
        arrived = gather.arrived()
        return [r for r in gather.sources if r not in arrived and self.roster.stopped(r, time.monotonic())]

    def collect_within(self, gather: Any, timeout_s: float) -> Replies:
        """Wait up to timeout_s for every reply; return those that came (possibly fewer)."""
        t0 = time.perf_counter()
        data = gather.wait_within(timeout_s)
        self.clock.timings["wait_s"] += time.perf_counter() - t0
        TIMELINE.add("wait", "wait for every reply", t0, time.perf_counter() - t0)
        ranks = sorted(data)
        return Replies({self.index(r): data[r] for r in ranks}, ranks)

    def round(self, payloads: Any, envelope: Envelope, reply: Envelope, need: int, rotate: bool = True) -> Replies:
        """Send to every worker and return the first `need` replies (`rotate`: as `collect`)."""
        gather = self.expect(reply)
        self.send(payloads, envelope)
        return self.collect(gather, need, rotate)

    def finish(self, recorder: Any, total: int) -> Dict[str, Any]:
        """Stop the workers, close the transport and return the summary's communication fields."""
        reports = self.stop_workers(total)
        drained = self.transport.close(timeout_s=1.0)
        if self.roles is not None:
            self.roles.free()
        stats = self.transport.stats
        return {"mean_wait_s": recorder.mean("wait_s", skip=1),
                "cpu_s_per_iteration": cpu_per_iteration(recorder.mean("cpu_s", skip=1), reports.values()),
                "server_bytes_sent": stats.sent_bytes, "server_bytes_received": stats.received_bytes,
                "server_bytes_sent_per_iteration": recorder.mean("bytes_sent", skip=1),
                "server_bytes_received_per_iteration": recorder.mean("bytes_received", skip=1),
                "late_replies_drained": stats.late_drained + drained.completed,
                "messages_dropped": stats.dropped_messages, "membership": self.members.log,
                "lost_workers": self.members.lost,
                "emulation": self.emulation() if self.emulation else None, "workers": reports}

    def stop_early(self, iteration: int) -> None:
        """Tell every worker that the run stops after `iteration` (they answer a sync, then the stop)."""
        self.roster.note_failures()
        for rank in [r for r in self.workers if r not in self.members.lost]:
            self.transport.isend(rank, np.zeros(1), Msg.stop_early(iteration), urgent=rank in self.members.detached)

    def stop_workers(self, total: int) -> Dict[str, Dict[str, float]]:
        """Tell every worker to stop (detached ones too); return their reports {rank: {field: value}}.

        Once a rank of the job has died, a worker that has not answered within STOP_GRACE_S is lost.
        """
        self.roster.note_failures()
        ranks = [r for r in self.workers if r not in self.members.lost]
        gather = self.transport.post_gather(ranks, Msg.stop(total))
        # The stop says whether a rank died: the workers then leave without MPI_Finalize (see RankLoss).
        died = np.array([float(self.rank_died())])
        for rank in ranks:
            self.transport.isend(rank, died, Msg.stop(total), urgent=rank in self.members.detached)
        reports = gather.wait_within(STOP_GRACE_S, keep=True)
        if len(reports) < len(ranks) and not self.rank_died():
            reports = gather.wait(len(ranks)).data  # the watchdog names whoever stays silent
        gather.release()
        silent = [r for r in ranks if r not in reports]
        if silent:
            self.say(f"psf: rank(s) {', '.join(map(str, self.transport.named(silent)))} lost: no answer after a rank "
                     "of the job died")
        self.members.lost += silent
        if self.members.lost:
            lost = self.transport.named(sorted(self.members.lost))
            self.rank_died.note(lost)
            self.say(f"psf: the run finished without rank(s) {', '.join(map(str, lost))}")
        for rank, detached_at in self.members.detached.items():  # take the rejoin requests no one will answer
            if rank in reports and self.transport.has_message(rank, *probe_fields(Msg.rejoin(0))):
                self.transport.post_gather([rank], Msg.rejoin(detached_at), None).wait(1)
        return {str(rank): WorkerReport.from_vector(reports[rank].tolist()) for rank in self.workers if rank in reports}
