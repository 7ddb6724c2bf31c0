"""What a transport counts: messages and bytes moved, and what it had to drain, drop or keep aside."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TransportStats:
    """Counts of what the transport moved and what it had to drain."""

    sent_messages: int = 0  # messages sent, kept back ones included
    sent_bytes: int = 0
    dropped_messages: int = 0  # messages kept back, then dropped unsent (their receiver had been detached)
    dropped_bytes: int = 0
    received_messages: int = 0  # messages handed out
    received_bytes: int = 0  # payload bytes that came in, late replies that were dropped included
    late_drained: int = 0  # replies that came after their round was over: received into scratch, dropped
    stale_discarded: int = 0  # older-iteration messages met by a newer receive: dropped
    future_kept: int = 0  # newer-iteration messages met by an older receive: kept for their own receive
    cancelled: int = 0  # receives cancelled because nothing was sent for them
