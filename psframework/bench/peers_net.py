"""Real links for `psf bench peers --network netcluster`: a cluster of hosts the benchmark makes for itself.

The cluster (psframework.netcluster) has one host more than the most workers of any case, so that
rank r of a job runs on host r (r mod hosts): rank 0 and every worker of a psframework job, and each
DDP process, on a host of its own, talking only over its host's cable. Each case shapes every cable
to its link (tbf at the link's rate in both directions; 'none' leaves the veth unshaped) instead of
emulating it, and MPICH is kept off shared memory (netcluster's job environment); torch DDP's gloo
talks over the same interface, to rank 0's host address. No delay can be added (kernels without
netem); a ping-pong of each link measures the latency and bandwidth it does have. The cluster is
removed when the benchmark ends, and by a reaper process if the benchmark is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from psframework.netcluster import hosts, jobs
from psframework.netcluster.hosts import Cluster
from psframework.netcluster.shaping import LinkShape

PINGPONG_REPEATS = 5


def link_shape(link: str, fraction: float = 1.0) -> LinkShape:
    """Return the shape of a link setting ('none': unshaped veth; else Gb/s), at `fraction` of its rate."""
    return LinkShape() if link == "none" else LinkShape(rate_bps=float(link) * 1e9 * fraction)


class BenchCluster:
    """The benchmark's cluster: its hosts' links are shaped per case, one link slowed for a fault."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.link: Optional[str] = None  # the setting every link has now

    def shape(self, link: str) -> None:
        """Shape every host's link to `link` (unless they have that shape already)."""
        if link != self.link:
            for host in range(self.cluster.hosts):
                hosts.set_link(self.cluster, host, link_shape(link), None)
            self.link = link

    def slow(self, rank: int, fraction: float) -> int:
        """Slow the link of rank `rank`'s host to `fraction` of the current rate; return the host."""
        host = jobs.host_of(rank, self.cluster)
        hosts.set_link(self.cluster, host, link_shape(self.link or "none", fraction), None)
        return host

    def mend(self, host: int) -> None:
        """Give host `host` its case's link back."""
        hosts.set_link(self.cluster, host, link_shape(self.link or "none"), None)

    def counters(self) -> List[Dict[str, int]]:
        """Return every host interface's byte counters."""
        return hosts.counters(self.cluster)

    def command(self, ranks: int, args: Sequence[str], timeout_s: float, env: Mapping[str, str],
                ddp: bool, core_per_rank: bool = False) -> Tuple[List[str], Dict[str, str]]:
        """Return (argv, environment) of `python -m mpi4py ARGS` on `ranks` ranks, rank r on host r (and on core r
        with `core_per_rank`)."""
        extra = dict(env)
        if ddp:
            # gloo on the hosts' interface, its rendezvous at rank 0's host (psframework.bench.ddp)
            extra.update(GLOO_SOCKET_IFNAME=hosts.DEVICE, MASTER_ADDR=hosts.host_address(0))
        return jobs.job_command(self.cluster, ranks, [sys.executable, "-m", "mpi4py", *args], timeout_s, extra,
                                core_per_rank=core_per_rank)

    def pingpong(self, link: str, size: int, timeout_s: float = 300.0) -> Dict[str, Any]:
        """Return the ping-pong figures of hosts 0 and 1 with every link at `link` (large messages of `size`)."""
        self.shape(link)
        argv = [sys.executable, "-m", "psframework.netcluster", "pingpong", "--name", self.cluster.name, "0", "1",
                "--size", str(size), "--repeats", str(PINGPONG_REPEATS), "--timeout", str(timeout_s),
                "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 60)
        if done.returncode != 0:
            raise RuntimeError(f"ping-pong at {link} failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        return {"link_gbps": None if link == "none" else float(link), "latency_s": figures["latency_s"],
                "bandwidth_bps": figures["bandwidth_bps"], "size_bytes": figures["size_bytes"],
                "repeats": figures["repeats"], "message_s": figures["message_s"], "load": os.getloadavg()[0]}


def require() -> Optional[str]:
    """Return why no cluster can be made here, or None when one can."""
    try:
        hosts.require_namespaces()
    except hosts.Unavailable as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def bench_cluster(count: int) -> Iterator[BenchCluster]:
    """Make a cluster of `count` unshaped hosts under a name of this process's; remove it afterwards."""
    name = f"pb{os.getpid() % 10**8}"
    try:
        made = hosts.up(name, count, LinkShape(), watch_pid=os.getpid())
        yield BenchCluster(made)
    finally:
        hosts.down(name)
