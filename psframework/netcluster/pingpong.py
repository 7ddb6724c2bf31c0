"""Measure a link between two ranks: one-way latency from small messages, bandwidth from large ones.

Run on two ranks (`hpc/netcluster pingpong` places them on two hosts); rank 0 prints one JSON line:
{"hosts", "latency_s", "bandwidth_bps", "size_bytes", "repeats"}. Each figure is the median over its
repeats of half a round trip, so it is what one message in one direction costs.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from typing import List, Sequence

import numpy as np


def one_way_times(comm, message: np.ndarray, repeats: int) -> List[float]:
    """Return the one-way times (half of each round trip) of `repeats` ping-pongs of `message` between ranks 0 and 1."""
    rank, times = comm.Get_rank(), []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        if rank == 0:
            comm.Send(message, dest=1, tag=7)
            comm.Recv(message, source=1, tag=7)
        else:
            comm.Recv(message, source=0, tag=7)
            comm.Send(message, dest=0, tag=7)
        times.append((time.perf_counter() - start) / 2)
    return times


def measure(size: int, repeats: int, latency_repeats: int) -> dict:
    """Return the link's figures as seen by rank 0 (None on rank 1)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit(f"pingpong: got {comm.Get_size()} ranks, expected 2")
    hosts = comm.gather(socket.gethostname(), root=0)
    small = np.zeros(1, dtype=np.uint8)
    one_way_times(comm, small, 5)  # connections made, caches warm
    latency = statistics.median(one_way_times(comm, small, latency_repeats))
    large = np.zeros(size, dtype=np.uint8)
    one_way_times(comm, large, 1)  # the first large message also opens TCP's window
    seconds = statistics.median(one_way_times(comm, large, repeats))
    if comm.Get_rank():
        return None
    return {"hosts": hosts, "latency_s": latency, "bandwidth_bps": size * 8 / max(seconds - latency, 1e-12),
            "size_bytes": size, "repeats": repeats, "message_s": seconds}


def main(argv: Sequence[str] = ()) -> None:
    """Parse the sizes and print rank 0's figures as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m psframework.netcluster.pingpong")
    parser.add_argument("--size", type=int, default=64 << 20, help="bytes of the large message (64 MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-repeats", type=int, default=200)
    args = parser.parse_args(list(argv))
    figures = measure(args.size, args.repeats, args.latency_repeats)
    if figures is not None:
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
