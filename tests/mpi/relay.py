"""Point-to-point packet relay among workers (5 ranks: server + 4 workers).

Checks: the relay flow (server sends packet j to worker j, workers forward and gather) round-trips
every packet bit for bit in several dtypes; with k < n a delayed worker is left out and drained
later; a later iteration meeting an earlier receive is kept for its own receive; an earlier
iteration meeting a later receive is dropped; has_message sees unclaimed messages.
"""

from __future__ import annotations

import time

import torch
from mpi4py import MPI

from psframework.comm import Envelope, Kind, Phase, Transport, gather_packets, setup_roles

DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.uint8]
SHAPE = (3, 5, 7)
DELAY = 1.0


def packet(worker: int, iteration: int, dtype: torch.dtype) -> torch.Tensor:
    """Return random bits viewed as dtype (NaN patterns included), the same on every rank."""
    g = torch.Generator().manual_seed(1000 * iteration + worker)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(torch.tensor(SHAPE).prod()) * itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(SHAPE)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    same_layout = a.dtype == b.dtype and a.shape == b.shape
    return same_layout and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def main() -> None:
    roles = setup_roles()
    world = Transport(roles.comm, timeout_s=30.0)
    n = len(roles.workers)
    assert roles.workers == (1, 2, 3, 4) and roles.is_server == (roles.rank == 0) != roles.is_worker
    if roles.is_worker:
        assert roles.workers_comm.Get_rank() == roles.worker_index == roles.rank - 1
        assert roles.workers_comm.Get_size() == n
    else:
        assert roles.workers_comm == MPI.COMM_NULL and roles.worker_index == -1
    down = lambda it: Envelope(Kind.COMMAND, it, layer=1, phase=Phase.FORWARD)  # noqa: E731
    relayed = lambda it: Envelope(Kind.PACKET, it, layer=1, phase=Phase.FORWARD)  # noqa: E731
    cases = [(it, dtype) for it, dtype in enumerate(DTYPES)]
    if roles.is_server:
        for it, dtype in cases + [(len(DTYPES), torch.float32)]:
            for w in roles.workers:
                world.isend(w, packet(w, it, dtype), down(it))
        acks = world.post_gather(roles.workers, Envelope(Kind.CONTROL, 99)).wait()
        assert sorted(acks.arrived) == list(roles.workers)
        world.drain(5.0)
        roles.comm.Barrier()
        print("OK relay", flush=True)
        world.close()
        roles.free()
        return

    peers = Transport(roles.workers_comm, timeout_s=30.0)
    me = peers.rank
    world_of = {p: p + 1 for p in range(n)}  # worker-communicator rank -> world rank

    # 1. relay: every packet round-trips exactly, all n gathered
    for it, dtype in cases:
        mine = world.recv(0, down(it))
        assert same_bits(mine, packet(roles.rank, it, dtype))
        ex = gather_packets(peers, mine, relayed(it))
        assert sorted(ex.received.arrived) == list(range(n)) and ex.received.arrived[0] == me
        for p, got in ex.received.data.items():
            assert same_bits(got, packet(world_of[p], it, dtype)), (it, dtype, p)

    # 2. first k of n among workers: the last worker forwards late; the others need k = 2 packets
    it = len(DTYPES)
    mine = world.recv(0, down(it))
    slow = n - 1
    if me == slow:
        time.sleep(DELAY)
    ex = gather_packets(peers, mine, relayed(it), k=n if me == slow else 2)
    if me == slow:
        assert sorted(ex.received.arrived) == list(range(n))
    else:
        assert len(ex.received.arrived) >= 2 and slow not in ex.received.first, ex.received.arrived
        assert slow in ex.received.late
        assert ex.received.wait_s < DELAY, ex.received.wait_s
    for p in ex.received.arrived:
        assert same_bits(ex.received.data[p], packet(world_of[p], it, torch.float32))

    # 3. iterations out of order between workers 0 and 1 of the worker communicator, on a transport
    # of their own (the relay above takes everything from its peers through mailboxes)
    relay_peers, peers = peers, Transport(roles.workers_comm, timeout_s=30.0)
    probe = Envelope(Kind.PACKET, 10, layer=7, phase=Phase.BACKWARD)
    if me == 1:
        peers.send(0, torch.tensor([11.0]), probe.with_iteration(11))  # iteration 10 skipped
        peers.send(0, torch.tensor([20.0]), probe.with_iteration(20))  # never received: stale
        peers.send(0, torch.tensor([21.0]), probe.with_iteration(21))
    if me == 0:
        gather = peers.post_gather([1], probe)
        try:
            gather.wait(1)
        except RuntimeError as error:
            assert "already sent a later iteration" in str(error), str(error)
        else:
            raise AssertionError("a later iteration was accepted for an earlier receive")
        assert peers.stats.future_kept == 1
        assert peers.has_message(1, Kind.PACKET, 7, Phase.BACKWARD)
        assert peers.recv(1, probe.with_iteration(11)).item() == 11.0
        assert peers.recv(1, probe.with_iteration(21)).item() == 21.0
        assert peers.stats.stale_discarded == 1, peers.stats
        assert not peers.has_message(1, Kind.PACKET, 7, Phase.BACKWARD)

    for transport in (relay_peers, peers):
        report = transport.drain(5.0)
        posted = transport.receives.pending()
        assert report.unfinished_sends == 0 and not posted, (report, posted)
    world.send(0, torch.tensor(1), Envelope(Kind.CONTROL, 99))
    world.drain(5.0)
    roles.comm.Barrier()
    peers.close()
    relay_peers.close()
    world.close()
    roles.free()


if __name__ == "__main__":
    main()
