"""Which workers rank 0 counts on: the detach rule for a worker that has stopped, readmission, the dead.

A worker that has stopped is detached: its oldest message kept back by flow control is
`detach_after` iterations old and nothing has come from it (no message, no acknowledgement) since
the first of those iterations began. Its backlog is dropped, it is told so, and rounds go on
without it until it asks to rejoin; `start_iteration` readmits it with the state the scheme gives
it. A worker that is behind but still answering is slow, not stopped: it keeps its backlog and
catches up by skipping the replies the server no longer needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .errors import TooFewWorkers, WatchdogTimeout
from .rounds import Msg, probe_fields
from .timeline import TIMELINE


@dataclass
class Membership:
    """Which workers rank 0 has left out, and when each was detached and readmitted."""

    # A worker whose oldest kept-back message is this many iterations old, and which has neither sent nor
    # acknowledged anything since the first of those iterations began, is detached.
    detach_after: Optional[int] = 2
    # ... and silent for this many seconds too: a working link stalls longer than a few fast iterations (a TCP
    # retransmission waits 0.2 s, then 0.4 s, ...; a slow link takes a while for each message).
    detach_after_s: float = 1.0
    needed: int = 1  # workers a round cannot do without
    detached: Dict[int, int] = field(default_factory=dict)  # rank -> iteration it was detached at
    log: List[Dict[str, Any]] = field(default_factory=list)
    lost: List[int] = field(default_factory=list)  # ranks that never answered again after a rank died

    def record(self, rank: int, **event: Any) -> None:
        """Add an event to the log: a detach opens an entry, a readmission closes it."""
        if "detached_at" in event:
            self.log.append({"rank": rank, **event, "readmitted_at": None})
            return
        for entry in reversed(self.log):
            if entry["rank"] == rank and entry["readmitted_at"] is None:
                entry.update(event)
                return


class RankLoss:
    """Whether a rank of the job died, and the ranks in the job a run finished without (where known).

    A rank that knows leaves without MPI_Finalize, which would wait for the dead one for ever. Rank 0
    notes what its rounds learn (the MPI reports a worker failed, or a worker never answers the stop)
    and its stop message tells the workers, as no process manager does under srun.
    """

    def __init__(self) -> None:
        self.noticed = False
        self.ranks: List[int] = []
        self.last_beat = time.monotonic()  # when rank 0 last started an iteration
        self.stall_s: Optional[float] = None  # how long rank 0 may go without one once a rank died (None: for ever)

    def note(self, ranks: Sequence[int] = ()) -> None:
        """Take a rank's death as known here, with the ranks the run finished without (if known)."""
        self.noticed = True
        self.ranks = sorted(set(self.ranks) | set(ranks))

    def beat(self) -> None:
        """Say that rank 0 has started an iteration: it is not stuck."""
        self.last_beat = time.monotonic()

    def __call__(self) -> bool:
        return self.noticed


