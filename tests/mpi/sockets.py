"""Exchange a message between two ranks, then print how many TCP connections this process holds."""

import os

import numpy as np
from mpi4py import MPI


def tcp_connections() -> int:
    """Count this process's sockets that /proc lists as established TCP connections."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        count += sum(1 for row in rows if row[3] == "01" and row[9] in inodes)  # 01: ESTABLISHED
    return count


comm = MPI.COMM_WORLD
data = np.arange(1 << 18, dtype=np.float32)
if comm.rank == 0:
    comm.Send(data, dest=1)
    comm.Recv(data, source=1)
else:
    comm.Recv(data, source=0)
    comm.Send(data, dest=0)
counts = comm.gather(tcp_connections())
if comm.rank == 0:
    print("tcp", *counts)
