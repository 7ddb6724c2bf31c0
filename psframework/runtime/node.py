"""This rank's place in the job: roles, transports (with emulated links), threads, straggler sleeps."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from psframework import environment
from psframework.codes.threads import set_decode_threads
from psframework.comm.membership import RankLoss
from psframework.fileio import leave_for_launcher
from psframework.runtime.transport_settings import TransportSettings

if TYPE_CHECKING:  # the transport needs mpi4py: it is imported when a node starts
    from psframework.comm.collective import Peers
    from psframework.comm.roles import Roles
    from psframework.comm.transport import Transport
    from psframework.runtime.threads import ThreadPlan


@dataclass
class Node:
    """This rank's roles, its transport to every rank and, on workers that relay, the worker-only transport."""

    roles: Roles
    transport: Transport
    peers: Optional[Transport]
    settings: TransportSettings
    threads: Optional[ThreadPlan] = None  # how many threads this rank computes with
    device: str = "cpu"  # the torch device this rank computes on (its bound GPU is the current one)
    device_note: Optional[str] = None  # why `device: auto` fell back to the CPU, if it did
    across: Optional[Peers] = None  # with several groups: this rank's peers across groups (servers, or packet j)
    all_workers: Optional[Peers] = None  # with several groups, on workers: every worker of the job
    shards: List[Tuple[Roles, Transport]] = field(default_factory=list)  # parameter shards: (roles, transport)
    hosts: List[str] = field(default_factory=list)  # on rank 0: every rank's host name, by world rank

    def wants_progress_thread(self) -> bool:
        """Return whether this rank runs a progress thread: `comm.progress_thread`, `auto` when the node
        has a core to spare for it (on a node with more ranks than cores it would take compute time)."""
        choice = self.settings.progress_thread
        if choice != "auto" or self.threads is None:
            return choice == "true"
        plan = self.threads
        return plan.ranks_per_node * plan.threads < min(plan.cores_per_node, plan.usable_cores * plan.ranks_per_node)

    def emulation(self) -> Optional[Dict[str, float]]:
        """Return the emulated link settings and how long this rank's sends were held back, or None when off."""
        hook = self.transport.send_hook
        if hook is None:
            return None
        return {"bandwidth_gbps": self.settings.bandwidth_gbps, "latency_us": self.settings.latency_us,
                "server_send_delay_s": hook.delayed_s}


