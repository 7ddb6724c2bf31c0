"""Rounds between the server and its workers over MPI (the links), and the one message vocabulary of every scheme.

The transport moves enveloped tensors; this layer knows the shape every scheme shares: the server
sends to its workers, takes the first k replies (or all), times the round, and names workers by
their packet index j = 0..n-1. A worker takes every server message off the wire as it arrives (the
transport's mailbox), replies, and reports its statistics when the run stops. Nothing here knows
models, codes or the config.
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .envelope import Envelope, Kind, Phase
from .errors import TooFewWorkers, WatchdogTimeout
from .timeline import TIMELINE


def _fields(envelope: Envelope) -> Tuple[int, int, int]:
    """Return (kind, layer, phase): what a probe matches on."""
    return envelope.kind, envelope.layer, envelope.phase


class Msg:
    """The message vocabulary: each entry returns the envelope of one kind of message for an iteration.

    command, reply and packet take (iteration, layer, phase); params takes (iteration, layer, phase=);
    the others take the iteration only.
    """

    command = partial(Envelope, Kind.COMMAND)  # server -> worker: an input to compute on
    reply = partial(Envelope, Kind.REPLY)  # worker -> server: the result of a command
    packet = partial(Envelope, Kind.PACKET)  # worker <-> worker: a coded packet of a relayed tensor
    params = partial(Envelope, Kind.PARAMS, phase=Phase.OTHER)  # server -> worker: initial state, weights
    grads = partial(Envelope, Kind.GRADS, layer=0, phase=Phase.BACKWARD)  # worker -> server: gradients
    state = partial(Envelope, Kind.STATE, phase=Phase.OTHER)  # server -> worker: send your state
    state_reply = partial(Envelope, Kind.STATE_REPLY, phase=Phase.OTHER)  # worker -> server: its state
    stop = partial(Envelope, Kind.STOP, phase=Phase.OTHER)  # the end (and the worker's report)
    # Membership: a worker too far behind is detached; when it answers again it is readmitted.
    detach = partial(Envelope, Kind.DETACH, phase=Phase.OTHER)  # server -> worker: you were left out
    rejoin = partial(Envelope, Kind.REJOIN, phase=Phase.OTHER)  # worker -> server: back (detach iteration)
    readmit = partial(Envelope, Kind.READMIT, phase=Phase.OTHER)  # server -> worker: go on here, fresh state
    snapshot = partial(Envelope, Kind.SNAPSHOT, phase=Phase.OTHER)  # server -> worker: your state, please
    snapshot_reply = partial(Envelope, Kind.SNAPSHOT_REPLY, phase=Phase.OTHER)  # worker -> server: its state
    # server -> worker: the run stops after this iteration (a preemption); a sync and the stop follow
    stop_early = partial(Envelope, Kind.STOP_EARLY, phase=Phase.OTHER)
    started = partial(Envelope, Kind.STARTED, phase=Phase.OTHER)  # worker -> server: ready to train
    # stanza: the features of a worker's shard, and the gradient of the loss with respect to them
    features = partial(Envelope, Kind.FEATURES, phase=Phase.FORWARD)  # worker -> server
    feature_grads = partial(Envelope, Kind.FEATURE_GRADS, phase=Phase.BACKWARD)  # server -> worker
    # loss scaling: an optimizer step's scale and whether it is taken, and the workers' finiteness of theirs
    scale = partial(Envelope, Kind.SCALE, phase=Phase.UPDATE)  # server -> worker
    scale_reply = partial(Envelope, Kind.SCALE_REPLY, phase=Phase.UPDATE)  # worker -> server


def _kind_name(envelope: Envelope) -> str:
    """Return a message's kind in words (a timeline span's name)."""
    try:
        return Kind(envelope.kind).name.lower()
    except ValueError:
        return str(envelope.kind)


class Detached(Exception):
    """Raised on a worker that the server has left out; it rejoins with a fresh state."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"detached at iteration {iteration}")
        self.iteration = iteration


