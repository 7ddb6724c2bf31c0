"""Run one rank of an MPICH job so that its death does not take the other ranks with it.

MPICH's process manager (hydra) kills every rank of a job as soon as one of the processes it
started is killed by a signal, even under `mpiexec -disable-auto-cleanup`. Started as

    mpiexec -disable-auto-cleanup -n N python -m psframework.runtime.guard python -m mpi4py -m psframework ...

each rank runs as a child of this guard, which exits normally (status 128 + signal) when its rank
is killed. Hydra then only tells the other ranks (SIGUSR1, forwarded here) and they go on without
it. `hpc/psf-mpirun` launches this way with MPICH's mpiexec.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import List, Optional

FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command as a child, pass signals on to it and exit with its status."""
    command = sys.argv[1:] if argv is None else argv
    if not command:
        print("usage: python -m psframework.runtime.guard COMMAND [ARGS...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(command, close_fds=False)  # the rank keeps the process manager's connection
    # The process manager notices a rank's death when its connection closes: the guard must not hold it.
    pmi_fd = os.environ.get("PMI_FD", "")
    if pmi_fd.isdigit():
        try:
            os.close(int(pmi_fd))
        except OSError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    status = child.wait()
    # The process manager tells every rank when another leaves without finalizing MPI (as ranks do
    # after a death, see psframework.cli): a notice arriving now must not kill the guard, which would
    # count as a death in turn.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter shutdown: it would restore the default (fatal) SIGUSR1 action
