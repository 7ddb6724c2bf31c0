"""Every rank fails at once (4 ranks), rank 1 50 ms after the others: exactly one claims the report."""

from __future__ import annotations

import time

from mpi4py import MPI

from psframework.runtime.world import FirstError

comm = MPI.COMM_WORLD
errors = FirstError(comm, window_s=0.5)
comm.Barrier()
seen_at = time.time() + (0.05 if comm.Get_rank() == 1 else 0.0)
if errors.first(seen_at):
    print(f"reported by rank {comm.Get_rank()}", flush=True)
comm.Barrier()
late = FirstError(comm, window_s=0.5)  # a fresh job: one rank alone fails and reports
comm.Barrier()
if comm.Get_rank() == 3 and late.first():
    print("alone: reported by rank 3", flush=True)
comm.Barrier()
