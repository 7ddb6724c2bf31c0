"""MPI runtime checks under mpiexec (3 to 5 ranks): first k of n, late replies, watchdog, packet relay,
device buffers, and a failing rank aborting the job."""

from __future__ import annotations

import ast
import subprocess
import time

import pytest
from mpiutil import describe, run_mpi

pytestmark = pytest.mark.timeout(120, method="thread")


def test_of_ranks_failing_at_once_only_the_first_to_see_its_error_reports_it():
    proc = run_mpi(4, "first_error.py", timeout=60)
    assert proc.returncode == 0, describe(proc)
    lines = [line for line in proc.stdout.splitlines() if "reported by" in line]
    assert len(lines) == 2 and lines[1] == "alone: reported by rank 3", describe(proc)
    assert lines[0] in ("reported by rank 0", "reported by rank 2", "reported by rank 3"), describe(proc)


def test_first_k_of_n_takes_the_fastest_never_a_late_reply_and_the_watchdog_names_a_silent_worker():
    proc = run_mpi(4, "firstk.py", timeout=90)
    assert proc.returncode == 0 and "OK firstk" in proc.stdout, describe(proc)
    arrived = {line.split(":")[0]: ast.literal_eval(line.split("arrived ")[1].split(" waited")[0])
               for line in proc.stdout.splitlines() if " arrived [" in line}
    assert sorted(arrived["round 1"]) == [2, 3] and sorted(arrived["round 3"]) == [2, 3]  # worker 1 was delayed
    assert sorted(arrived["round 7"]) == [1, 2] and arrived["round 9"] == [1, 2, 3]
    assert "no answer from rank(s) 3 for REPLY iteration 5" in proc.stdout, describe(proc)


def test_packet_relay_round_trips_exactly_and_serves_the_first_k():
    proc = run_mpi(5, "relay.py", timeout=90)
    assert proc.returncode == 0 and "OK relay" in proc.stdout, describe(proc)


def test_device_and_host_buffer_paths_and_mismatch_errors():
    proc = run_mpi(3, "devbuf.py", timeout=90)
    assert proc.returncode == 0 and "OK devbuf" in proc.stdout, describe(proc)
    assert "cuda-aware detection: MPIX_Query_cuda_support()=0" in proc.stdout, describe(proc)


def test_a_rank_that_raises_ends_the_whole_job_non_zero_within_15_s():
    start = time.monotonic()
    try:
        proc = run_mpi(3, "abort.py", timeout=30)  # mpiexec would kill a hung job only after 30 s
    except subprocess.TimeoutExpired as error:  # pragma: no cover - the failure being guarded against
        pytest.fail(f"the job hung after a rank raised: {error}")
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, describe(proc)
    assert "deliberate failure on rank 2" in proc.stderr, describe(proc)
    assert "unreachable" not in proc.stdout
    assert elapsed < 15, f"the job took {elapsed:.1f} s to end after a rank raised\n{describe(proc)}"


def test_mailbox_takes_everything_in_and_hands_it_out_by_envelope():
    proc = run_mpi(2, "mailbox.py", timeout=60)
    assert proc.returncode == 0 and "OK mailbox" in proc.stdout, describe(proc)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_the_tcp_switch_puts_the_ranks_on_tcp_connections(monkeypatch):
    counts = {}
    for network in ("shared", "tcp"):
        monkeypatch.setenv("PSF_TEST_NETWORK", network)
        proc = run_mpi(2, "sockets.py", timeout=60)
        assert proc.returncode == 0, describe(proc)
        counts[network] = [int(c) for c in proc.stdout.split("tcp", 1)[1].split()]
    assert all(c >= 1 for c in counts["tcp"]), counts  # each rank talks to the other over a TCP socket
    assert sum(counts["tcp"]) > sum(counts["shared"]), counts


def test_a_bad_test_network_is_named(monkeypatch):
    monkeypatch.setenv("PSF_TEST_NETWORK", "infiniband")
    with pytest.raises(ValueError, match="PSF_TEST_NETWORK: got 'infiniband', expected one of shared, tcp"):
        run_mpi(2, "sockets.py")
