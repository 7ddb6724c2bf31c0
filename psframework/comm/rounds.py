"""Rounds between the server and its workers, and the one message vocabulary of every scheme.

The transport moves enveloped tensors; this layer knows the shape every scheme shares: the server
sends to its workers, takes the first k replies (or all), times the round, and names workers by
their packet index j = 0..n-1. A worker takes every server message off the wire as it arrives (the
transport's mailbox), replies, and reports its statistics when the run stops. Nothing here knows
models, codes or the config.
"""

from __future__ import annotations

import itertools
import time
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .envelope import Envelope, Kind, Phase


class Msg:
    """The message vocabulary: each entry returns the envelope of one kind of message for an iteration.

    command, reply and shard take (iteration, layer, phase); params takes (iteration, layer, phase=);
    grads, state, state_reply and stop take the iteration only.
    """

    command = partial(Envelope, Kind.COMMAND)  # server -> worker: an input to compute on
    reply = partial(Envelope, Kind.REPLY)  # worker -> server: the result of a command
    shard = partial(Envelope, Kind.SHARD)  # worker <-> worker: a coded packet of a relayed tensor
    params = partial(Envelope, Kind.PARAMS, phase=Phase.OTHER)  # server -> worker: initial state, weights
    grads = partial(Envelope, Kind.GRADS, layer=0, phase=Phase.BACKWARD)  # worker -> server: gradients
    state = partial(Envelope, Kind.CONTROL, layer=1, phase=Phase.OTHER)  # server -> worker: send your state
    state_reply = partial(Envelope, Kind.PARAMS, layer=1, phase=Phase.OTHER)  # worker -> server: its state
    stop = partial(Envelope, Kind.CONTROL, layer=2, phase=Phase.OTHER)  # the end (and the worker's report)


class WorkerReport:
    """What a worker counts and reports when it stops."""

    FIELDS = ("replies_sent", "replies_skipped", "max_behind", "compute_s", "delay_s", "updates")

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


class ServerRounds:
    """Rank 0's side of every round: send to workers, take the first replies, name workers by index."""

    def __init__(self, transport: Any, workers: Sequence[int], roles: Any = None, emulation: Any = None) -> None:
        self.transport = transport
        self.workers = list(workers)
        self.n = len(self.workers)
        self._index = {rank: j for j, rank in enumerate(self.workers)}
        self.roles, self.emulation = roles, emulation
        self.clock = RoundClock()
        self.subsets: Optional[Iterator[tuple]] = None

    def rotate_subsets(self, k: int) -> None:
        """Decode every round from the next k-subset in turn (waiting for all), to exercise every path."""
        self.subsets = rotating_subsets(self.n, k)

    def index(self, rank: int) -> int:
        """Return the packet index of a worker rank."""
        return self._index[rank]

    def announce(self, values: Any) -> None:
        """Tell every worker where the run starts (a collective broadcast)."""
        self.transport.comm.bcast(values, root=0)

    def begin_iteration(self) -> None:
        """Start timing a new iteration's rounds."""
        stats = self.transport.stats
        self.clock = RoundClock(sent0=stats.sent_bytes, received0=stats.received_bytes)

    def iteration_fields(self) -> Dict[str, Any]:
        """Return the current iteration's bytes and the workers each round used."""
        stats = self.transport.stats
        return {"bytes_sent": stats.sent_bytes - self.clock.sent0,
                "bytes_received": stats.received_bytes - self.clock.received0, "used": list(self.clock.used)}

    def expect(self, reply: Envelope, ranks: Optional[Sequence[int]] = None) -> Any:
        """Pre-post the receives of a round's replies (before sending, so that none waits unmatched)."""
        t0 = time.perf_counter()
        gather = self.transport.post_gather(self.workers if ranks is None else ranks, reply)
        self.clock.timings["comm_s"] += time.perf_counter() - t0
        return gather

    def send(self, payloads: Any, envelope: Envelope, ranks: Optional[Sequence[int]] = None) -> None:
        """Start sending payloads[i] to ranks[i] (a single tensor goes to every rank)."""
        ranks = self.workers if ranks is None else list(ranks)
        if not isinstance(payloads, (list, tuple)):
            payloads = [payloads] * len(ranks)
        t0 = time.perf_counter()
        for rank, payload in zip(ranks, payloads):
            self.transport.isend(rank, payload, envelope)
        self.clock.timings["comm_s"] += time.perf_counter() - t0

    def collect(self, gather: Any, need: int, rotate: bool = True) -> Replies:
        """Wait for the first `need` replies (or, rotating, for all and use the next subset)."""
        t0 = time.perf_counter()
        if rotate and self.subsets is not None and need < self.n:
            result = gather.wait(len(gather.sources))
            chosen = [self.workers[i] for i in next(self.subsets)]
        else:
            result = gather.wait(need)
            chosen = result.first
        self.clock.timings["wait_s"] += result.wait_s
        self.clock.timings["comm_s"] += max(0.0, time.perf_counter() - t0 - result.wait_s)
        self.clock.used.append(sorted(chosen))
        return Replies({self.index(r): result.data[r] for r in chosen}, sorted(chosen))

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
                "server_bytes_sent": stats.sent_bytes, "server_bytes_received": stats.received_bytes,
                "server_bytes_sent_per_iteration": recorder.mean("bytes_sent", skip=1),
                "server_bytes_received_per_iteration": recorder.mean("bytes_received", skip=1),
                "late_replies_drained": stats.late_drained + drained.completed,
                "emulation": self.emulation() if self.emulation else None, "workers": reports}

    def stop_workers(self, total: int) -> Dict[str, Dict[str, float]]:
        """Tell every worker to stop; return their reports {rank: {field: value}}."""
        gather = self.expect(Msg.stop(total))
        self.send(np.zeros(1, np.float64), Msg.stop(total))
        result = gather.wait(len(self.workers))
        return {str(rank): WorkerReport.from_vector(result.data[rank].tolist()) for rank in self.workers}


