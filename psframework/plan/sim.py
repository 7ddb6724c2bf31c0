"""Replay a task graph on a machine: cores shared by processor sharing, messages over per-host links.

A graph's tasks are computations (seconds of one free core, on a rank) and messages (bytes from one
rank to another); a task starts once its dependencies have finished, or once `need` of them have (a
first-k round). A rank runs its computations one after another in the order they were added (its
program order). The ranks of one pool of cores share them: m running tasks on C cores each advance
at min(1, C / m) of a core. A message costs processor time at both ends (copies, the TCP stack; the
pool's, outside program order) and crosses the sender's egress then the receiver's ingress link,
each a first-come-first-served queue of the host's bandwidth, so that messages into one receiver
share its link (incast). A stop-go rank runs only in its go windows.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

COMPUTE, MESSAGE, JOIN, DELAY = "compute", "message", "join", "delay"
TOGGLE = -(1 << 40)  # the event that stops or restarts the stop-go rank
NETWORK = -(1 << 41)  # the event of the next flow to finish


@dataclass
class Task:
    """One node of a graph."""

    kind: str
    rank: int = -1  # compute: the rank that runs it; message: the sender
    work_s: float = 0.0  # compute: seconds on a free core; delay: seconds
    dst: int = -1  # message: the receiver
    nbytes: int = 0  # message: payload bytes
    deps: List[int] = field(default_factory=list)
    need: Optional[int] = None  # of deps, how many must finish first (None: all)
    label: str = ""


class Graph:
    """A task graph under construction; each add returns the new task's id."""

    def __init__(self) -> None:
        self.tasks: List[Task] = []
        self._last: Dict[int, int] = {}  # rank -> its latest computation (program order)

    def _add(self, task: Task) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1

    def compute(self, rank: int, work_s: float, after: Sequence[int] = (), label: str = "",
                ordered: bool = True) -> int:
        """Add `work_s` of computation on `rank` after `after` and (`ordered`) after its previous computation.

        Unordered work runs beside the rank's program (a communication thread's).
        """
        deps = list(after) + ([self._last[rank]] if ordered and rank in self._last else [])
        task = self._add(Task(COMPUTE, rank, max(0.0, work_s), deps=deps, label=label))
        if ordered:
            self._last[rank] = task
        return task

    def send(self, src: int, dst: int, nbytes: int, after: Sequence[int] = (), label: str = "") -> int:
        """Add a message of `nbytes` from `src` to `dst`, leaving after `after`."""
        return self._add(Task(MESSAGE, src, dst=dst, nbytes=int(nbytes), deps=list(after), label=label))

    def first(self, k: int, of: Sequence[int], label: str = "") -> int:
        """Add a point reached once `k` of `of` have finished."""
        return self._add(Task(JOIN, deps=list(of), need=min(k, len(of)), label=label))

    def delay(self, seconds: float, after: Sequence[int] = (), label: str = "") -> int:
        """Add a wait of `seconds` after `after` that takes no core (a collective's time on the wire)."""
        return self._add(Task(DELAY, work_s=max(0.0, seconds), deps=list(after), label=label))

    def last(self, rank: int) -> Optional[int]:
        """Return the latest computation added on `rank`."""
        return self._last.get(rank)


@dataclass(frozen=True)
class Machine:
    """Where the ranks run: their pools of cores, their hosts' links and how much a byte costs to move."""

    pool_of: Callable[[int], int]  # rank -> pool of cores
    cores: Callable[[int], float]  # pool -> cores
    host_of: Callable[[int], int]  # rank -> host (its links)
    bandwidth_Bps: Callable[[int], float]  # host -> bytes per second of its link, each way (inf: no limit)
    latency_s: float = 0.0
    cpu_s_per_byte: Callable[[int, int], float] = lambda src, dst: 0.0  # processor time per byte, both ends
    overhead_s: float = 0.0  # processor time per message at each end
    share_ingress: bool = True  # True: flows share both ends' links fairly; False: a queue at the sender (emulated)
    polled_Bps: float = math.inf  # a transfer's top speed when its ranks sleep between polls
    waiting_cpu: float = 0.0  # share of a core each waiting rank of a pool takes from the others
    stop_go: Optional[Tuple[int, float, float, float]] = None  # (rank, stopped s, running s, from)
    slow: Optional[Tuple[int, float]] = None  # (rank, factor): that rank's work takes factor times longer


def copy_s(machine: Machine, task: Task) -> float:
    """Return the processor time a message costs at one of its ends (its sender's or its receiver's copy)."""
    return machine.overhead_s + 0.5 * machine.cpu_s_per_byte(task.rank, task.dst) * task.nbytes


