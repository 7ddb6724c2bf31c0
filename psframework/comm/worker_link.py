"""A worker's side of the rounds over MPI: its server's messages taken off the wire as they come, replies, the report.

A worker takes every server message as it arrives (the transport's mailbox), replies, relays
packets to its peers where the scheme says so, rejoins when it was detached and reports its
statistics when the run stops. A worker of several parameter shards' servers has one such link per
server (ShardedWorkerLink). Nothing here knows models, codes or the config.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .envelope import Envelope
from .errors import WatchdogTimeout
from .rounds import Detached, Msg, StopEarly, WorkerReport


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
            return self.transport.outbox.holding() or (self.peers is not None and self.peers.outbox.holding())

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
                self.peers.outbox.drop(peer)
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
                stopped = since is not None and self.peers.outbox.heard_from(peer) < since
                self.peers.outbox.drop(peer, iteration if stopped else self.peers.mailbox(peer).newest)
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
