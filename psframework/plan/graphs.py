"""Each scheme's iterations as the task graph it runs: rank 0's rounds, the workers' work, every message.

A `Setup` says what is trained (scheme, n, k, servers, dissemination, backup workers) and a builder
adds `iterations` iterations of it to a graph, returning rank 0's last task of each iteration. Work
comes from the profile's fits; message sizes from the same shapes as the schemes' byte models. Ranks:
server g is g * (n + 1) and its workers follow it; DDP's processes are 0..n-1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from psframework.codes import make_code
from psframework.plan.profile import ConvLayer, Profile
from psframework.plan.sim import Graph

FLOAT = 4  # bytes of a value on the wire (float32)
DDP = "ddp"  # torch DistributedDataParallel, the baseline every plan predicts beside the schemes
DDP_BUCKET_BYTES = 25 << 20  # torch DDP's bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 1 << 20  # and its smaller first bucket
RELAY_EXACT_UP_TO = 16  # workers up to which every relayed packet is a message of its own


@dataclass(frozen=True)
class Setup:
    """One way to train: the scheme and its shape."""

    scheme: str  # a registered scheme with a cost graph, or DDP
    n: int
    k: int
    servers: int = 1
    dissemination: str = "direct"  # or relay (sazd)
    backup: int = 0  # backup workers (ps, stanza)

    @property
    def ranks(self) -> int:
        return self.n if self.scheme == DDP else self.servers * (self.n + 1)

    def server(self, g: int) -> int:
        return g * (self.n + 1)

    def workers(self, g: int) -> List[int]:
        return [g * (self.n + 1) + 1 + j for j in range(self.n)]


Collective = Callable[[Graph, Sequence[int], int, Sequence[int]], int]  # graph, ranks, bytes, after -> done


class Builder:
    """Adds a setup's iterations to a graph; `collective` adds an allreduce among ranks."""

    def __init__(self, profile: Profile, setup: Setup, collective: Collective, skip: Optional[int] = None) -> None:
        self.p, self.s, self.collective = profile, setup, collective
        self.skip = skip  # a worker left out of the rounds that need fewer than all (the stop-go one)

    def build(self, graph: Graph, iterations: int) -> List[int]:
        """Add the iterations; return rank 0's last task of each."""
        if self.s.scheme == DDP:
            return [self.ddp(graph) for _ in range(iterations)]
        from psframework.schemes.registry import get_scheme

        scheme = get_scheme(self.s.scheme)
        if scheme.cost_graph is None:
            raise ValueError(f"scheme {scheme.name} has no cost graph in the registry")
        add = scheme.load(scheme.cost_graph)
        return [add(self, graph) for _ in range(iterations)]

    # ------------------------------------------------------------------ helpers
    def share(self) -> float:
        """Return the samples of one group (its server's part of the global batch)."""
        return self.p.batch / self.s.servers

    def _round(self, graph: Graph, server: int, workers: Sequence[int], nbytes: Callable[[int], int],
               after: Sequence[int], label: str) -> Dict[int, int]:
        """Send each worker its message after `after`; return {worker: message}."""
        return {w: graph.send(server, w, nbytes(j), after, label) for j, w in enumerate(workers)}

    def _sync(self, graph: Graph, ends: List[int], nbytes: int) -> List[int]:
        """Sum `nbytes` among the servers (G > 1); return each server's task after it."""
        if self.s.servers == 1:
            return ends
        servers = [self.s.server(g) for g in range(self.s.servers)]
        done = self.collective(graph, servers, nbytes, ends)
        return [graph.compute(s, 0.0, [done], "synced") for s in servers]

    # ------------------------------------------------------------------ ps
    def parameter_server(self, graph: Graph) -> int:
        p, s = self.p, self.s
        shard = p.params // s.servers  # each server's part of the parameters
        total = s.n * s.servers
        samples = p.batch / total
        ends = []
        sends = {}
        for g in range(s.servers):
            server = s.server(g)
            start = graph.compute(server, p.add(shard), label="pack parameters")
            for w in self._all_workers():
                sends[(g, w)] = graph.send(server, w, FLOAT * shard, [start], "parameters")
        replies: Dict[int, List[int]] = {g: [] for g in range(s.servers)}
        for w in self._all_workers():
            ready = graph.compute(w, p.model_step(samples) + p.add(p.params),
                                  [sends[(g, w)] for g in range(s.servers)], "forward and backward")
            for g in range(s.servers):
                extra = p.running_stats + 1 if g == 0 else 0
                replies[g].append(graph.send(w, s.server(g), FLOAT * (shard + extra), [ready], "gradients"))
        for g in range(s.servers):
            got = graph.first(total - s.backup, replies[g], "first replies")
            ends.append(graph.compute(s.server(g), (total - s.backup) * p.add(shard) + p.optimizer(shard), [got],
                                      "sum and step"))
        return self._sync(graph, ends, 8)[0]

    def _all_workers(self) -> List[int]:
        return [w for g in range(self.s.servers) for w in self.s.workers(g)]

    # ------------------------------------------------------------------ stanza
    def layer_separation(self, graph: Graph) -> int:
        p, s = self.p, self.s
        samples = p.batch / (s.n * s.servers)
        features = FLOAT * round(samples * p.feature_values)
        grads_done, ends = [], []
        for g in range(s.servers):
            server, workers = s.server(g), s.workers(g)
            used = self._used(workers, s.n - s.backup)
            if s.servers == 1:
                start = graph.compute(server, p.add(p.trunk_params), label="pack conv parameters")
                params = self._round(graph, server, workers, lambda j: FLOAT * p.trunk_params, [start], "conv")
            else:
                params = {w: graph.last(w) for w in workers}
            feats = {w: graph.send(w, server, features, [graph.compute(w, p.trunk_forward(samples),
                                                                       _some(params[w]), "trunk forward")])
                     for w in workers}
            got = graph.first(len(used), list(feats.values()), "first features")
            head = graph.compute(server, p.head_step(len(used) * samples) + p.optimizer(p.head_params), [got], "head")
            back = {w: graph.send(server, w, features, [head], "feature gradients") for w in used}
            for w in used:
                done = graph.compute(w, p.trunk_backward(samples), [back[w]], "trunk backward")
                grads_done.append((g, w, done))
            ends.append(head)
        if s.servers == 1:
            server = s.server(0)
            replies = [graph.send(w, server, FLOAT * (p.trunk_params + p.running_stats), [done], "conv gradients")
                       for _, w, done in grads_done]
            got = graph.first(len(replies), replies, "conv gradients")
            return graph.compute(server, len(replies) * p.add(p.trunk_params) + p.optimizer(p.trunk_params),
                                 [got], "sum and step")
        workers = [w for _, w, _ in grads_done]
        summed = self.collective(graph, workers, FLOAT * (p.trunk_params + p.running_stats),
                                 [d for _, _, d in grads_done])
        for w in workers:
            graph.compute(w, p.optimizer(p.trunk_params), [summed], "step")
        return self._sync(graph, ends, FLOAT * p.head_params)[0]

    def _used(self, workers: Sequence[int], count: int) -> List[int]:
        """Return the workers a first-(n - b) round is modelled with: all but the stop-go one, then the last."""
        order = [w for w in workers if w != self.skip] + [w for w in workers if w == self.skip]
        return order[:count]

    # ------------------------------------------------------------------ sazd, uncoded
    def coded(self, graph: Graph) -> int:
        p, s = self.p, self.s
        from psframework.schemes.registry import get_scheme

        code = make_code(get_scheme(s.scheme).code, s.n, s.k)
        k = code.k
        batch = self.share()
        rounds = [(layer, True) for layer in p.layers] + [(p.layers[i], False) for i in p.backward_order]
        rest = p.server_rest(batch)
        # rank 0's own work between rounds: the head at the turn, the rest spread over the gaps (backward twice forward)
        head = p.head_step(batch)
        gap = {True: (rest - head) / (3 * len(p.layers)), False: 2 * (rest - head) / (3 * len(p.layers))}
        ends = []
        for g in range(s.servers):
            server, workers = s.server(g), s.workers(g)
            last = graph.compute(server, gap[True], label="layers between")
            for i, (layer, forward) in enumerate(rounds):
                if i == len(p.layers):
                    last = graph.compute(server, head, label="head")
                last = self._coded_round(graph, server, workers, layer, forward, code, k, batch, last)
                last = graph.compute(server, gap[forward], label="layers between")
            ends.append(last)
        head_sync = FLOAT * (p.head_params + 2 * p.running_stats)
        return self._sync(graph, ends, head_sync)[0]

    def _coded_round(self, graph: Graph, server: int, workers: Sequence[int], layer: ConvLayer, forward: bool,
                     code, k: int, batch: float, before: int) -> int:
        p = self.p
        ch_out = packet_channels(code, layer.out_channels)
        ch_in = packet_channels(code, layer.in_channels)
        spatial_out = layer.out_values // layer.out_channels
        spatial_in = layer.in_values // layer.in_channels
        values = round(batch * (layer.in_values if forward else layer.out_values))
        wants_reply = forward or layer.column_copy
        if forward or layer.column_copy:
            arrived = self._deliver(graph, server, workers, values, before, code)
        else:  # a layer without a column copy: worker j gets its own packet of dY
            enc = graph.compute(server, p.relay_encode(values), [before], "encode")
            packet = FLOAT * round(batch * ch_out * spatial_out)
            arrived = {w: [graph.send(server, w, packet, [enc], "packet")] for w in workers}
        replies = []
        for w in workers:
            if forward:
                done = graph.compute(w, layer.forward(batch * ch_out), arrived[w], "coded forward")
                replies.append(graph.send(w, server, FLOAT * round(batch * ch_out * spatial_out), [done], "reply"))
                continue
            if wants_reply:
                done = graph.compute(w, layer.input_grad(batch * ch_in), arrived[w], "coded input gradient")
                replies.append(graph.send(w, server, FLOAT * round(batch * ch_in * spatial_in), [done], "reply"))
                graph.compute(w, layer.update(batch * ch_out), label="update")
            else:
                graph.compute(w, layer.update(batch * ch_out), arrived[w], "update")
        if not wants_reply:
            return before
        got = graph.first(k, replies, "first k")
        decoded = round(batch * (layer.out_values if forward else layer.in_values))
        return graph.compute(server, p.decode(decoded), [got, before], "decode")

    def _deliver(self, graph: Graph, server: int, workers: Sequence[int], values: int, before: int,
                 code) -> Dict[int, List[int]]:
        """Send a tensor to every worker: a copy each, or relayed as packets; return each one's arrivals."""
        p, s = self.p, self.s
        if s.dissemination != "relay":
            return {w: [graph.send(server, w, FLOAT * values, [before], "tensor")] for w in workers}
        enc = graph.compute(server, p.relay_encode(values), [before], "relay encode")
        packet = FLOAT * math.ceil(values / code.k) + FLOAT * code.n
        own = {w: graph.send(server, w, packet, [enc], "packet") for w in workers}
        out = {}
        if len(workers) <= RELAY_EXACT_UP_TO:
            forwarded: Dict[int, List[int]] = {w: [own[w]] for w in workers}
            for src in workers:
                for dst in workers:
                    if dst != src:
                        forwarded[dst].append(graph.send(src, dst, packet, [own[src]], "relayed packet"))
            for w in workers:
                got = graph.first(code.k, forwarded[w], "k packets")
                out[w] = [graph.compute(w, p.relay_decode(values), [got], "relay restore")]
            return out
        # Many workers: each one's n - 1 forwarded packets as one message to its neighbour, which loads
        # every egress and ingress with as many bytes in O(n) messages (the k-th packet is then a little late).
        for i, w in enumerate(workers):
            src = workers[i - 1]
            got = graph.send(src, w, packet * (len(workers) - 1), [own[src], own[w]], "relayed packets")
            out[w] = [graph.compute(w, p.relay_decode(values), [got], "relay restore")]
        return out

    # ------------------------------------------------------------------ ddp
    def ddp(self, graph: Graph) -> int:
        p, n = self.p, self.s.n
        samples = p.batch / n
        total = p.model_step(samples)
        forward = p.trunk_forward(samples) + p.head_step(samples) / 3 if p.feature_values else total / 3
        backward = max(0.0, total - forward)
        buckets = ddp_buckets(p)
        ranks = list(range(n))
        done = []
        previous: Optional[int] = None
        progress = {r: graph.compute(r, forward, label="forward") for r in ranks}
        for size, share in buckets:
            ready = [graph.compute(r, backward * share, [progress[r]], "backward") for r in ranks]
            progress = dict(zip(ranks, ready))
            after = ready + ([previous] if previous is not None else [])
            previous = self.collective(graph, ranks, size, after)
            done.append(previous)
        ends = [graph.compute(r, p.optimizer(p.params), [previous], "step") for r in ranks]
        return ends[0]