class _Pool:
    """Processor sharing of one pool's cores, kept in virtual time (work done by each running task).

    Each of the pool's `ranks` that runs nothing waits, polling, and takes `waiting` of a core.
    """

    def __init__(self, cores: float, ranks: int = 0, waiting: float = 0.0) -> None:
        self.cores, self.virtual, self.at = cores, 0.0, 0.0
        self.ranks, self.waiting = ranks, waiting
        self.running: Dict[int, float] = {}  # task -> virtual time at which it finishes
        self.version = 0
        # The running tasks by finish, earliest first, ties in the order they started: every task advances
        # alike in virtual time, so the order never changes. Entries of removed tasks are skipped lazily.
        self._by_finish: List[Tuple[float, int, int]] = []
        self._started: Dict[int, int] = {}  # task -> its entry's sequence number
        self._sequence = 0

    def add(self, task: int, finish: float) -> None:
        """Start `task`, to finish at virtual time `finish`."""
        self.running[task] = finish
        self._sequence += 1
        self._started[task] = self._sequence
        heapq.heappush(self._by_finish, (finish, self._sequence, task))

    def remove(self, task: int) -> float:
        """Take `task` off the cores; return the virtual time at which it would have finished."""
        del self._started[task]
        return self.running.pop(task)

    def rate(self) -> float:
        if not self.running:
            return 0.0
        idle = max(0, self.ranks - len(self.running))
        return min(1.0, max(0.1 * self.cores, self.cores - self.waiting * idle) / len(self.running))

    def advance(self, now: float) -> None:
        self.virtual += (now - self.at) * self.rate()
        self.at = now

    def next_finish(self) -> Tuple[float, int]:
        heap = self._by_finish
        while self._started.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        finish, _, task = heap[0]
        return self.at + (finish - self.virtual) / self.rate(), task


class _Network:
    """Flows between hosts that share each host's egress and ingress fairly (TCP's flows on real links).

    A flow's rate is the least of its sender's link over the flows leaving it, its receiver's over the
    flows entering it, and `cap` (how fast a transfer goes when its ranks only poll now and then).
    """

    def __init__(self, bandwidth: Callable[[int], float], cap: float) -> None:
        self.bandwidth, self.cap = bandwidth, cap
        self.flows: Dict[int, List[float]] = {}  # task -> [src host, dst host, bytes left, rate]
        self.at, self.version = 0.0, 0

    def advance(self, now: float) -> None:
        for flow in self.flows.values():
            flow[2] -= flow[3] * (now - self.at)
        self.at = now

    def add(self, task: int, src: int, dst: int, nbytes: float) -> None:
        self.flows[task] = [src, dst, float(nbytes), 0.0]
        self._rates()

    def finished(self) -> List[int]:
        done = [t for t, f in self.flows.items() if f[2] <= 1e-6 * max(1.0, f[3])]
        for t in done:
            del self.flows[t]
        if done:
            self._rates()
        return done

    def next_finish(self) -> float:
        return min(self.at + max(0.0, f[2]) / f[3] for f in self.flows.values())

    def _rates(self) -> None:
        self.version += 1
        out: Dict[float, int] = {}
        into: Dict[float, int] = {}
        for f in self.flows.values():
            out[f[0]] = out.get(f[0], 0) + 1
            into[f[1]] = into.get(f[1], 0) + 1
        for f in self.flows.values():
            f[3] = min(self.cap, self.bandwidth(int(f[0])) / out[f[0]], self.bandwidth(int(f[1])) / into[f[1]])
            if math.isinf(f[3]):  # no limit anywhere: the bytes are across at once
                f[2], f[3] = 0.0, 1.0