class RankLossNotice(RankLoss):
    """Whether a rank of this job died: told by the process manager, or noted by the rounds.

    MPICH's hydra, under `-disable-auto-cleanup`, sends every other rank SIGUSR1 when one dies
    (whose default action would end them too); the notice is all a rank learns: which rank died
    shows in who stops answering. Under srun, psframework.launch sends rank 0 the same notice when
    srun reports that a task ended (`announce`); the other ranks learn it from rank 0's stop.
    """

    def announce(self, environ: Optional[Dict[str, str]] = None) -> None:
        """Leave this process's id where psframework.launch sends the notice to (PSF_NOTICE_PID), if it does.

        Only once the notice is installed: SIGUSR1's default action would end the rank.
        """
        leave_for_launcher(environment.notice_pid_file(environ), str(os.getpid()))

    def install(self) -> None:
        """Take SIGUSR1 as the notice (only the main thread may install signal handlers)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._note)

    def _note(self, *_: Any) -> None:
        self.noticed = True  # a signal handler: no list to touch here
        self.watch_for_stall()

    def note(self, ranks: Sequence[int] = ()) -> None:
        super().note(ranks)
        self.watch_for_stall()

    watching = False

    def watch_for_stall(self) -> None:
        """On rank 0, end the job once it has started no iteration for `stall_s` since a rank died.

        A send to a dead rank can block inside the MPI for ever (MPICH over OFI's TCP provider
        retries the reconnection without end); a thread still runs, as mpi4py releases the GIL.
        """
        if self.watching or self.stall_s is None:
            return
        self.watching = True
        threading.Thread(target=self._watch, name="psf-stall-watch", daemon=True).start()

    def _watch(self) -> None:
        while time.monotonic() - self.last_beat < self.stall_s:
            time.sleep(1.0)
        print(f"psf: error: rank 0: no iteration started for {self.stall_s:.0f} s after a rank of the job died: "
              "a send to the dead rank never returned from the MPI; resume from the last checkpoint with "
              "train.resume=auto", file=sys.stderr, flush=True)
        os._exit(1)


RANK_LOSS = RankLossNotice()  # true once this rank knows that a rank of the job died


def leave_word_of_loss(loss: RankLoss, environ: Optional[Dict[str, str]] = None) -> None:
    """Write the ranks a finished run went on without where psframework.launch reads them (PSF_LOST_RANKS).

    srun's status is then the dead rank's, and the launcher turns it into the run's: it finished.
    """
    leave_for_launcher(environment.lost_ranks_file(environ), " ".join(map(str, loss.ranks)) or "unknown")


def start_node(settings: TransportSettings, comm: Any = None, peers: bool = False, device: str = "cpu",
               groups: int = 1, shards: bool = False) -> Node:
    """Split the job into `groups` groups of a server and its workers, bind the GPU, plan threads and open
    the transports (collective).

    `device` is the `device` setting (cpu, cuda, auto); received tensors land on the chosen device.
    `shards`: with several groups, also open one transport per parameter shard (its server and every worker).
    """
    from psframework.comm import Transport, setup_roles
    from psframework.comm.roles import shard_roles
    from psframework.comm.locality import node_cores
    from psframework.comm.polling import auto_poll_sleep
    from psframework.runtime.binding import select_device
    from psframework.runtime.emulate import link_emulator
    from psframework.runtime.memory import keep_freed_memory
    from psframework.runtime.threads import configure_threads

    RANK_LOSS.install()
    keep_freed_memory()
    roles = setup_roles(comm, groups)
    if roles.world_rank == 0:
        RANK_LOSS.announce()
    chosen, note = select_device(device, roles.world)
    plan = configure_threads(roles.world, threads=settings.threads or None)
    if environment.decode_threads() is None:  # decoding shares this rank's cores like torch and BLAS do
        set_decode_threads(plan.threads)
    # From the whole job's ranks on this node, not one group's, and the cores they have together.
    poll_sleep_s = auto_poll_sleep(roles.world, node_cores(roles.world))
    emulated = settings.emulated_ranks == "all" or roles.is_server
    link = link_emulator(settings.bandwidth_gbps, settings.latency_us) if emulated else None  # one per rank

    def transport(on: Any, paced: bool) -> Any:
        return Transport(on, cuda_aware=settings.cuda_aware, timeout_s=settings.timeout_s, send_hook=link,
                         window=settings.window if paced else None, device=chosen, poll_sleep_s=poll_sleep_s)

    # Rank 0 and workers sending to peers pace their messages: any worker may stop taking them (frozen,
    # descheduled, dead). Rank 0 is never paced against: a stalled rank 0 stalls the run anyway.
    world = transport(roles.comm, paced=roles.is_server)
    world.job_ranks = roles.job_ranks
    worker_peers = transport(roles.workers_comm, paced=True) if (peers and roles.is_worker) else None
    if worker_peers is not None:
        worker_peers.job_ranks = [roles.job_ranks[r] for r in roles.workers]
    node = Node(roles, world, worker_peers, settings, plan, chosen, note)
    node.hosts = roles.world.gather(socket.gethostname(), root=0) or []  # where each rank ran, for the summary
    if groups > 1:
        node.across, node.all_workers = across_groups(roles, settings.timeout_s, poll_sleep_s, world.send_hook)
    if groups > 1 and shards:
        node.shards = [(r, transport(r.comm, paced=r.is_server)) for r in shard_roles(roles)]
        for r, t in node.shards:
            t.job_ranks = r.job_ranks
    return node


def across_groups(roles: Roles, timeout_s: float, poll_sleep_s: float,
                  send_hook: Any = None) -> Tuple[Peers, Optional[Peers]]:
    """Return this rank's peers across groups (the servers, or the holders of its packet) and, on workers,
    every worker of the job; their sums cross this rank's emulated link (`send_hook`) as its messages do."""
    from functools import partial

    from psframework.comm.collective import Peers

    peers = partial(Peers, timeout_s=timeout_s, poll_sleep_s=poll_sleep_s, send_hook=send_hook)
    if roles.is_server:
        return peers(roles.servers_comm, [g * roles.size for g in range(roles.groups)]), None
    packet = [g * roles.size + roles.rank for g in range(roles.groups)]
    return peers(roles.packet_comm, packet), peers(roles.all_workers_comm, roles.job_workers)


def straggle(stragglers: Any, rank: int, iteration: int, compute_s: float,
             keep_moving: Sequence[Callable[[], Any]]) -> float:
    """Sleep as an injected straggler would and return the delay.

    Unresponsive, as a slow node is (no MPI progress), unless `stragglers.responsive` asks for the
    model where only compute is slow: then `keep_moving` (progress functions) run between short naps.
    """
    if not stragglers.spec.responsive:
        return stragglers.inject(rank, iteration, compute_s)

    def sleep(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > 0:
            for progress in keep_moving:
                progress()
            time.sleep(min(left, 1e-3))

    return stragglers.inject(rank, iteration, compute_s, sleep=sleep)
