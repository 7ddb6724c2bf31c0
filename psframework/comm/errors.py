"""Errors raised by the MPI runtime."""

from __future__ import annotations

from typing import Optional, Sequence


class WatchdogTimeout(RuntimeError):
    """A peer stayed silent past the watchdog timeout; names the silent rank(s)."""

    def __init__(self, ranks: Sequence[int], what: str, timeout_s: float,
                 arrived: Sequence[int] = (), needed: Optional[int] = None) -> None:
        self.ranks = list(ranks)
        self.what = what
        self.timeout_s = timeout_s
        self.arrived = list(arrived)
        self.needed = needed
        silent = ", ".join(str(r) for r in self.ranks)
        message = f"watchdog: no answer from rank(s) {silent} for {what} after {timeout_s:g} s"
        if needed is not None:
            message += (f" ({len(self.arrived)} of {needed} needed replies arrived"
                        f"{': ranks ' + ', '.join(map(str, self.arrived)) if self.arrived else ''})")
        super().__init__(message)


class MessageMismatch(ValueError):
    """A message arrived whose dtype, shape or size differs from what the receiver expects."""


class TooFewWorkers(RuntimeError):
    """Fewer workers are left than a round needs, and the missing ones are known to be lost."""
