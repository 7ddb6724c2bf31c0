"""Run `psf` command lines one after another in one MPI job: the tests' warm start (mpiutil.run_psf).

Rank 0 reads one JSON request per line from its standard input, {"argv": [...], "out": PREFIX,
"keep_mpi": BOOL}; every rank runs psframework's command line on argv with its output in PREFIX.RANK.out and
PREFIX.RANK.err, then rank 0 writes "STATUS MORE" to PREFIX.status: the exit status (the first
non-zero one by rank) and whether the job takes another request (1) or ends (0). The end of the
input ends the job; so does a run that finalized MPI (one that ended with an error does, unless the
request says keep_mpi: the run then returns its status and leaves MPI to the next one). Ranks
wait for a request without spinning: idle pools take no CPU from the tests that run meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from psframework import cli
from psframework.comm.collective import wait_quietly

POLL_S = 0.05  # the longest sleep between tests of a request still in flight
COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()  # asked once: a run may finalize MPI


def share(request: Optional[dict]) -> Optional[dict]:
    """Broadcast rank 0's request (None: stop) to every rank, waiting quietly."""
    data = json.dumps(request).encode() if RANK == 0 else b""
    size = np.array([len(data)], np.int64)
    wait_quietly(COMM.Ibcast(size, root=0), POLL_S)
    buffer = np.frombuffer(data, np.uint8).copy() if RANK == 0 else np.empty(int(size[0]), np.uint8)
    wait_quietly(COMM.Ibcast(buffer, root=0), POLL_S)
    return json.loads(buffer.tobytes().decode())


def read_request() -> Optional[dict]:
    """Return the next request from standard input (rank 0), None at its end."""
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else None


@contextlib.contextmanager
def mpi_kept(keep: bool):
    """Within the block, a run that ends with an error returns its status without finalizing MPI (if keep)."""
    if not keep:
        yield
        return
    end_cleanly = cli._end_cleanly
    cli._end_cleanly = lambda comm, status: status
    try:
        yield
    finally:
        cli._end_cleanly = end_cleanly


def run(argv: Any, out: str, keep_mpi: bool) -> int:
    """Run one command line with this rank's output in files; return its exit status."""
    with open(f"{out}.{RANK}.out", "w") as stdout, open(f"{out}.{RANK}.err", "w") as stderr, \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), mpi_kept(keep_mpi):
        try:
            return int(cli.main(argv) or 0)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1


def serve() -> None:
    """Answer requests until the input ends or a run finalizes MPI."""
    while True:
        request = share(read_request() if RANK == 0 else None)
        if request is None:
            return
        status = run(request["argv"], request["out"], request.get("keep_mpi", False))
        if MPI.Is_finalized():  # every rank agreed to stop with this status: rank 0 speaks for them
            if RANK == 0:
                write_status(request["out"], status, more=False)
            return
        statuses = COMM.allgather(status)
        if RANK == 0:
            write_status(request["out"], next((s for s in statuses if s), 0), more=True)


def write_status(out: str, status: int, more: bool) -> None:
    """Write the exit status last, under a temporary name first: its file says the run is over."""
    with open(f"{out}.status.tmp", "w") as f:
        f.write(f"{status} {int(more)}")
    os.replace(f"{out}.status.tmp", f"{out}.status")


if __name__ == "__main__":
    serve()
