"""A worker's side of the rounds over MPI: its server's messages taken off the wire as they come, replies, the report.

A worker takes every server message as it arrives (the transport's mailbox), replies, relays
packets to its peers where it was given a relay (comm/relay.py), rejoins when it was detached and
reports its statistics when the run stops. A worker of several parameter shards' servers has one such link per
server (ShardedWorkerLink). Nothing here knows models, codes or the config.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .envelope import Envelope
from .errors import WatchdogTimeout
from .membership import RankLoss
from .relay import PacketRelay, RelayedPackets
from .roles import Roles
from .rounds import SETUP_PATIENCE, Detached, Msg, StopEarly, WorkerReport


class MPIWorkerLink:
    """A worker's side: every message from the server taken off the wire as it comes, replies, the report.

    While it waits for the server, a worker answers snapshot requests (its state, once it has finished
    the iterations before the request) and notices that it was detached (raising Detached).
    """

    def __init__(self, transport: Any, roles: Roles, peers: Any = None, server: int = 0,
                 patience: float = 2.0, across: Any = None, all_workers: Any = None,
                 lost: Optional[RankLoss] = None) -> None:
        self.transport = transport
        self.lost = lost or RankLoss()  # whether a rank of the job died: the server's stop message says so
        self.roles = roles
        # The relay of server packets to the other workers, over `peers` (the workers' own transport), if any.
        self.relay = None if peers is None else PacketRelay(peers)
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
        # The first command waits on rank 0's set-up wait too (SETUP_PATIENCE), then the usual patience.
        self.first_timeout_s = None if timeout is None else (SETUP_PATIENCE + patience) * timeout
        self.awaiting_first = False
        self.snapshot: Optional[Callable[[], Any]] = None  # the scheme's state, for a readmission elsewhere
        self.progress_thread: Any = None  # drives the MPI while this worker computes, if any

    def use_progress_thread(self, thread: Any) -> None:
        """Let `thread` (None: none) move messages while this worker computes (see `busy`)."""
        self.progress_thread = thread

    def serve_snapshots(self, state: Callable[[], Any]) -> None:
        """Answer the server's snapshot requests with `state()` (this worker's state, for a readmission)."""
        self.snapshot = state

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
        self.awaiting_first = True

    def take(self, envelope: Envelope) -> Any:
        """Wait for a server message and return its tensor."""
        timeout_s = self.first_timeout_s if self.awaiting_first else self.timeout_s
        self.awaiting_first = False
        return self.inbox.take(envelope, timeout_s, partial(self.serve, envelope.iteration))

    def has(self, envelope: Envelope) -> bool:
        """Return whether a server message has arrived."""
        arrived = self.inbox.has(envelope)
        self.forward_arrivals()
        return arrived

    def let_sends_go(self, envelope: Envelope) -> None:
        """Poll until no message of this worker waits on its emulated link (or the server's `envelope` is in).

        A message held back leaves only at a poll: a worker about to compute for a while lets its
        reply go first."""
        def holding() -> bool:
            return self.transport.outbox.holding() or (self.relay is not None and self.relay.holding())

        def done() -> bool:
            if self.relay is not None:
                self.relay.progress()
            return self.has(envelope) or not holding()

        if holding():  # every held message is due within its link's transfer time: no watchdog needed
            self.transport.wait_until(done, None)

    def forward_arrivals(self) -> None:
        """Send on to the peers the server messages that have arrived and are to be relayed."""
        if self.relay is not None:
            self.relay.forward((header.envelope, data) for header, data in list(self.inbox.kept.values()))

    def relay_on_arrival(self, relayed: Callable[[Envelope], bool], first: Optional[int]) -> None:
        """Relay the server messages `relayed` accepts to `first` peers as soon as they arrive (see PacketRelay)."""
        self.peer_relay().choose(relayed, first)

    def relay_rest(self, envelope: Envelope) -> None:
        """Send a relayed packet to the peers it has not gone to yet (they need it if a first sender is slow)."""
        self.peer_relay().send_rest(envelope)

    def relay_packets(self, packet: Any, envelope: Envelope, k: int, stopped_after: int) -> RelayedPackets:
        """Relay packets among the workers until k are in (see PacketRelay.gather); the watchdog names silent
        peers by their ranks in the job."""
        iteration = envelope.iteration
        # The waits of the peers' transport do not serve the server's transport: move it on here (its
        # inbox, and a reply of this worker's waiting on its emulated link).
        return self.peer_relay().gather(packet, envelope, k, stopped_after, self.timeout_s,
                                        lambda: (self.transport.progress(), self.serve(iteration)))

    def peer_relay(self) -> PacketRelay:
        """Return this worker's relay; raise if the run gave it none."""
        if self.relay is None:
            raise RuntimeError(f"worker rank {self.rank} was asked to relay packets, but its run has no "
                               "transport among the workers")
        return self.relay

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
        if self.relay is not None:
            # A peer that rejoined may wait for packets this worker keeps back for it (flow control).
            self.relay.progress()
            self.forward_arrivals()
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
        if self.relay is not None:
            self.relay.forget()
        self.transport.isend(self.server, np.zeros(1), Msg.rejoin(detached_at))

        def answered() -> bool:
            if self.relay is not None:
                self.relay.progress()
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
        if self.relay is not None:
            self.relay.progress()

    def stop(self, total: int) -> int:
        """Take the stop message, send the report, close the transport; return the iteration the run stopped at.

        That is `total`, or an earlier iteration where a stop message for it came already (a preemption).
        """
        held = self.inbox.iterations(Msg.stop(0))
        total = held[0] if held else total
        if self.inbox.take(Msg.stop(total), self.timeout_s, self.progress)[0] > 0:
            self.lost.note()
        self.transport.send(self.server, self.report.vector(), Msg.stop(total))
        for early in self.inbox.iterations(Msg.stop_early(0)):
            self.inbox.take(Msg.stop_early(early))
        if self.relay is not None:
            self.relay.finish(self.transport.wait_until, self.timeout_s)
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
    def across(self) -> Any:
        return self.links[0].across

    @property
    def all_workers(self) -> Any:
        return self.links[0].all_workers

    def use_progress_thread(self, thread: Any) -> None:
        """Let `thread` move every shard's messages while this worker computes."""
        for link in self.links:
            link.use_progress_thread(thread)

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

    def serve_snapshots(self, state: Callable[[], Any]) -> None:
        """Answer every server's snapshot requests with `state()`."""
        for link in self.links:
            link.serve_snapshots(state)

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

    def let_sends_go(self, envelope: Envelope) -> None:
        """Poll each shard's link until no message of this worker waits on its emulated link."""
        for link in self.links:
            link.let_sends_go(envelope)

    def relay_on_arrival(self, relayed: Callable[[Envelope], bool], first: Optional[int]) -> None:
        """Refuse: the workers of several parameter shards' servers have no transport among themselves."""
        raise self.no_relay()

    def relay_rest(self, envelope: Envelope) -> None:
        raise self.no_relay()

    def relay_packets(self, packet: Any, envelope: Envelope, k: int, stopped_after: int) -> RelayedPackets:
        raise self.no_relay()

    def no_relay(self) -> RuntimeError:
        """Return the error of a relay asked of a worker of several parameter shards' servers."""
        return RuntimeError(f"worker rank {self.rank} was asked to relay packets, but a worker of several "
                            "parameter shards' servers has no transport among the workers")

    def rejoin(self, detached_at: int, total: int) -> Optional[Tuple[int, Any]]:
        """Refuse: a worker of several servers is never detached."""
        raise RuntimeError(f"worker rank {self.rank} was detached at iteration {detached_at}, but with several "
                           "servers no worker is detached")

    def stop(self, total: int) -> int:
        """Stop with every server; return the iteration the run stopped at."""
        return min(link.stop(total) for link in self.links)