class Simulation:
    """One replay of a graph on a machine; `run` returns every task's finish time."""

    def __init__(self, graph: Graph, machine: Machine) -> None:
        self.graph, self.machine = graph, machine
        tasks = graph.tasks
        self.finish: List[float] = [math.nan] * len(tasks)
        self.pending = [len(t.deps) if t.need is None else t.need for t in tasks]
        self.children: List[List[int]] = [[] for _ in tasks]
        for i, t in enumerate(tasks):
            for d in t.deps:
                self.children[d].append(i)
        self.pools: Dict[int, _Pool] = {}
        self.events: List[Tuple[float, int, int, int]] = []  # (time, order, task or -pool-1, version)
        self.order = 0
        self.egress: Dict[int, float] = {}
        self.stage: Dict[int, int] = {}  # message -> 0 sender's copy, 1 wire, 2 receiver's copy
        self.suspended: Dict[int, float] = {}  # task of a stopped rank -> work left
        self.owner: Dict[int, int] = {}  # pool task -> rank (-1: a message's copy)
        self.now = 0.0
        self.network = _Network(machine.bandwidth_Bps, machine.polled_Bps)
        self.ranks = {t.rank for t in tasks if t.kind == COMPUTE}

    def run(self) -> List[float]:
        """Replay the graph; return each task's finish time (seconds from the start)."""
        for i, t in enumerate(self.graph.tasks):
            if self.pending[i] <= 0:
                self._start(i)
        if self.machine.stop_go is not None:
            rank, stopped, running, start = self.machine.stop_go
            self._push(start, TOGGLE, 0)  # the first stop
        while self.events:
            time, _, what, version = heapq.heappop(self.events)
            if what == TOGGLE:
                self._toggle(time)
                continue
            if what == NETWORK:
                if version == self.network.version:
                    self.now = time
                    self.network.advance(time)
                    for task in self.network.finished():
                        self._push(time + self.machine.latency_s, task, 0)
                    self._reschedule_network()
                continue
            if what < 0:
                pool = self.pools[-what - 1]
                if version != pool.version or not pool.running:
                    continue
                self.now = time
                pool.advance(time)
                _, task = pool.next_finish()
                pool.remove(task)
                pool.version += 1
                self._reschedule(pool, -what - 1)
                self._done_work(task)
            else:
                self.now = max(self.now, time)
                self._done_work(what)
        return self.finish

    def _push(self, time: float, what: int, version: int) -> None:
        self.order += 1
        heapq.heappush(self.events, (time, self.order, what, version))

    def _start(self, i: int) -> None:
        task = self.graph.tasks[i]
        if task.kind == COMPUTE:
            self._run_on_pool(i, task.rank, task.work_s)
        elif task.kind == MESSAGE:
            self.stage[i] = 0
            self._run_on_pool(i, task.rank, copy_s(self.machine, task), owner=-1)
        elif task.kind == DELAY:
            self._push(self.now + task.work_s, i, 0)
        else:
            self._finish(i)

    def _run_on_pool(self, i: int, rank: int, work_s: float, owner: Optional[int] = None) -> None:
        if work_s <= 0.0:
            self._push(self.now, i, 0)
            return
        self.owner[i] = rank if owner is None else owner
        if owner is None and self.machine.slow is not None and self.machine.slow[0] == rank:
            work_s *= self.machine.slow[1]
        if owner is None and self._stopped(rank):
            self.suspended[i] = work_s
            return
        index = self.machine.pool_of(rank)
        pool = self.pools.get(index)
        if pool is None:
            ranks = sum(1 for r in self.ranks if self.machine.pool_of(r) == index)
            pool = self.pools[index] = _Pool(self.machine.cores(index), ranks, self.machine.waiting_cpu)
            pool.at = self.now
        pool.advance(self.now)
        pool.add(i, pool.virtual + work_s)
        pool.version += 1
        self._reschedule(pool, index)

    def _reschedule(self, pool: _Pool, index: int) -> None:
        if pool.running:
            time, _ = pool.next_finish()
            self._push(time, -index - 1, pool.version)

    def _done_work(self, i: int) -> None:
        task = self.graph.tasks[i]
        if task.kind != MESSAGE:
            self._finish(i)
            return
        self.stage[i] += 1
        if self.stage[i] == 1:
            self._cross(i, task)
        elif self.stage[i] == 2:
            self._run_on_pool(i, task.dst, copy_s(self.machine, task), owner=-1)
        else:
            self._finish(i)

    def _cross(self, i: int, task: Task) -> None:
        """Send a message over the links: a fair-shared flow (real links) or the sender's queue (emulated)."""
        m = self.machine
        src, dst = m.host_of(task.rank), m.host_of(task.dst)
        if src == dst:
            self._push(self.now, i, 0)
        elif m.share_ingress:
            self.network.advance(self.now)
            self.network.add(i, src, dst, task.nbytes)
            self._reschedule_network()
        else:
            start = max(self.now, self.egress.get(src, 0.0))
            self.egress[src] = start + task.nbytes / min(m.bandwidth_Bps(src), m.polled_Bps)
            self._push(self.egress[src] + m.latency_s, i, 0)

    def _reschedule_network(self) -> None:
        if self.network.flows:
            self._push(self.network.next_finish(), NETWORK, self.network.version)

    def _finish(self, i: int) -> None:
        if not math.isnan(self.finish[i]):
            return
        self.finish[i] = self.now
        for c in self.children[i]:
            self.pending[c] -= 1
            if self.pending[c] == 0:
                self._start(c)

    def _stopped(self, rank: int) -> bool:
        sg = self.machine.stop_go
        if sg is None or sg[0] != rank or self.now < sg[3]:
            return False
        return (self.now - sg[3]) % (sg[1] + sg[2]) < sg[1]

    def _toggle(self, time: float) -> None:
        """Stop the stop-go rank's computations, or let them go on; schedule the next toggle."""
        self.now = time
        rank, stopped, running, _ = self.machine.stop_go  # type: ignore[misc]
        if self._stopped(rank):
            index = self.machine.pool_of(rank)
            pool = self.pools.get(index)
            if pool is not None:
                pool.advance(time)
                for task in [t for t in pool.running if self.owner.get(t) == rank]:
                    self.suspended[task] = pool.remove(task) - pool.virtual
                pool.version += 1
                self._reschedule(pool, index)
            nxt = time + stopped
        else:
            for task, left in list(self.suspended.items()):
                del self.suspended[task]
                self._run_on_pool(task, rank, left)
            nxt = time + running
        if self.events or self.suspended:  # toggling goes on while anything is left to do
            self._push(nxt, TOGGLE, 0)


def simulate(graph: Graph, machine: Machine) -> List[float]:
    """Replay `graph` on `machine`; return each task's finish time."""
    return Simulation(graph, machine).run()
