"""What a scheme's sides see of the transport: the server's link to its workers and a worker's to its server.

`comm.server_link` and `comm.worker_link` implement them (`MPIServerLink`; `MPIWorkerLink`, and
`ShardedWorkerLink` for a worker of several parameter shards' servers, which joins and splits vectors
itself), so a scheme is written against these signatures and one tensor per message whatever the
topology.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple

from .envelope import Envelope

if TYPE_CHECKING:  # the Protocols are read without MPI
    from .relay import RelayedPackets
    from .roles import Roles
    from .rounds import WorkerReport


class ServerLink(Protocol):
    """A server's link to its workers: rounds (send, take the first replies), workers named by index."""

    n: int  # workers of this server
    workers: List[int]  # their ranks on the server's communicator
    clock: Any  # the current iteration's timings and the workers each round used

    @property
    def live(self) -> List[int]:
        """Return the worker ranks that are not detached."""

    @property
    def job_workers(self) -> Sequence[int]:
        """Return the ranks in the job of every worker of every group."""

    def job_rank(self, index: int) -> int:
        """Return the rank in the job of the worker with packet index `index`."""

    def require(self, needed: int) -> None:
        """Declare how many workers a round needs."""

    def rotate_subsets(self, k: int) -> None:
        """Use every k-subset of the workers in turn instead of the first k replies."""

    def announce(self, values: Any) -> None:
        """Tell every worker what the run starts from."""

    def await_workers(self, start: int) -> None:
        """Wait until every worker is ready for the iteration after `start`."""

    def start_iteration(self, iteration: int, state_for: Callable[[int, int], Any], readmit: bool = True) -> None:
        """Begin an iteration: readmit the workers that asked to rejoin (if `readmit`), with the state the scheme
        gives."""

    def begin_iteration(self) -> None:
        """Start timing a new iteration's rounds."""

    def iteration_fields(self) -> Dict[str, Any]:
        """Return the current iteration's bytes and the workers each round used."""

    def expect(self, reply: Envelope, ranks: Optional[Sequence[int]] = None) -> Any:
        """Pre-post the receives of a round's replies."""

    def send(self, payloads: Any, envelope: Envelope, ranks: Optional[Sequence[int]] = None) -> None:
        """Start sending payloads[i] to ranks[i] (every worker by default; one tensor goes to all)."""

    def collect(self, gather: Any, need: int, rotate: bool = True) -> Any:
        """Wait for the first `need` replies; return them by worker index."""

    def collect_within(self, gather: Any, timeout_s: float) -> Any:
        """Wait up to timeout_s for every reply; return those that came."""

    def round(self, payloads: Any, envelope: Envelope, reply: Envelope, need: int, rotate: bool = True) -> Any:
        """Send to every worker and return the first `need` replies."""

    def stop_early(self, iteration: int) -> None:
        """Tell every worker that the run stops after `iteration`."""

    def finish(self, recorder: Any, total: int) -> Dict[str, Any]:
        """Stop the workers, close the transport and return the summary's communication fields."""


class WorkerLink(Protocol):
    """A worker's link to its server: take its messages, reply, report, relay, rejoin, stop."""

    report: WorkerReport  # this worker's counts and times, sent to the server when the run stops
    roles: Roles
    across: Any  # with several groups: the workers of this packet index in every group (Peers)
    all_workers: Any  # with several groups: every worker of every group (Peers)

    @property
    def index(self) -> int:
        """Return this worker's packet index."""

    @property
    def rank(self) -> int:
        """Return this worker's rank in the job."""

    @property
    def workers(self) -> Sequence[int]:
        """Return the ranks of every worker of this worker's server."""

    @property
    def job_workers(self) -> Sequence[int]:
        """Return the ranks in the job of every worker of every group."""

    def busy(self) -> ContextManager[None]:
        """Return a block to compute in (a progress thread, if any, moves messages meanwhile)."""

    def use_progress_thread(self, thread: Any) -> None:
        """Let `thread` (None: none) move messages while this worker computes (see `busy`)."""

    def serve_snapshots(self, state: Callable[[], Any]) -> None:
        """Answer the server's snapshot requests with `state()` (this worker's state, for a readmission)."""

    def announced(self) -> Any:
        """Return what the server announced at the start."""

    def started(self, start: int) -> None:
        """Tell the server that this worker is ready for the iteration after `start`."""

    def take(self, envelope: Envelope) -> Any:
        """Wait for a server message and return its tensor."""

    def has(self, envelope: Envelope) -> bool:
        """Return whether a server message has arrived."""

    def first_of(self, envelopes: Sequence[Envelope]) -> int:
        """Wait until one of the messages has arrived; return its position (not taking it)."""

    def reply(self, data: Any, envelope: Envelope, count: bool = True, wait: bool = True) -> None:
        """Send a reply to the server."""

    def send(self, data: Any, envelope: Envelope) -> None:
        """Start sending a tensor to the server."""

    def progress(self) -> None:
        """Move whatever messages can move now."""

    def let_sends_go(self, envelope: Envelope) -> None:
        """Poll until no message of this worker waits on its emulated link (or the server's `envelope` is in)."""

    def relay_on_arrival(self, relayed: Callable[[Envelope], bool], first: Optional[int]) -> None:
        """Send the server messages `relayed` accepts on to `first` peers as soon as they arrive (None: every peer)."""

    def relay_rest(self, envelope: Envelope) -> None:
        """Send a relayed packet to the peers it has not gone to yet."""

    def relay_packets(self, packet: Any, envelope: Envelope, k: int, stopped_after: int) -> RelayedPackets:
        """Relay packets among the workers until k are in, own one included."""

    def rejoin(self, detached_at: int, total: int) -> Optional[Tuple[int, Any]]:
        """Ask to rejoin after a detach; return (iteration, state) to go on from, or None to stop."""

    def stop(self, total: int) -> int:
        """Take the stop message, send the report, close; return the iteration the run stopped at."""
