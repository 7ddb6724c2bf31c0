"""Flow control, the progress thread and the straggler models, in one process (MPI on COMM_SELF)."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from psframework.comm import Envelope, Kind, Transport
from psframework.runtime.node import Node
from psframework.runtime.stragglers import Freezer, StragglerSpec, Stragglers, start_freezer
from psframework.runtime.threads import ThreadPlan
from psframework.runtime.transport_settings import TransportSettings


def envelope(iteration: int) -> Envelope:
    return Envelope(Kind.COMMAND, iteration, layer=3)


def self_transport(window):
    from mpi4py import MPI

    return Transport(MPI.COMM_SELF, cuda_aware="false", timeout_s=10.0, window=window)


def test_a_paced_sender_keeps_back_what_is_beyond_its_window():
    t = self_transport(window=2)
    handles = [t.isend(0, np.full(3, i, np.float32), envelope(i)) for i in range(5)]
    assert [h.requests is None for h in handles] == [False, False, True, True, True]
    assert [h.envelope.iteration for h in t.outbox.backlog(0)] == [2, 3, 4]
    assert t.stats.sent_messages == 5  # what the algorithm sent, kept back ones included
    # Receiving the first two acknowledges them (a credit message, since nothing goes back): the
    # next two go out, in order.
    for i in range(2):
        assert t.recv(0, envelope(i)).tolist() == [i] * 3
    t.progress()
    assert [h.envelope.iteration for h in t.outbox.backlog(0)] == [4]
    assert t.recv(0, envelope(2)).tolist() == [2] * 3
    t.close()


def test_dropping_forgets_kept_back_messages_and_counts_them():
    t = self_transport(window=1)
    for i in range(4):
        t.isend(0, np.zeros(2, np.float32), envelope(i))
    assert t.outbox.drop(0, before=2) == 1  # only iteration 1 is kept back and older than 2
    assert [h.envelope.iteration for h in t.outbox.backlog(0)] == [2, 3]
    assert t.outbox.drop(0) == 2 and not t.outbox.backlog(0)
    assert t.stats.dropped_messages == 3 and t.stats.dropped_bytes == 3 * 8
    assert t.recv(0, envelope(0)).tolist() == [0.0, 0.0]
    t.close()


def test_an_unpaced_transport_posts_everything_at_once():
    t = self_transport(window=None)
    handles = [t.isend(0, np.zeros(1), envelope(i)) for i in range(20)]
    assert all(h.requests is not None for h in handles) and not t.outbox.backlog(0)
    for i in range(20):
        t.recv(0, envelope(i))
    t.close()


def test_a_deadline_does_not_count_time_this_process_was_stopped(monkeypatch):
    from psframework.comm import polling

    clock = [100.0]
    monkeypatch.setattr(polling.time, "monotonic", lambda: clock[0])
    deadline = polling.Deadline(5.0)
    for _ in range(40):  # polls every 0.1 s: 4 s of waiting
        clock[0] += 0.1
        assert not deadline.passed()
    clock[0] += 30.0  # stopped for 30 s between two polls: not waiting time
    assert not deadline.passed()
    for _ in range(9):
        clock[0] += 0.1
        assert not deadline.passed()
    clock[0] += 0.15
    assert deadline.passed()
    assert not polling.Deadline(None).passed()


def test_a_wait_yields_instead_of_sleeping_while_a_payload_comes_over_the_network(monkeypatch):
    from psframework.comm import polling

    sleeps, yields = [], []
    monkeypatch.setattr(polling.time, "sleep", sleeps.append)
    monkeypatch.setattr(polling, "_yield", lambda: yields.append(1))
    moving = [True]
    backoff = polling.Backoff(1e-3, lambda: moving[0])
    for _ in range(5):
        backoff.pause()
    assert (len(yields), sleeps) == (5, [])
    moving[0] = False
    for _ in range(8):
        backoff.pause()
    assert sleeps[0] == polling.FIRST_SLEEP_S and max(sleeps) == 1e-3


def test_a_rank_alone_has_no_peer_on_another_node():
    from mpi4py import MPI

    from psframework.comm.locality import off_node_ranks

    assert off_node_ranks(MPI.COMM_SELF) == frozenset()
    t = Transport(MPI.COMM_SELF, timeout_s=5.0)
    assert t.off_node == frozenset() and not t.moving()
    t.close()


def test_bad_windows_are_named():
    with pytest.raises(ValueError, match="window: got 0"):
        self_transport(window=0)


def test_the_progress_thread_probes_only_while_busy():
    from psframework.runtime.progress import ProgressThread

    thread = ProgressThread(period_s=1e-3)
    time.sleep(0.05)
    idle = thread.probes
    with thread.busy():
        time.sleep(0.2)
    busy = thread.probes - idle
    time.sleep(0.05)
    after = thread.probes
    thread.close()
    assert idle == 0 and busy >= 10 and after == idle + busy


@pytest.mark.parametrize("choice,ranks,threads,cores,expected", [
    ("auto", 5, 1, 2, False),  # more ranks than cores: the thread would take compute time
    ("auto", 4, 1, 8, True),
    ("auto", 4, 2, 8, False),  # the ranks' own threads fill the node
    ("true", 5, 1, 2, True),
    ("false", 4, 1, 8, False),
])
def test_the_progress_thread_runs_where_a_core_is_free(choice, ranks, threads, cores, expected):
    plan = ThreadPlan(threads=threads, cores_per_node=cores, ranks_per_node=ranks, usable_cores=cores, source="test")
    node = Node(None, None, None, TransportSettings(progress_thread=choice), plan)
    assert node.wants_progress_thread() is expected


def test_the_freeze_model_stops_and_continues_a_process():
    import subprocess
    import sys

    spec = StragglerSpec(model="freeze", ranks=(2,), pause_s=0.2, duty=0.5)
    assert Stragglers(spec, [1, 2, 3]).factors(0) == {1: 0.0, 2: 0.0, 3: 0.0}  # no per-iteration delays
    assert start_freezer(spec, 1) is None
    # Sample the state of a sleeping child: frozen (T) about half the time, running (S) otherwise.
    child = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(30)"])
    freezer = Freezer(spec, pid=child.pid)
    states = []
    for _ in range(100):
        time.sleep(0.02)
        with open(f"/proc/{child.pid}/stat") as fh:
            states.append(fh.read().rsplit(")", 1)[1].split()[0])
    freezer.stop()
    time.sleep(0.1)
    with open(f"/proc/{child.pid}/stat") as fh:
        final = fh.read().rsplit(")", 1)[1].split()[0]
    child.kill()
    child.wait()
    stopped = states.count("T") / len(states)
    assert 0.25 <= stopped <= 0.75, states
    assert final != "T"  # stopping the freezer lets the process go on


def test_the_freezer_helper_lets_its_process_go_on_when_it_ends(monkeypatch):
    import signal

    from psframework.runtime import freezer

    sent = []

    def kill(pid, sig):
        sent.append((pid, sig))
        if len(sent) == 3:
            raise ProcessLookupError(pid)  # the process is gone: the helper ends

    monkeypatch.setattr(freezer.os, "kill", kill)
    monkeypatch.setattr(freezer.time, "sleep", lambda s: None)
    monkeypatch.setattr(freezer.signal, "signal", lambda *a: None)  # leave pytest's own SIGTERM handler be
    freezer.main(["123", "0.5", "0.1"])
    assert sent == [(123, signal.SIGSTOP), (123, signal.SIGCONT), (123, signal.SIGSTOP), (123, signal.SIGCONT)]


@pytest.mark.parametrize("fields,message", [
    (dict(model="freeze"), "stragglers.ranks: got none"),
    (dict(model="freeze", ranks=(2,), duty=1.0), "stragglers.duty: got 1.0"),
    (dict(model="freeze", ranks=(2,), pause_s=0.0), "stragglers.pause_s: got 0.0"),
])
def test_bad_freeze_settings_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        StragglerSpec(**fields)


def test_the_guard_passes_signals_on_and_exits_with_the_status_of_its_command():
    import subprocess
    import sys

    code = "import os, signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: os._exit(7))\ntime.sleep(30)"
    guard = subprocess.Popen([sys.executable, "-m", "psframework.runtime.guard", sys.executable, "-c", code])
    time.sleep(1.0)
    guard.send_signal(signal.SIGUSR1)
    assert guard.wait(timeout=20) == 7
    killed = subprocess.Popen([sys.executable, "-m", "psframework.runtime.guard", sys.executable, "-c",
                               "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.wait(timeout=20) == 128 + signal.SIGKILL  # a normal exit: MPICH spares the other ranks
