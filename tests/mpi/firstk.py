"""First-k-of-n receives under MPI (4 ranks: server + 3 workers).

Checks: the fastest k are returned when a worker is delayed; a late reply of round t is never
returned for round t+1 (whether it reaches the next round's receive or is drained before); a
silent worker becomes a WatchdogTimeout naming it; arrival order is reported; per-worker
buffers are reused across rounds safely, also over random rounds (random k, delays and silent
workers). Any failed check raises, which aborts the job.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from psframework.comm import Envelope, Kind, Phase, Transport, WatchdogTimeout, setup_roles

DELAY = 1.0
SIZE = 4096  # float32 elements per reply

# Each round: replies needed (k), worker delays, silent workers, watchdog timeout, idle time after.
ROUNDS = [
    dict(k=3),
    dict(k=2, delay={1: DELAY}),
    dict(k=3),  # posted while worker 1 still sleeps: its round-1 reply meets this round's receive
    dict(k=2, delay={1: DELAY}, idle=2 * DELAY),  # here the late reply is drained before round 4
    dict(k=3),
    dict(k=3, silent={3}, timeout=1.0),  # worker 3 never answers: the watchdog must name it
    dict(k=3),
    dict(k=2, silent={3}),
    dict(k=3),
    dict(k=3, delay={2: 0.4, 3: 0.8}),  # arrival order 1, 2, 3
]


def random_rounds(count: int = 40) -> list:
    """Return rounds with random k, small random delays and sometimes a silent worker (same on all ranks)."""
    rng = np.random.default_rng(0)
    rounds = []
    for _ in range(count):
        k = int(rng.integers(1, 4))
        silent = {int(rng.integers(1, 4))} if k <= 2 and rng.random() < 0.3 else set()
        rounds.append(dict(k=k, delay={w: float(rng.uniform(0.0, 0.02)) for w in (1, 2, 3)}, silent=silent))
    return rounds


RANDOM_ROUNDS = random_rounds()
RANDOM_START = 1000  # iterations of the random rounds; layer 4 keeps them apart from the rounds above


def reply(rank: int, iteration: int) -> torch.Tensor:
    return torch.arange(SIZE, dtype=torch.float32) + 1000.0 * rank + iteration


def command(iteration: int, layer: int = 3) -> Envelope:
    return Envelope(Kind.COMMAND, iteration, layer=layer, phase=Phase.FORWARD)


def answer(iteration: int, layer: int = 3) -> Envelope:
    return Envelope(Kind.REPLY, iteration, layer=layer, phase=Phase.FORWARD)


def run_worker(t: Transport, rank: int) -> None:
    for it, spec in enumerate(ROUNDS):
        x = t.recv(0, command(it))
        assert x.dtype == torch.int64 and int(x.item()) == it, (rank, it, x)
        if rank in spec.get("silent", ()):
            continue
        time.sleep(spec.get("delay", {}).get(rank, 0.0))
        t.send(0, reply(rank, it), answer(it))
    for i, spec in enumerate(RANDOM_ROUNDS):
        it = RANDOM_START + i
        x = t.recv(0, command(it, 4))
        assert int(x.item()) == it, (rank, it, x)
        if rank in spec["silent"]:
            continue
        time.sleep(spec["delay"][rank])
        t.isend(0, reply(rank, it), answer(it, 4))  # not waited for: the next command may come first


def run_random_rounds(t: Transport, workers: list) -> None:
    """Random k, delays and silent workers: every reply taken must be that round's, in the reused buffers."""
    buffers = {w: torch.empty(SIZE, dtype=torch.float32) for w in workers}
    for i, spec in enumerate(RANDOM_ROUNDS):
        it = RANDOM_START + i
        gather = t.post_gather(workers, answer(it, 4), buffers)
        for w in workers:
            t.isend(w, torch.tensor(it), command(it, 4))
        result = gather.wait(spec["k"])
        assert not set(result.arrived) & spec["silent"], (it, result.arrived, spec)
        for w in result.arrived:
            assert torch.equal(result.data[w], reply(w, it)), (it, w, result.data[w][:2], reply(w, it)[:2])
    print(f"random rounds: {len(RANDOM_ROUNDS)} passed, stats {t.stats}", flush=True)


def run_server(t: Transport, workers: list) -> None:
    buffers = {w: torch.empty(SIZE, dtype=torch.float32) for w in workers}
    for it, spec in enumerate(ROUNDS):
        gather = t.post_gather(workers, answer(it), buffers)  # receives posted before the commands
        for w in workers:
            t.isend(w, torch.tensor(it), command(it))
        slow = set(spec.get("delay", {})) | set(spec.get("silent", ()))
        if "timeout" in spec:
            try:
                gather.wait(spec["k"], timeout_s=spec["timeout"])
            except WatchdogTimeout as error:
                assert error.ranks == sorted(spec["silent"]), error.ranks
                assert isinstance(error, RuntimeError)
                assert "rank(s) 3" in str(error) and "REPLY iteration 5" in str(error), str(error)
                assert sorted(error.arrived) == [1, 2], error.arrived
                print(f"round {it}: watchdog: {error}", flush=True)
                continue
            raise AssertionError(f"round {it}: a silent worker did not trip the watchdog")
        result = gather.wait(spec["k"])
        assert len(result.arrived) >= spec["k"], result
        fast = [w for w in workers if w not in slow]
        if spec["k"] <= len(fast):
            assert set(result.first) <= set(fast), (it, result.arrived, slow)
        for w in result.arrived:
            assert torch.equal(result.data[w], reply(w, it)), (it, w, result.data[w][:3])
            assert result.data[w] is buffers[w]
        if spec.get("delay") and spec["k"] <= len(fast):
            assert result.wait_s < min(spec["delay"].values()), (it, result.wait_s)
            assert set(result.late) == set(spec["delay"]), (it, result.late)
        if it == 2:
            assert t.stats.stale_discarded == 1, t.stats  # worker 1's round-1 reply, refused by its header
        if it == 4:
            assert t.stats.late_drained >= 1 and t.stats.stale_discarded == 1, t.stats
        if it == 9:
            assert result.arrived == [1, 2, 3], result.arrived
        print(f"round {it}: k={spec['k']} arrived {result.arrived} waited {result.wait_s:.3f} s", flush=True)
        idle = spec.get("idle", 0.0)
        end = time.monotonic() + idle
        while time.monotonic() < end:  # the server busy elsewhere: late replies drain in the background
            t.progress()
            time.sleep(0.01)


def main() -> None:
    roles = setup_roles()
    t = Transport(roles.comm, cuda_aware="false", timeout_s=30.0)
    if roles.is_server:
        run_server(t, list(roles.workers))
        run_random_rounds(t, list(roles.workers))
    else:
        run_worker(t, roles.rank)
    report = t.drain(timeout_s=5.0)
    roles.comm.Barrier()
    if roles.is_server:
        print(f"stats {t.stats}", flush=True)
        print(f"drain {report}", flush=True)
        assert report.unfinished_sends == 0, report
        print("OK firstk", flush=True)
    t.close()
    roles.free()


if __name__ == "__main__":
    main()
