"""Predict a setup's iteration on a cluster: build its graph, replay it, read rank 0's iterations off it.

Allreduces (DDP's buckets, the sums among several servers or among stanza's workers) are rings: each
rank sends and receives 2 (m - 1) / m of the bytes in 2 (m - 1) steps, taking the wire time of the
slowest link they cross and, on every rank's cores beside its program, the copies and the sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence

from psframework.plan.cluster import STOP_GO_PERIOD_S, Cluster
from psframework.plan.graphs import DDP, FLOAT, Builder, Setup
from psframework.plan.profile import Profile
from psframework.plan.sim import COMPUTE, MESSAGE, Graph, copy_s, simulate

CALM_ITERATIONS = 3
MAX_ITERATIONS = 400  # a stop-go replay's longest
STOP_GO_CYCLES = 3


@dataclass(frozen=True)
class Prediction:
    """A setup's predicted iteration on a cluster."""

    setup: Setup
    iteration_s: float
    rank0_bytes: float  # what rank 0 sends and receives per iteration (DDP: one process's ring traffic)
    cpu_s: float  # processor time of every rank per iteration (work, copies and the transport's own)
    batch: int  # the global batch

    @property
    def images_per_s(self) -> float:
        return self.batch / self.iteration_s if self.iteration_s > 0 else 0.0


def ring(profile: Profile, cluster: Cluster, ranks_in_job: int, tcp: bool = False):
    """Return the collective the builders add: a ring allreduce on `cluster` (`tcp`: over sockets, as gloo)."""
    def add(graph: Graph, ranks: Sequence[int], nbytes: int, after: Sequence[int]) -> int:
        start = graph.first(len(after), after, "allreduce starts")
        m = len(ranks)
        if m == 1:
            return start
        moved = 2 * (m - 1) / m * nbytes
        hosts = [cluster.host_of(r, ranks_in_job) for r in ranks]
        sharing = max(hosts.count(h) for h in set(hosts))  # ranks of the ring that share a host's link
        crosses = len(set(hosts)) > 1 or cluster.emulated
        latency = cluster.latency_s + (cluster.local.latency_s if cluster.emulated else 0.0)
        wire = 2 * (m - 1) * latency + (moved * sharing / cluster.link_Bps if crosses else 0.0)
        link = cluster.remote if tcp else cluster.local if cluster.emulated or not crosses else cluster.remote
        copies = moved * link.cpu_s_per_byte + 4 * (m - 1) * link.overhead_s
        sums = profile.add((m - 1) / m * nbytes / FLOAT)
        work = [graph.compute(r, copies + sums, [start], "allreduce", ordered=False) for r in ranks]
        wired = graph.delay(wire, [start], "allreduce on the wire")
        return graph.first(m + 1, work + [wired], "allreduce done")
    return add


def predict(profile: Profile, setup: Setup, cluster: Cluster) -> Prediction:
    """Return the setup's predicted seconds per iteration and rank 0's bytes on the cluster."""
    calm = _run(profile, setup, cluster.with_straggler(cluster.straggler.__class__("none")), CALM_ITERATIONS)
    if cluster.straggler.kind != "stopgo":
        if cluster.straggler.kind == "none":
            return calm
        return _run(profile, setup, cluster, CALM_ITERATIONS)
    # Iterations enough to cover STOP_GO_CYCLES cycles (the stop begins with the run), each a whole
    # share of them: the mean over whole cycles, whatever the iteration's length.
    horizon = STOP_GO_CYCLES * STOP_GO_PERIOD_S
    count = int(min(MAX_ITERATIONS, max(8, math.ceil(horizon / max(calm.iteration_s, 1e-9)) + 2)))
    return _run(profile, setup, cluster, count, from_start=True)


def _graph(profile: Profile, setup: Setup, cluster: Cluster, iterations: int):
    """Return the graph of `iterations` iterations, the tasks that end them and the machine it runs on."""
    graph = Graph()
    skip = cluster.lagging_rank(setup) if cluster.straggler.kind != "none" else None
    collective = ring(profile, cluster, setup.ranks, tcp=setup.scheme == DDP)
    ends = Builder(profile, setup, collective, skip).build(graph, iterations)
    return graph, ends, cluster.machine(setup, start_s=0.0)


def work_bound_s(profile: Profile, setup: Setup, cluster: Cluster) -> float:
    """Return a floor under the setup's seconds per iteration, without replaying it: the busiest pool's
    processor work in one iteration (computations, both ends of each message) spread over its cores. A
    stopped rank only delays its work, and the work a backup worker may skip is not in the graph."""
    graph, _, machine = _graph(profile, setup, cluster, 1)
    work: Dict[int, float] = {}
    for t in graph.tasks:
        spent = [(t.rank, t.work_s)] if t.kind == COMPUTE else \
            [(t.rank, copy_s(machine, t)), (t.dst, copy_s(machine, t))] if t.kind == MESSAGE else []
        for rank, seconds in spent:
            pool = machine.pool_of(rank)
            work[pool] = work.get(pool, 0.0) + seconds
    return max(w / machine.cores(pool) for pool, w in work.items()) if work else 0.0


def _run(profile: Profile, setup: Setup, cluster: Cluster, iterations: int, from_start: bool = False) -> Prediction:
    """Replay `iterations` iterations; time them after the first (`from_start`: from the start, as a stop-go run
    is timed over whole cycles)."""
    graph, ends, machine = _graph(profile, setup, cluster, iterations)
    finish = simulate(graph, machine)
    times = [finish[e] for e in ends]
    if any(math.isnan(t) for t in times):
        raise RuntimeError(f"{setup}: the simulated iteration did not finish (a round waits for more replies "
                           "than it has workers)")
    if from_start:
        done = [t for t in times if t <= STOP_GO_CYCLES * STOP_GO_PERIOD_S] or times[:1]
        per = done[-1] / len(done)
    else:
        per = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else times[0]
    return Prediction(setup, per, rank0_bytes(profile, setup, graph) / iterations,
                      processor_time(graph, machine) / iterations, profile.batch)


def processor_time(graph: Graph, machine) -> float:
    """Return the processor time of every task of the graph: computations and both ends of each message."""
    total = 0.0
    for t in graph.tasks:
        if t.kind == COMPUTE:
            total += t.work_s
        elif t.kind == MESSAGE:
            total += 2 * copy_s(machine, t)
    return total


def rank0_bytes(profile: Profile, setup: Setup, graph: Graph) -> float:
    """Return the bytes rank 0 sends and receives in the graph (DDP: a process's ring allreduce)."""
    if setup.scheme == DDP:
        steps = sum(1 for t in graph.tasks if t.label == "step" and t.rank == 0)
        return 2 * 2 * (setup.n - 1) / setup.n * FLOAT * profile.params * steps
    return float(sum(t.nbytes for t in graph.tasks if t.kind == MESSAGE and 0 in (t.rank, t.dst)))