class StopEarly(Exception):
    """Raised on a worker that the server told to stop after `iteration` (the run was preempted)."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"the run stops after iteration {iteration}")
        self.iteration = iteration


class WorkerReport:
    """What a worker counts and reports when it stops."""

    # cpu_s: processor seconds (every thread) of the steps after the first, cpu_steps: how many steps.
    FIELDS = ("replies_sent", "replies_skipped", "max_behind", "compute_s", "delay_s", "updates", "cpu_s",
              "cpu_steps")

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0.0)
        self.behind = 0

    def sent(self) -> None:
        """Count a reply sent: the worker is up to date again."""
        self.values["replies_sent"] += 1
        self.behind = 0

    def skipped(self) -> None:
        """Count a reply skipped because the server had already moved on."""
        self.values["replies_skipped"] += 1
        self.behind += 1
        self.values["max_behind"] = max(self.values["max_behind"], self.behind)

    def add(self, name: str, value: float) -> None:
        """Add to a counter (seconds of compute or delay, updates applied)."""
        self.values[name] += value

    def vector(self) -> np.ndarray:
        """Return the report as one float64 vector for the wire."""
        return np.array([self.values[f] for f in self.FIELDS], dtype=np.float64)

    @classmethod
    def from_vector(cls, vector: Sequence[float]) -> Dict[str, float]:
        """Return a report received from a worker as {field: value}."""
        return dict(zip(cls.FIELDS, (float(v) for v in vector)))


@dataclass
class Replies:
    """The replies a round used: {packet index j: tensor}, in arrival order."""

    data: Dict[int, Any]
    ranks: List[int]  # the ranks they came from, ascending

    @property
    def indices(self) -> List[int]:
        """Return the packet indices of the replies, in arrival order."""
        return list(self.data)


def rotating_subsets(n: int, k: int) -> Iterator[tuple]:
    """Cycle through every k-subset of n workers, those without systematic packets first."""
    subsets = sorted(itertools.combinations(range(n), k), key=lambda s: (-min(s), s))
    return itertools.cycle(subsets)


@dataclass
class RoundClock:
    """Seconds and bytes of the current iteration's rounds."""

    timings: Dict[str, float] = field(default_factory=lambda: {"wait_s": 0.0, "comm_s": 0.0})
    used: List[List[int]] = field(default_factory=list)
    sent0: int = 0
    received0: int = 0


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


def cpu_per_iteration(server_cpu_s: float, reports: Any) -> Dict[str, float]:
    """Return processor seconds per iteration of a server and of its workers together (their reports)."""
    workers = sum(r["cpu_s"] / r["cpu_steps"] for r in reports if r.get("cpu_steps"))
    return {"server": server_cpu_s, "workers": workers, "total": server_cpu_s + workers}


STOP_GRACE_S = 5.0  # how long the stop waits for the workers' reports before it asks whether a rank died