def ps_iteration(builder: Builder, graph: Graph) -> int:
    """Add one iteration of a parameter server (the registry's cost graph of ps); return rank 0's last task."""
    return builder.parameter_server(graph)


def stanza_iteration(builder: Builder, graph: Graph) -> int:
    """Add one iteration of layer separation (stanza's cost graph)."""
    return builder.layer_separation(graph)


def coded_iteration(builder: Builder, graph: Graph) -> int:
    """Add one iteration of coded conv layers (the cost graph of the coded schemes)."""
    return builder.coded(graph)


def packet_channels(code, channels: int, symbol_size: int = 1) -> int:
    """Return the channels of one packet coding `channels` channels (padding and shifts included)."""
    unit = code.k * symbol_size
    block = -(-channels // unit) * symbol_size
    return code.packet_length(block, symbol_size)


def ddp_buckets(profile: Profile) -> List[tuple]:
    """Return DDP's gradient buckets in the order they become ready: (bytes, share of the backward pass).

    The head's gradients come first (the backward runs from the loss); the share of the backward pass
    before each bucket is ready follows the parameters, the head's part weighted by its compute.
    """
    total = FLOAT * profile.params
    sizes, left, cap = [], total, DDP_FIRST_BUCKET_BYTES
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = DDP_BUCKET_BYTES
    return [(size, size / total) for size in sizes]


def _some(task: Optional[int]) -> List[int]:
    return [] if task is None else [task]
