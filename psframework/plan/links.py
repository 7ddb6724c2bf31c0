"""Measure what a message costs between two ranks, for a calibration profile.

Run on two ranks (`mpiexec -n 2 python -m mpi4py -m psframework.plan.links`); rank 0 prints one JSON
line, a `profile.Link`: latency (half a round trip of a small MPI message); bandwidth (of a large
one); for messages whose ranks pause between polls as ranks that outnumber their cores do (a
transfer then moves on only when they poll), the bandwidth and the fixed cost of a message;
processor time per byte (the cores' busy time while large messages go back and forth, the ranks
pausing as they wait); the transport's own time per message at each end (its small-message half
round trip over MPI's, halved); and the share of a core a rank uses while it waits, polling. Each
figure is the median of repeats interleaved between MPI and the transport, so that a drift of the
machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict
from typing import Optional, Sequence

import numpy as np

from psframework.comm.locality import off_node_ranks
from psframework.comm.polling import Backoff
from psframework.plan.profile import Link

SMALL, MEDIUM, LARGE = 1024, 256 << 10, 16 << 20
POLL_S = 1e-3  # the ranks wait for the large messages sleeping between polls, so that a core's busy time is work


def busy_s() -> float:
    """Return the seconds this machine's cores have been busy (all processes and the kernel, /proc/stat)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def machine_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as fh:
        return fh.read().strip()


def copies(comm, message: np.ndarray, repeats: int) -> float:
    """Ping-pong `message` `repeats` times, both ranks sleeping while they wait; return the seconds.

    As in the transport, a receiver whose peer is on another node yields instead of sleeping: the
    message moves only while it polls (comm.polling.Backoff)."""
    rank = comm.Get_rank()
    remote = (1 - rank) in off_node_ranks(comm)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        for sender in (0, 1):
            receiving = rank != sender
            if receiving:
                request = comm.Irecv(message, source=1 - rank, tag=9)
            else:
                request = comm.Isend(message, dest=1 - rank, tag=9)
            # the transport's pauses between polls when ranks outnumber cores
            backoff = Backoff(POLL_S, (lambda: True) if receiving and remote else None)
            while not request.Test():
                backoff.pause()
    return time.perf_counter() - start


def waiting_cpu(comm, wait_s: float = 0.5) -> float:
    """Return the share of a core rank 1 uses while it waits for a message, sleeping between polls as
    ranks do that outnumber their cores (the transport's pause of POLL_S)."""
    from psframework.comm import Envelope, Kind, Phase, Transport

    t = Transport(comm, cuda_aware="false", timeout_s=60.0, poll_sleep_s=POLL_S)
    note, buf = Envelope(Kind.COMMAND, 1, layer=1, phase=Phase.FORWARD), np.zeros(8, np.uint8)
    comm.Barrier()
    share = 0.0
    if comm.Get_rank() == 0:
        time.sleep(wait_s)
        t.send(1, buf, note)
    else:
        cpu, wall = time.process_time(), time.perf_counter()
        t.recv(0, note, out=buf)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    t.close(5.0)
    return comm.bcast(share, root=1)


def measure(repeats: int = 5) -> Optional[Link]:
    """Return the link between ranks 0 and 1 as rank 0 measures it (None on rank 1)."""
    from mpi4py import MPI

    from psframework.bench.comm import raw_pingpong, transport_pingpong
    from psframework.comm import Transport

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit(f"psframework.plan.links: got {comm.Get_size()} ranks, expected 2")
    t = Transport(comm, cuda_aware="false", timeout_s=60.0)
    latency, large, transport = [], [], []
    for _ in range(repeats):
        latency.append(raw_pingpong(comm, SMALL, 200))
        transport.append(transport_pingpong(t, SMALL, 200))
        large.append(raw_pingpong(comm, LARGE, 10))
    t.close(5.0)
    waiting = waiting_cpu(comm)
    # Processor time per byte: what the machine's cores (both ends, where they share a machine, and the
    # kernel's network stack) spend while the ranks move large messages and do nothing else.
    one_machine = len(set(comm.allgather(machine_id()))) == 1
    message = np.zeros(LARGE, np.uint8)
    before, cpu_before = busy_s(), time.process_time()
    polled = copies(comm, message, repeats)
    spent = busy_s() - before if one_machine else 2 * (time.process_time() - cpu_before)
    # A polled message's fixed cost (the protocol's steps wait for polls), from a medium size next to the large.
    medium = statistics.median(copies(comm, np.zeros(MEDIUM, np.uint8), 1) / 2 for _ in range(4 * repeats))
    polled_s_per_byte = (polled / (2 * repeats) - medium) / (LARGE - MEDIUM)
    if comm.Get_rank():
        return None
    lat, big, small = statistics.median(latency), statistics.median(large), statistics.median(transport)
    seconds_per_byte = max(big - lat, 1e-12) / LARGE
    return Link(latency_s=lat, bandwidth_Bps=1.0 / seconds_per_byte, cpu_s_per_byte=spent / (2 * repeats * LARGE),
                overhead_s=max(0.0, small - lat) / 2.0, polled_Bps=1.0 / max(polled_s_per_byte, 1e-12),
                polled_latency_s=max(lat, medium - MEDIUM * polled_s_per_byte), waiting_cpu=waiting)


def main(argv: Sequence[str] = ()) -> None:
    """Print rank 0's figures as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m psframework.plan.links")
    parser.add_argument("--repeats", type=int, default=5)
    link = measure(parser.parse_args(list(argv)).repeats)
    if link is not None:
        print(json.dumps(asdict(link)), flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