class MPIServerLink:
    """Rank 0's side of every round: send to workers, take the first replies, name workers by index.

    A worker that has stopped is detached: its oldest message kept back by flow control is
    `detach_after` iterations old and nothing has come from it (no message, no acknowledgement) since
    the first of those iterations began. Its backlog is dropped, it is told so, and rounds go on
    without it until it asks to rejoin; `start_iteration` readmits it with the state the scheme gives
    it. A worker that is behind but still answering is slow, not stopped: it keeps its backlog and
    catches up by skipping the replies the server no longer needs.
    """

    def __init__(self, transport: Any, workers: Sequence[int], roles: Any = None, emulation: Any = None,
                 detach_after: Optional[int] = 2, say: Callable[[str], None] = print,
                 lost: Callable[[], bool] = lambda: False, detach_after_s: float = 1.0) -> None:
        self.transport = transport
        self.workers = list(workers)
        self.n = len(self.workers)
        self._index = {rank: j for j, rank in enumerate(self.workers)}
        self.roles, self.emulation = roles, emulation
        self.clock = RoundClock()
        self.subsets: Optional[Iterator[tuple]] = None
        self.members = Membership(detach_after, detach_after_s)
        self.iteration = 0
        self.started: Dict[int, float] = {}  # when recent iterations began (time.monotonic), for the detach rule
        self.say = say
        self.rank_died = lost  # whether the process manager said that a rank of the job died

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
        return [r for r in self.workers if r not in self.members.detached]

    def require(self, needed: int) -> None:
        """Declare how many workers a round needs: below that, rank 0 waits for detached ones to rejoin."""
        self.members.needed = needed

    def start_iteration(self, iteration: int, state_for: Callable[[int, int], Any], readmit: bool = True) -> None:
        """Readmit the detached workers that asked to rejoin (`readmit`: an optimizer step starts here), waiting
        for one while too few are live."""
        self.iteration = iteration
        self.started[iteration] = time.monotonic()
        self.started.pop(iteration - (self.members.detach_after or 0) - 1, None)
        self.note_failures()
        detached = self.members.detached
        asking = [r for r in detached if self.transport.has_message(r, *_fields(Msg.rejoin(0)))] if readmit else []
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
            if rank not in self.members.detached:
                self.members.detached[rank] = self.iteration
                self.members.record(rank, detached_at=self.iteration)
            self.say(f"psf: rank {self.transport.named([rank])[0]} died (the MPI reports it failed) by iteration "
                     f"{self.iteration}; training goes on with {len(self.live)} workers ({self.members.needed} needed)")

    def first_rejoin(self, ranks: Sequence[int]) -> int:
        """Wait until one of `ranks` asks to rejoin; return it (the watchdog names them all if none does)."""
        asking: List[int] = []

        def asked() -> bool:
            asking[:] = [r for r in ranks if self.transport.has_message(r, *_fields(Msg.rejoin(0)))]
            return bool(asking)

        if not self.transport.wait_until(asked):
            raise WatchdogTimeout(self.transport.named(ranks), "a rejoin request of a detached worker",
                                  self.transport.resolve_timeout(), [], 1)
        return asking[0]

    def readmit(self, rank: int, iteration: int, state_for: Callable[[int, int], Any]) -> None:
        """Take a worker's rejoin request and send it a fresh state to go on from `iteration`."""
        self.transport.post_gather([rank], Msg.rejoin(self.members.detached[rank]), None).wait(1)
        state = state_for(self.index(rank), iteration)
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
        behind = [r for r in ranks if self.iteration - (self.transport.oldest_kept(r) or self.iteration) >= after]
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
        heard = self.transport.heard_from(rank)
        return heard < since and time.monotonic() - heard >= self.members.detach_after_s

    def detach(self, rank: int) -> None:
        """Stop sending to a worker: drop what is kept back for it and tell it (one message beyond its window)."""
        dropped = self.transport.drop(rank)
        self.transport.isend(rank, np.zeros(1), Msg.detach(self.iteration), urgent=True)
        self.members.detached[rank] = self.iteration
        self.members.record(rank, detached_at=self.iteration)
        TIMELINE.instant("membership", f"rank {rank} detached")
        self.say(f"psf: rank {rank} detached at iteration {self.iteration}: {self.members.detach_after} or more "
                 f"iterations behind and silent since ({dropped} messages dropped)")
        if self.rank_died():
            self.say(f"psf: a rank of the job died: rank {rank} is probably lost; training goes on with "
                     f"{len(self.live)} workers ({self.members.needed} needed)")

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
            self.transport.post_gather(self.workers, Msg.started(start), None).wait(self.n)
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
        self.detach_laggards([rank for rank, _ in live])
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
                    if self.can_detach():
                        self.detach(rank)
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
        return [r for r in gather.sources if r not in arrived and self.stopped(r, time.monotonic())]

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
        self.note_failures()
        for rank in [r for r in self.workers if r not in self.members.lost]:
            self.transport.isend(rank, np.zeros(1), Msg.stop_early(iteration), urgent=rank in self.members.detached)

    def stop_workers(self, total: int) -> Dict[str, Dict[str, float]]:
        """Tell every worker to stop (detached ones too); return their reports {rank: {field: value}}.

        Once a rank of the job has died, a worker that has not answered within STOP_GRACE_S is lost.
        """
        self.note_failures()
        ranks = [r for r in self.workers if r not in self.members.lost]
        gather = self.transport.post_gather(ranks, Msg.stop(total))
        for rank in ranks:
            self.transport.isend(rank, np.zeros(1, np.float64), Msg.stop(total), urgent=rank in self.members.detached)
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
            self.say(f"psf: the run finished without rank(s) {', '.join(map(str, lost))}")
        for rank, detached_at in self.members.detached.items():  # take the rejoin requests no one will answer
            if rank in reports and self.transport.has_message(rank, *_fields(Msg.rejoin(0))):
                self.transport.post_gather([rank], Msg.rejoin(detached_at), None).wait(1)
        return {str(rank): WorkerReport.from_vector(reports[rank].tolist()) for rank in self.workers if rank in reports}


