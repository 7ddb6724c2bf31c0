"""The cluster a plan is for: hosts, their cores and links, and the straggler to expect.

`Cluster.machine(setup)` places a setup's ranks on it for the simulation: in blocks of consecutive
ranks per host (as srun places them), or cyclically (rank r on host r mod N, as the cluster of hosts
on one machine does). An emulated network (comm.emulate on one host) gives each rank a link of its
own that only its sends queue on, and every byte moves through shared memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Optional, Tuple

from psframework.plan.graphs import DDP, Setup
from psframework.plan.profile import Link
from psframework.plan.sim import Machine

STOP_GO_PERIOD_S = 0.5  # a stop-go worker's cycle: stopped for its share of it, then running
UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class PlanError(ValueError):
    """A plan's input is not one it can take; the message names it and what is expected."""


def parse_rate(text: str, what: str = "--link") -> float:
    """Return bytes per second of a rate such as 10gbit, 100Gbit or 1.5gbit (inf for none)."""
    if text.lower() in ("none", "inf"):
        return math.inf
    found = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit|bps)?", text.strip().lower())
    if not found or float(found.group(1)) <= 0:
        raise PlanError(f"{what}: got {text!r}, expected a rate such as 10gbit, 100gbit or 800mbit")
    return float(found.group(1)) * UNITS[found.group(2)] / 8.0


def parse_time(text: str, what: str = "--latency") -> float:
    """Return seconds of a time such as 5us, 0.1ms or 2e-6s."""
    found = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us|ns)", text.strip().lower())
    if not found:
        raise PlanError(f"{what}: got {text!r}, expected a time such as 5us, 0.1ms or 2ns")
    return float(found.group(1)) * TIME_UNITS[found.group(2)]


@dataclass(frozen=True)
class Straggler:
    """One worker that lags: stopped part of the time, slower, or on a slower link."""

    kind: str  # none, stopgo, slow, slowlink
    value: float = 0.0  # stopgo: share of the time stopped; slow: times slower; slowlink: share of the rate

    @classmethod
    def parse(cls, text: str) -> "Straggler":
        kind, _, value = text.partition(":")
        limits = {"stopgo": (0.0, 1.0, "a share of the time stopped, 0 < x < 1"),
                  "slow": (1.0, math.inf, "times slower, > 1"),
                  "slowlink": (0.0, 1.0, "a share of the link's rate, 0 < x < 1")}
        if kind == "none" and not value:
            return cls("none")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if kind not in limits or not limits[kind][0] < number < limits[kind][1]:
            raise PlanError(f"--straggler: got {text!r}, expected none, stopgo:X, slow:X or slowlink:X "
                            f"({'; '.join(f'{k}: {v[2]}' for k, v in limits.items())})")
        return cls(kind, number)

    def words(self) -> str:
        return {"none": "no straggler", "stopgo": f"a worker stopped {self.value:.0%} of the time",
                "slow": f"a worker {self.value:g}x slower",
                "slowlink": f"a worker's link at {self.value:.0%} of its rate"}[self.kind]


@dataclass(frozen=True)
class Cluster:
    """Hosts, their cores and links; what moving a byte costs on one host and between hosts."""

    hosts: int
    cores_per_host: float
    link_Bps: float  # each way, per host (inf: no limit)
    latency_s: float
    local: Link  # between ranks of one host
    remote: Link  # between hosts
    emulated: bool = False  # links emulated on one host (comm.emulate): no shared ingress, bytes through memory
    one_pool: bool = False  # every rank shares one pool of cores_per_host cores (hosts made on one machine)
    cyclic: bool = False  # rank r on host r mod hosts (else in blocks)
    straggler: Straggler = Straggler("none")

    def with_straggler(self, straggler: Straggler) -> "Cluster":
        return replace(self, straggler=straggler)

    def host_of(self, rank: int, ranks: int) -> int:
        if self.emulated:
            return rank
        if self.cyclic:
            return rank % self.hosts
        return rank // max(1, math.ceil(ranks / self.hosts))

    def lagging_rank(self, setup: Setup) -> int:
        """Return the rank that straggles: the second worker (DDP's second process)."""
        return 1 if setup.scheme == DDP else 2

    def machine(self, setup: Setup, start_s: float = 0.0) -> Machine:
        """Return the simulation's machine for a setup's ranks."""
        ranks = setup.ranks
        host = [self.host_of(r, ranks) for r in range(ranks)]
        lag = self.lagging_rank(setup)
        slow_host = host[lag] if self.straggler.kind == "slowlink" else None

        def bandwidth(h: int) -> float:
            return self.link_Bps * (self.straggler.value if h == slow_host else 1.0)

        def cpu(src: int, dst: int) -> float:
            same = self.emulated or host[src] == host[dst]
            return (self.local if same else self.remote).cpu_s_per_byte

        stop_go: Optional[Tuple[int, float, float, float]] = None
        if self.straggler.kind == "stopgo":
            stopped = self.straggler.value * STOP_GO_PERIOD_S
            stop_go = (lag, stopped, STOP_GO_PERIOD_S - stopped, start_s)
        slow = (lag, self.straggler.value) if self.straggler.kind == "slow" else None
        link = self.local if self.emulated else self.remote
        # Ranks that outnumber their cores sleep between polls: transfers move on only when they poll,
        # and each waiting rank takes a little of the cores from those that compute.
        per_pool = ranks if self.one_pool or self.emulated else math.ceil(ranks / self.hosts)
        crowded = per_pool > self.cores_per_host
        return Machine(pool_of=(lambda r: 0) if self.one_pool else (lambda r: host[r]),
                       cores=lambda pool: self.cores_per_host,
                       host_of=lambda r: host[r], bandwidth_Bps=bandwidth,
                       latency_s=self.latency_s + (self.local.latency_s if self.emulated else 0.0)
                       + (link.polled_latency_s if crowded else 0.0),
                       cpu_s_per_byte=cpu, overhead_s=link.overhead_s, share_ingress=not self.emulated,
                       stop_go=stop_go, slow=slow, polled_Bps=link.polled_Bps if crowded else math.inf,
                       waiting_cpu=link.waiting_cpu if crowded else 0.0)

    def words(self) -> str:
        rate = "unlimited" if math.isinf(self.link_Bps) else f"{self.link_Bps * 8 / 1e9:g} Gb/s"
        where = "emulated links on one host" if self.emulated else f"{self.hosts} hosts"
        return (f"{where}, {self.cores_per_host:g} cores {'in all' if self.one_pool else 'per host'}, "
                f"links {rate}, latency {self.latency_s * 1e6:g} us, {self.straggler.words()}")
