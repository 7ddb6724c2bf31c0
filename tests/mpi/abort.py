"""One rank raises while the others block in MPI (3 ranks): python -m mpi4py must abort the whole job."""

from __future__ import annotations

import time

from psframework.comm import Envelope, Kind, Transport, setup_roles

roles = setup_roles()
t = Transport(roles.comm, timeout_s=None)  # no watchdog: only the abort can end the blocked ranks
print(f"rank {roles.rank} ready", flush=True)
if roles.rank == 2:
    time.sleep(0.5)
    raise ValueError("deliberate failure on rank 2")
if roles.rank == 0:
    t.recv(2, Envelope(Kind.REPLY, 0))  # never sent
else:
    roles.comm.Barrier()  # never completed
print("unreachable: a blocked rank returned", flush=True)