class MPIWorkerLink:
    """A worker's side: every message from the server taken off the wire as it comes, replies, the report.

    While it waits for the server, a worker answers snapshot requests (its state, once it has finished
    the iterations before the request) and notices that it was detached (raising Detached).
    """

    def __init__(self, transport: Any, roles: Any, peers: Any = None, server: int = 0,
                 patience: float = 2.0, progress_thread: Any = None, across: Any = None,
                 all_workers: Any = None) -> None:
        self.transport = transport
        self.roles = roles
        self.peers = peers  # the worker-to-worker transport, where the scheme has one
        self.across = across  # with several groups: the workers of this packet index in every group (Peers)
        self.all_workers = all_workers  # with several groups: every worker of every group (Peers)
        self.server = server
        self.index = roles.worker_index
        self.report = WorkerReport()
        # Every message from the server is received as it arrives, even while this worker lags behind:
        # the server's queues never fill up behind it, and a waiting message marks stale work.
        self.inbox = transport.mailbox(server)
        # A worker waits for the server longer than the server waits for workers, so that the watchdog
        # that fires first is rank 0's, which names the workers that are really silent.
        timeout = transport.resolve_timeout()
        self.timeout_s = None if timeout is None else patience * timeout
        self.snapshot: Optional[Callable[[], Any]] = None  # the scheme's state, for a readmission elsewhere
        self.progress_thread = progress_thread  # drives the MPI while this worker computes, if any
        # Which server messages this worker relays to its peers (the scheme's choice; None: none). Each is
        # sent on to `relay_first` peers as soon as a poll sees it, so that the peers never wait for this
        # worker's computing, and to the others by `relay_rest` (after this worker's reply, say).
        self.relayed: Optional[Callable[[Envelope], bool]] = None
        self.relay_first: Optional[int] = None  # None: every peer at once
        self._forwarded: Dict[Tuple[int, int, int], List[Any]] = {}  # (iteration, layer, phase) -> sends
        self._unsent: Dict[Tuple[int, int, int], Tuple[Any, List[int]]] = {}  # -> (packet, peers still to send)
        self._started: Dict[int, float] = {}  # when this worker began its recent iterations (time.monotonic)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Compute in the body (no MPI calls there): a progress thread, if any, keeps messages moving."""
        if self.progress_thread is None:
            yield
            return
        with self.progress_thread.busy():
            yield

    @property
    def workers(self) -> Sequence[int]:
        """Return the ranks of every worker."""
        return self.roles.workers

    @property
    def rank(self) -> int:
        """Return this worker's rank in the job (straggler models and freezes name workers so)."""
        return self.roles.world_rank

    @property
    def job_workers(self) -> Sequence[int]:
        """Return the ranks in the job of every worker of every group."""
        return self.roles.job_workers

    def announced(self) -> Any:
        """Return what the server announced at the start (a collective broadcast)."""
        return self.transport.comm.bcast(None, root=self.server)

    def started(self, start: int) -> None:
        """Tell the server that this worker is ready for the iteration after `start`."""
        self.transport.isend(self.server, np.zeros(1), Msg.started(start))

    def take(self, envelope: Envelope) -> Any:
        """Wait for a server message and return its tensor."""
        return self.inbox.take(envelope, self.timeout_s, partial(self.serve, envelope.iteration))

    def has(self, envelope: Envelope) -> bool:
        """Return whether a server message has arrived."""
        arrived = self.inbox.has(envelope)
        self.relay_arrivals()
        return arrived

    def let_sends_go(self, envelope: Envelope) -> None:
        """Poll until no message of this worker waits on its emulated link (or the server's `envelope` is in).

        A message held back leaves only at a poll: a worker about to compute for a while lets its
        reply go first."""
        def holding() -> bool:
            return self.transport.holding() or (self.peers is not None and self.peers.holding())

        def done() -> bool:
            if self.peers is not None:
                self.peers.progress()
            return self.has(envelope) or not holding()

        if holding():  # every held message is due within its link's transfer time: no watchdog needed
            self.transport.wait_until(done, None)

    def relay_arrivals(self) -> None:
        """Send the first peers every relayed server message that has arrived and has not been sent on yet."""
        if self.relayed is None:
            return
        for header, data in list(self.inbox.kept.values()):
            got = header.envelope
            key = (got.iteration, got.layer, got.phase)
            if key not in self._forwarded and self.relayed(got):
                self._forwarded[key] = self._relay(key, data)

    def _relay(self, key: Tuple[int, int, int], packet: Any) -> List[Any]:
        """Send a packet to the first `relay_first` peers in relay order; keep the others for relay_rest."""
        from .relay import relay_order, send_packet

        order = relay_order(self.peers.rank, self.peers.size)
        first = len(order) if self.relay_first is None else self.relay_first
        if order[first:]:
            self._unsent[key] = (packet, order[first:])
        return send_packet(self.peers, packet, Msg.packet(*key), order[:first])

    def relay_rest(self, envelope: Envelope) -> None:
        """Send a relayed packet to the peers it has not gone to yet (they need it if a first sender is slow)."""
        from .relay import send_packet

        unsent = self._unsent.pop((envelope.iteration, envelope.layer, envelope.phase), None)
        if unsent is not None:
            send_packet(self.peers, unsent[0], Msg.packet(envelope.iteration, envelope.layer, envelope.phase),
                        unsent[1])

    def first_of(self, envelopes: Sequence[Envelope]) -> int:
        """Wait until one of the messages has arrived; return its position (not taking it).

        Raises StopEarly if none has come and the run stopped before the latest of their iterations: a
        worker the server went on without in the stopping iteration gets neither message.
        """
        latest = max(envelope.iteration for envelope in envelopes)

        def interrupt() -> None:
            self.serve(envelopes[0].iteration)
            stops = self.inbox.iterations(Msg.stop_early(0))
            if stops and stops[0] < latest and not any(self.inbox.holds(e) for e in envelopes):
                raise StopEarly(stops[0])

        return self.inbox.wait_any(envelopes, self.timeout_s, interrupt)

    def serve(self, iteration: int) -> None:
        """Raise Detached if the server left this worker out, StopEarly if the run stopped before `iteration`;
        answer snapshot requests up to `iteration`; move the packets relayed to peers on meanwhile."""
        if self.peers is not None:
            # A peer that rejoined may wait for packets this worker keeps back for it (flow control).
            self.peers.progress()
            self.relay_arrivals()
        detached = self.inbox.iterations(Msg.detach(0))
        if detached:
            raise Detached(detached[0])
        stops = self.inbox.iterations(Msg.stop_early(0))
        if stops and stops[0] < iteration:
            raise StopEarly(stops[0])
        for asked in self.inbox.iterations(Msg.snapshot(0)):
            if asked > iteration or self.snapshot is None:
                break
            self.inbox.take(Msg.snapshot(asked))
            self.transport.isend(self.server, self.snapshot(), Msg.snapshot_reply(asked))

    def rejoin(self, detached_at: int, total: int) -> Optional[Tuple[int, Any]]:
        """Drop the stale backlog, ask to rejoin; return (iteration, state) to go on from, or None to stop."""
        ends = (Msg.stop(0).tag, Msg.stop_early(0).tag)  # a preempted run ends at another iteration
        self.inbox.discard(lambda envelope: envelope.tag in ends)
        if self.peers is not None:
            for peer in range(self.peers.size):
                self.peers.drop(peer)
            self._forwarded.clear()
            self._unsent.clear()
        self.transport.isend(self.server, np.zeros(1), Msg.rejoin(detached_at))

        def answered() -> bool:
            if self.peers is not None:
                self.peers.progress()
            return bool(self.inbox.iterations(Msg.stop(0)) or self.inbox.iterations(Msg.readmit(0)))

        if not self.transport.wait_until(answered, self.timeout_s):
            raise WatchdogTimeout(self.transport.named([self.server]), "the answer to a rejoin request",
                                  self.timeout_s or 0.0)
        if self.inbox.iterations(Msg.stop(0)):
            return None
        iteration = self.inbox.iterations(Msg.readmit(0))[0]
        return iteration, self.inbox.take(Msg.readmit(iteration))

    def reply(self, data: Any, envelope: Envelope, count: bool = True, wait: bool = True) -> None:
        """Send a reply to the server and, with `wait`, let it leave before computing on.

        A waiting reply stops waiting once the server has sent something newer: it has gone on without
        it. Without `wait` the caller polls (any wait of this rank moves the reply on) and may compute
        meanwhile. `count`: the reply completes this worker's part of a round (the report counts it).
        """
        handle = self.transport.isend(self.server, data, envelope)
        if wait:
            self.transport.wait_until(lambda: handle.test() or bool(self.inbox.kept), None)
        if count:
            self.report.sent()

    def send(self, data: Any, envelope: Envelope) -> None:
        """Start sending a tensor to the server (it leaves while this worker goes on)."""
        self.transport.isend(self.server, data, envelope)

    def progress(self) -> None:
        """Move whatever messages can move now."""
        self.transport.progress()
        if self.peers is not None:
            self.peers.progress()

    def relay_packets(self, packet: Any, envelope: Envelope, k: int, stopped_after: int) -> Any:
        """Relay packets among the workers until k are in (relay dissemination); see gather_packets.

        Then forget the packets kept back (flow control) that a peer can no longer need: those older
        than the latest iteration it has sent, and, once it has sent and acknowledged nothing for
        `stopped_after` of this worker's iterations, those older than this one (it has stopped, and the
        server, which detaches a worker silent for half as long, readmits it at a later iteration). A
        slow peer that still answers loses nothing. The watchdog names silent peers by their ranks in the job.
        """
        from .relay import gather_packets

        iteration = envelope.iteration
        self._started.setdefault(iteration, time.monotonic())
        self._started.pop(iteration - stopped_after - 1, None)
        # The waits of the peers' transport do not serve the server's transport: move it on here (its
        # inbox, and a reply of this worker's waiting on its emulated link).
        key = (iteration, envelope.layer, envelope.phase)
        sends = self._forwarded.pop(key, None)
        if sends is None:
            sends = self._relay(key, packet)
        packets = gather_packets(self.peers, packet, envelope, k, timeout_s=self.timeout_s,
                                 interrupt=lambda: (self.transport.progress(), self.serve(iteration)), sends=sends)
        since = self._started.get(iteration - stopped_after + 1)
        for peer in range(self.peers.size):
            if peer != self.peers.rank:
                stopped = since is not None and self.peers.heard_from(peer) < since
                self.peers.drop(peer, iteration if stopped else self.peers.mailbox(peer).newest)
        return packets

    def await_peers(self) -> None:
        """Go on relaying until every other worker has finished too: one that lags may still need packets
        this worker keeps back for it. A peer that the MPI reports dead counts as finished."""
        from mpi4py import MPI

        request = self.peers.comm.Ibarrier()

        def finished() -> bool:
            self.peers.progress()
            try:
                return bool(request.Test())
            except MPI.Exception:
                return True

        if not self.transport.wait_until(finished, self.timeout_s):
            raise WatchdogTimeout(self.peers.named([p for p in range(self.peers.size) if p != self.peers.rank]),
                                  "the other workers to finish the run", self.timeout_s or 0.0)

    def stop(self, total: int) -> int:
        """Take the stop message, send the report, close the transport; return the iteration the run stopped at.

        That is `total`, or an earlier iteration where a stop message for it came already (a preemption).
        """
        held = self.inbox.iterations(Msg.stop(0))
        total = held[0] if held else total
        self.inbox.take(Msg.stop(total), self.timeout_s, self.progress)
        self.transport.send(self.server, self.report.vector(), Msg.stop(total))
        for early in self.inbox.iterations(Msg.stop_early(0)):
            self.inbox.take(Msg.stop_early(early))
        if self.peers is not None:
            self.await_peers()
            self.peers.close(timeout_s=1.0)
        self.transport.close(timeout_s=1.0)
        self.roles.free()
        return total


