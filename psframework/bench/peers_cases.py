"""The cases of psf bench peers: one training job each (a contender, n workers, a link, a straggler setting)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psframework.bench.contenders import Contender
from psframework.bench.peers_links import EMULATED, NETCLUSTER, link_words

NAME = "peers"
PROG = f"psf bench {NAME}"
LATENCY_US = 50
STOPPED_WORKER = 2  # the second worker: rank 2 of a psframework job, rank 1 of DDP's
RANK0_PARTS = ("wait_s", "decode_s", "encode_s", "comm_s", "compute_s")  # rank 0's iteration, part by part


@dataclass(frozen=True)
class Case:
    """One training job: a contender with n workers, a link and a straggler setting."""

    contender: Contender
    n: int
    link: str
    straggler: str
    network: str = EMULATED  # or NETCLUSTER: the link is a real one of the benchmark's cluster

    @property
    def ddp(self) -> bool:
        """Return whether torch DDP trains the case (one process per worker)."""
        return self.contender.program == "ddp"

    @property
    def k(self) -> int:
        """Return the replies a round needs: n - n/4 (n/4 stragglers tolerated), or n when every worker is."""
        return self.n if self.contender.needs_every_worker else self.n - max(1, self.n // 4)

    @property
    def ranks(self) -> int:
        """Return the MPI ranks of the job: n DDP processes, or a server and n workers."""
        return self.n if self.ddp else self.n + 1

    @property
    def stopped_rank(self) -> int:
        """Return the rank stopped and let go in stop-go."""
        return STOPPED_WORKER - 1 if self.ddp else STOPPED_WORKER

    def overrides(self) -> List[str]:
        """Return the config overrides of the case."""
        unemulated = self.link == "none" or self.network == NETCLUSTER  # a real link is shaped by the kernel
        link = (["comm.emulate.bandwidth_gbps=null", "comm.emulate.latency_us=0"] if unemulated else
                [f"comm.emulate.bandwidth_gbps={self.link}", f"comm.emulate.latency_us={LATENCY_US}"])
        return list(self.contender.overrides) + [f"code.n={self.n}", f"code.k={self.k}"] + link

    @property
    def label(self) -> str:
        """Return the case in words."""
        return f"{self.contender.name}, n={self.n}, {link_words(self.link, self.network)}, {self.straggler}"


def link_gbps(link: str) -> Optional[float]:
    """Return a link setting as a number of Gb/s, None for no emulation."""
    return None if link == "none" else float(link)


def indexed(cases: Sequence[Mapping[str, Any]]) -> Tuple[Dict[tuple, Mapping[str, Any]], List[str]]:
    """Return the cases by (contender, n, link, straggler), and the contenders in the order they ran."""
    by = {(c["scheme"], c["n"], c["link_gbps"], c["straggler"]): c for c in cases}
    return by, list(dict.fromkeys(c["scheme"] for c in cases))