class Roster:
    """Rank 0's workers as its rounds see them: detached, readmitted, lost (see the module's docstring).

    `index` is {worker rank: packet index}, `say` prints a line, `rank_died` says whether a rank of the
    job died (told by the process manager, or noted here when the MPI reports a worker failed).
    """

    def __init__(self, transport: Any, workers: Sequence[int], members: Membership, index: Dict[int, int],
                 say: Callable[[str], None], rank_died: RankLoss) -> None:
        self.transport = transport
        self.workers = workers
        self.members = members
        self._index = index
        self.iteration = 0
        self.started: Dict[int, float] = {}  # when recent iterations began (time.monotonic), for the detach rule
        self.say = say
        self.rank_died = rank_died

    @property
    def live(self) -> List[int]:
        """Return the worker ranks that are not detached."""
        return [r for r in self.workers if r not in self.members.detached]

    def start_iteration(self, iteration: int, state_for: Callable[[int, int], Any], readmit: bool = True) -> None:
        """Readmit the detached workers that asked to rejoin (`readmit`: an optimizer step starts here), waiting
        for one while too few are live."""
        self.iteration = iteration
        self.rank_died.beat()
        self.started[iteration] = time.monotonic()
        self.started.pop(iteration - (self.members.detach_after or 0) - 1, None)
        self.note_failures()
        detached = self.members.detached
        asking = ([r for r in detached if self.transport.has_message(r, *probe_fields(Msg.rejoin(0)))]
                  if readmit else [])
        for rank in asking:
            self.readmit(rank, iteration, state_for)
        while len(self.live) < self.members.needed:
            ranks = sorted(detached)
            if self.rank_died() or self.members.lost:
                raise TooFewWorkers(f"rank(s) {', '.join(map(str, ranks))} stopped answering after a rank of the job "
                                    f"died: {len(self.live)} workers left, {self.members.needed} needed")
            self.say(f"psf: {len(self.live)} live workers, {self.members.needed} needed: waiting for rank(s) "
                     f"{', '.join(map(str, ranks))} to answer again")
            self.readmit(self.first_rejoin(ranks), iteration, state_for)

    def note_failures(self) -> None:
        """Take every worker the MPI reports failed as lost: left out from now on (said once per rank)."""
        for rank in sorted(r for r in self.transport.failed if r in self._index and r not in self.members.lost):
            self.members.lost.append(rank)
            self.rank_died.note(self.transport.named([rank]))
            if rank not in self.members.detached:
                self.members.detached[rank] = self.iteration
                self.members.record(rank, detached_at=self.iteration)
            self.say(f"psf: rank {self.transport.named([rank])[0]} died (the MPI reports it failed) by iteration "
                     f"{self.iteration}; training goes on with {len(self.live)} workers ({self.members.needed} needed)")

    def first_rejoin(self, ranks: Sequence[int]) -> int:
        """Wait until one of `ranks` asks to rejoin; return it (the watchdog names them all if none does)."""
        asking: List[int] = []

        def asked() -> bool:
            asking[:] = [r for r in ranks if self.transport.has_message(r, *probe_fields(Msg.rejoin(0)))]
            return bool(asking)

        if not self.transport.wait_until(asked):
            raise WatchdogTimeout(self.transport.named(ranks), "a rejoin request of a detached worker",
                                  self.transport.resolve_timeout(), [], 1)
        return asking[0]

    def readmit(self, rank: int, iteration: int, state_for: Callable[[int, int], Any]) -> None:
        """Take a worker's rejoin request and send it a fresh state to go on from `iteration`."""
        self.transport.post_gather([rank], Msg.rejoin(self.members.detached[rank]), None).wait(1)
        state = state_for(self._index[rank], iteration)
        del self.members.detached[rank]
        self.transport.isend(rank, state, Msg.readmit(iteration))
        TIMELINE.instant("membership", f"rank {rank} readmitted")
        self.members.record(rank, readmitted_at=iteration)
        self.say(f"psf: rank {rank} readmitted at iteration {iteration}")

    def detach_laggards(self, ranks: Sequence[int]) -> None:
        """Detach every rank that has stopped: `detach_after` iterations behind and silent since they began."""
        after = self.members.detach_after
        if after is None:
            return
        oldest = self.transport.outbox.oldest_kept
        behind = [r for r in ranks if self.iteration - (oldest(r) or self.iteration) >= after]
        if not behind:
            return
        self.transport.progress()  # take in the credits and messages that have come meanwhile
        since = self.started.get(self.iteration - after + 1, min(self.started.values(), default=0.0))
        for rank in behind:
            if self.stopped(rank, since) and self.can_detach():
                self.detach(rank)

    def can_detach(self) -> bool:
        """Return whether a round could go on without one more worker (more live than it needs).

        Detaching below that would leave the iteration's next rounds with fewer sources than replies
        needed; waiting instead lets the watchdog name every silent worker.
        """
        return len(self.live) > self.members.needed

    def stopped(self, rank: int, since: float) -> bool:
        """Return whether a worker has sent and acknowledged nothing since `since` nor for detach_after_s."""
        heard = self.transport.outbox.heard_from(rank)
        return heard < since and time.monotonic() - heard >= self.members.detach_after_s

    def detach(self, rank: int) -> None:
        """Stop sending to a worker: drop what is kept back for it and tell it (one message beyond its window)."""
        dropped = self.transport.outbox.drop(rank)
        self.transport.isend(rank, np.zeros(1), Msg.detach(self.iteration), urgent=True)
        self.members.detached[rank] = self.iteration
        self.members.record(rank, detached_at=self.iteration)
        TIMELINE.instant("membership", f"rank {rank} detached")
        self.say(f"psf: rank {rank} detached at iteration {self.iteration}: {self.members.detach_after} or more "
                 f"iterations behind and silent since ({dropped} messages dropped)")
        if self.rank_died():
            self.say(f"psf: a rank of the job died: rank {rank} is probably lost; training goes on with "
                     f"{len(self.live)} workers ({self.members.needed} needed)")