class ShardedWorkerLink:
    """A worker's link to S servers, one per parameter shard: each message comes from, and each reply
    goes to, every shard's server over that shard's own link.

    One report counts this worker's work and goes to every server when the run stops. A worker with
    several servers is never detached (its servers do not detach it), so it never rejoins.
    """

    def __init__(self, links: Sequence[MPIWorkerLink]) -> None:
        self.links = list(links)
        self.sizes: List[int] = []  # values per shard of the last message taken
        self.report = self.links[0].report
        for link in self.links[1:]:
            link.report = self.report

    @property
    def roles(self) -> Any:
        return self.links[0].roles

    @property
    def index(self) -> int:
        """Return this worker's index among every worker of the job (0..N-1)."""
        return self.links[0].index

    @property
    def workers(self) -> Sequence[int]:
        return self.links[0].workers

    @property
    def rank(self) -> int:
        return self.links[0].rank

    @property
    def job_workers(self) -> Sequence[int]:
        return self.links[0].job_workers

    @property
    def progress_thread(self) -> Any:
        return self.links[0].progress_thread

    @progress_thread.setter
    def progress_thread(self, thread: Any) -> None:
        for link in self.links:
            link.progress_thread = thread

    def busy(self) -> Any:
        """Compute in the body (no MPI calls there): a progress thread, if any, keeps messages moving."""
        return self.links[0].busy()

    def announced(self) -> Any:
        """Return what the servers announced at the start (the lead's; every server announces the same)."""
        return [link.announced() for link in self.links][0]

    def started(self, start: int) -> None:
        """Tell every server that this worker is ready."""
        for link in self.links:
            link.started(start)

    def take(self, envelope: Envelope) -> Any:
        """Wait for a message from every server; return their tensors joined in shard order."""
        import torch

        pieces = [link.take(envelope) for link in self.links]
        self.sizes = [piece.numel() for piece in pieces]
        return torch.cat(pieces)

    def has(self, envelope: Envelope) -> bool:
        """Return whether every server's message has arrived (then every server has moved on)."""
        return all(link.has(envelope) for link in self.links)

    def first_of(self, envelopes: Sequence[Envelope]) -> int:
        """Wait until one of the messages has arrived from every server; return its position (not taking it).

        Every server sends the same sequence of messages, so the lead's answer is every server's.
        """
        return [link.first_of(envelopes) for link in self.links][0]

    @property
    def snapshot(self) -> Optional[Callable[[], Any]]:
        return self.links[0].snapshot

    @snapshot.setter
    def snapshot(self, state: Optional[Callable[[], Any]]) -> None:
        for link in self.links:
            link.snapshot = state

    def split(self, vector: Any) -> List[Any]:
        """Cut a vector as the last message taken was cut; what lies beyond it goes with the lead's shard.

        A reply to the shards' servers carries one value per value taken, then what the lead server
        alone keeps (a worker's BatchNorm running statistics and loss).
        """
        import torch

        total = sum(self.sizes)
        pieces = list(torch.split(vector[:total], self.sizes))
        pieces[0] = torch.cat([pieces[0], vector[total:]])
        return [piece.contiguous() for piece in pieces]

    def reply(self, data: Any, envelope: Envelope, count: bool = True, wait: bool = True) -> None:
        """Send each server its shard of a reply (see `split`)."""
        for link, piece in zip(self.links, self.split(data)):
            link.reply(piece, envelope, count=False, wait=wait)
        if count:
            self.report.sent()

    def send(self, data: Any, envelope: Envelope) -> None:
        """Start sending each server its shard of a tensor (see `split`)."""
        for link, piece in zip(self.links, self.split(data)):
            link.send(piece, envelope)

    def progress(self) -> None:
        """Move whatever messages can move now."""
        for link in self.links:
            link.progress()

    def rejoin(self, detached_at: int, total: int) -> Optional[Tuple[int, Any]]:
        """Refuse: a worker of several servers is never detached."""
        raise RuntimeError(f"worker rank {self.rank} was detached at iteration {detached_at}, but with several "
                           "servers no worker is detached")

    def stop(self, total: int) -> int:
        """Stop with every server; return the iteration the run stopped at."""
        return min(link.stop(total) for link in self.links)