class WorkerRounds:
    """A worker's side: every message from the server taken off the wire as it comes, replies, the report."""

    def __init__(self, transport: Any, roles: Any, peers: Any = None, server: int = 0) -> None:
        self.transport = transport
        self.roles = roles
        self.peers = peers  # the worker-to-worker transport, where the scheme has one
        self.server = server
        self.index = roles.worker_index
        self.report = WorkerReport()
        # Every message from the server is received as it arrives, even while this worker lags behind:
        # the server's queues never fill up behind it, and a waiting message marks stale work.
        self.inbox = transport.mailbox(server)

    @property
    def workers(self) -> Sequence[int]:
        """Return the ranks of every worker."""
        return self.roles.workers

    @property
    def rank(self) -> int:
        """Return this worker's rank."""
        return self.roles.rank

    def announced(self) -> Any:
        """Return what the server announced at the start (a collective broadcast)."""
        return self.transport.comm.bcast(None, root=self.server)

    def take(self, envelope: Envelope) -> Any:
        """Wait for a server message and return its tensor."""
        return self.inbox.take(envelope)

    def has(self, envelope: Envelope) -> bool:
        """Return whether a server message has arrived."""
        return self.inbox.has(envelope)

    def first_of(self, envelopes: Sequence[Envelope]) -> int:
        """Wait until one of the messages has arrived; return its position (not taking it)."""
        return self.inbox.wait_any(envelopes)

    def reply(self, data: Any, envelope: Envelope, count: bool = True) -> None:
        """Send a reply to the server and let it leave before computing on (it needs this rank's progress).

        `count`: the reply completes this worker's part of a round (the report counts it).
        """
        self.transport.isend(self.server, data, envelope).wait()
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

    def stop(self, total: int) -> None:
        """Take the stop message, send the report, close the transport."""
        self.take(Msg.stop(total))
        self.transport.send(self.server, self.report.vector(), Msg.stop(total))
        if self.peers is not None:
            self.peers.close(timeout_s=1.0)
        self.transport.close(timeout_s=1.0)
        self.roles.free()
