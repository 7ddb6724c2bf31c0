"""The vocabulary of rounds between a server and its workers, shared by every scheme and both sides of a link.

The message envelopes (Msg), what a round hands back (Replies), what a worker counts and reports,
the exceptions that end a worker's wait (Detached, StopEarly) and the order of rotating subsets.
The MPI links are server_link.py and worker_link.py; membership.py holds rank 0's detach rule.
Nothing here knows models, codes or the config.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from .envelope import Envelope, Kind, Phase

# Rank 0 waits this many watchdog timeouts for every worker's set-up (imports, data, model): ranks that
# share a loaded node start slowly, and a slow start is not a silent worker.
SETUP_PATIENCE = 4.0


def probe_fields(envelope: Envelope) -> Tuple[int, int, int]:
    """Return (kind, layer, phase): what a probe matches on."""
    return envelope.kind, envelope.layer, envelope.phase


class Msg:
    """The message vocabulary: each entry returns the envelope of one kind of message for an iteration.

    command, reply and packet take (iteration, layer, phase); params takes (iteration, layer, phase=);
    the others take the iteration only.
    """

    command = partial(Envelope, Kind.COMMAND)  # server -> worker: an input to compute on
    reply = partial(Envelope, Kind.REPLY)  # worker -> server: the result of a command
    packet = partial(Envelope, Kind.PACKET)  # worker <-> worker: a coded packet of a relayed tensor
    params = partial(Envelope, Kind.PARAMS, phase=Phase.OTHER)  # server -> worker: initial state, weights
    grads = partial(Envelope, Kind.GRADS, layer=0, phase=Phase.BACKWARD)  # worker -> server: gradients
    state = partial(Envelope, Kind.STATE, phase=Phase.OTHER)  # server -> worker: send your state
    state_reply = partial(Envelope, Kind.STATE_REPLY, phase=Phase.OTHER)  # worker -> server: its state
    stop = partial(Envelope, Kind.STOP, phase=Phase.OTHER)  # the end (and the worker's report)
    # Membership: a worker too far behind is detached; when it answers again it is readmitted.
    detach = partial(Envelope, Kind.DETACH, phase=Phase.OTHER)  # server -> worker: you were left out
    rejoin = partial(Envelope, Kind.REJOIN, phase=Phase.OTHER)  # worker -> server: back (detach iteration)
    readmit = partial(Envelope, Kind.READMIT, phase=Phase.OTHER)  # server -> worker: go on here, fresh state
    snapshot = partial(Envelope, Kind.SNAPSHOT, phase=Phase.OTHER)  # server -> worker: your state, please
    snapshot_reply = partial(Envelope, Kind.SNAPSHOT_REPLY, phase=Phase.OTHER)  # worker -> server: its state
    # server -> worker: the run stops after this iteration (a preemption); a sync and the stop follow
    stop_early = partial(Envelope, Kind.STOP_EARLY, phase=Phase.OTHER)
    started = partial(Envelope, Kind.STARTED, phase=Phase.OTHER)  # worker -> server: ready to train
    # stanza: the features of a worker's shard, and the gradient of the loss with respect to them
    features = partial(Envelope, Kind.FEATURES, phase=Phase.FORWARD)  # worker -> server
    feature_grads = partial(Envelope, Kind.FEATURE_GRADS, phase=Phase.BACKWARD)  # server -> worker
    # loss scaling: an optimizer step's scale and whether it is taken, and the workers' finiteness of theirs
    scale = partial(Envelope, Kind.SCALE, phase=Phase.UPDATE)  # server -> worker
    scale_reply = partial(Envelope, Kind.SCALE_REPLY, phase=Phase.UPDATE)  # worker -> server


class Detached(Exception):
    """Raised on a worker that the server has left out; it rejoins with a fresh state."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"detached at iteration {iteration}")
        self.iteration = iteration


class StopEarly(Exception):
    """Raised on a worker that the server told to stop after `iteration` (the run was preempted)."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"the run stops after iteration {iteration}")
        self.iteration = iteration


class WorkerReport:
    """What a worker counts and reports when it stops."""

    # cpu_s: processor seconds (every thread) of the steps after the first, cpu_steps: how many steps.
    FIELDS = ("replies_sent", "replies_skipped", "max_behind", "compute_s", "delay_s", "updates", "cpu_s",
              "cpu_steps")

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0.0)
        self.behind = 0

    def sent(self) -> None:
        """Count a reply sent: the worker is up to date again."""
        self.values["replies_sent"] += 1
        self.behind = 0

    def skipped(self) -> None:
        """Count a reply skipped because the server had already moved on."""
        self.values["replies_skipped"] += 1
        self.behind += 1
        self.values["max_behind"] = max(self.values["max_behind"], self.behind)

    def add(self, name: str, value: float) -> None:
        """Add to a counter (seconds of compute or delay, updates applied)."""
        self.values[name] += value

    def vector(self) -> np.ndarray:
        """Return the report as one float64 vector for the wire."""
        return np.array([self.values[f] for f in self.FIELDS], dtype=np.float64)

    @classmethod
    def from_vector(cls, vector: Sequence[float]) -> Dict[str, float]:
        """Return a report received from a worker as {field: value}."""
        return dict(zip(cls.FIELDS, (float(v) for v in vector)))


@dataclass
class Replies:
    """The replies a round used: {packet index j: tensor}, in arrival order."""

    data: Dict[int, Any]
    ranks: List[int]  # the ranks they came from, ascending

    @property
    def indices(self) -> List[int]:
        """Return the packet indices of the replies, in arrival order."""
        return list(self.data)


def rotating_subsets(n: int, k: int) -> Iterator[tuple]:
    """Cycle through every k-subset of n workers, those without systematic packets first."""
    subsets = sorted(itertools.combinations(range(n), k), key=lambda s: (-min(s), s))
    return itertools.cycle(subsets)


def cpu_per_iteration(server_cpu_s: float, reports: Any) -> Dict[str, float]:
    """Return processor seconds per iteration of a server and of its workers together (their reports)."""
    workers = sum(r["cpu_s"] / r["cpu_steps"] for r in reports if r.get("cpu_steps"))
    return {"server": server_cpu_s, "workers": workers, "total": server_cpu_s + workers}
