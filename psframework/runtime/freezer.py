"""Freeze a process periodically: SIGSTOP for `pause` seconds, SIGCONT for `run` seconds, until terminated.

Run as its own process (`python -m psframework.runtime.freezer PID PAUSE RUN`), so that it keeps the
schedule while the frozen process can do nothing; `stragglers.Freezer` starts and stops it. The module
itself needs only the standard library.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import List, Optional


def freeze(pid: int, pause_s: float, run_s: float) -> None:
    """Stop and continue `pid` in turn until it exits or this process is terminated; always let it go on."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the finally below always lets pid go on
    try:
        while True:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(pause_s)
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)
    except ProcessLookupError:
        pass
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def main(argv: Optional[List[str]] = None) -> None:
    """Freeze the process given on the command line: PID PAUSE_S RUN_S."""
    args = sys.argv[1:] if argv is None else argv
    pid, pause_s, run_s = int(args[0]), float(args[1]), float(args[2])
    freeze(pid, pause_s, run_s)


if __name__ == "__main__":
    main()
