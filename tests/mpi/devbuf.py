"""Buffer paths under MPI (3 ranks): fake device arrays, torch and NumPy dtypes, mismatches, hooks.

The fake device array exposes __cuda_array_interface__ over host memory. With MPICH on a CPU the
pointer really is host memory, so it exercises the CUDA-aware path (the array handed to MPI as is)
and, its backend's device copies being host copies, the staging path through host buffers.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from psframework.comm import Envelope, Kind, MessageMismatch, Phase, Transport, detect_cuda_aware, setup_roles
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fakedevice import COPIES, FakeDeviceArray, SlowCopyArray  # noqa: E402


def env(it: int, layer: int = 0) -> Envelope:
    return Envelope(Kind.PARAMS, it, layer=layer, phase=Phase.UPDATE)


def check_fake_device(t: Transport, rank: int, it: int) -> None:
    data = np.arange(6 * 7, dtype=np.float32).reshape(6, 7) * (it + 1)
    if rank == 0:
        t.send(1, FakeDeviceArray(data.copy()), env(it))
        back = FakeDeviceArray(np.zeros((6, 7), np.float32))
        t.recv(1, env(it, 1), out=back)
        assert np.array_equal(back.host, data * 2), back.host
    elif rank == 1:
        got = FakeDeviceArray(np.full((6, 7), -1.0, np.float32))
        t.recv(0, env(it), out=got)
        assert np.array_equal(got.host, data), got.host
        t.send(0, FakeDeviceArray(got.host * 2), env(it, 1))


def check_copies_in_flight(t: Transport, rank: int) -> None:
    """A staged send whose copy to the host is still in flight is posted once the copy has completed."""
    data = np.arange(5 * 3, dtype=np.float32).reshape(5, 3) + 0.5
    if rank == 0:
        first = t.isend(1, SlowCopyArray(data.copy()), env(20))
        second = t.isend(1, np.full(4, 7.0, np.float32), env(21))  # ready at once, but it must not overtake
        assert first.requests is None and second.requests is None, "posted before the copy completed"
        first.wait()
        second.wait()
    elif rank == 1:
        got = t.recv(0, env(20))
        assert np.array_equal(got.numpy(), data), got
        assert np.array_equal(t.recv(0, env(21)).numpy(), np.full(4, 7.0, np.float32))


def check_dtypes(t: Transport, rank: int) -> None:
    g = torch.Generator().manual_seed(7)  # the same cases on every rank
    cases = [torch.randn(4, 5, generator=g), torch.randn(3, 2, dtype=torch.float64, generator=g),
             torch.randn(8, generator=g).to(torch.bfloat16), torch.arange(10, dtype=torch.int64),
             torch.tensor([True, False, True]), torch.tensor(3.5), torch.empty(0, 4),
             torch.randn(5, 6, generator=g).t(),  # not contiguous: sent through one copy
             torch.randn(2, 2, generator=g).requires_grad_()]  # sent detached
    arrays = [np.arange(12, dtype=np.int32).reshape(3, 4), np.linspace(0, 1, 9, dtype=np.float16)]
    if rank == 0:
        for i, c in enumerate(cases + arrays):
            t.send(2, c, env(100 + i))
    elif rank == 2:
        for i, c in enumerate(cases):
            got = t.recv(0, env(100 + i))  # no buffer given: a tensor shaped as sent
            assert got.dtype == c.dtype and got.shape == c.shape and got.is_contiguous(), (i, got.dtype, got.shape)
            assert torch.equal(got, c.detach()), (i, got, c)
        for j, a in enumerate(arrays):
            out = np.empty_like(a)
            t.recv(0, env(100 + len(cases) + j), out=out)
            assert np.array_equal(out, a), (j, out)


def check_mismatch(t: Transport, rank: int) -> None:
    if rank == 0:
        t.send(1, torch.ones(3, 2), env(200))
        t.send(1, torch.ones(2, 3, dtype=torch.float64), env(201))
        t.send(1, torch.full((2, 3), 5.0), env(202))
    elif rank == 1:
        for it, expected in ((200, "expected float32 (2, 3), got float32 (3, 2)"),
                             (201, "expected float32 (2, 3), got float64 (2, 3)")):
            try:
                t.recv(0, env(it), out=torch.empty(2, 3))
            except MessageMismatch as error:
                assert isinstance(error, ValueError)
                assert expected in str(error) and "from rank 0" in str(error), str(error)
            else:
                raise AssertionError(f"iteration {it}: a mismatched message was accepted")
        got = t.recv(0, env(202), out=torch.empty(2, 3))  # the stream is still in step
        assert torch.equal(got, torch.full((2, 3), 5.0))


def main() -> None:
    roles = setup_roles()
    rank = roles.rank
    awareness = detect_cuda_aware(roles.comm)
    assert awareness.aware is False and awareness.method, awareness  # MPICH built without CUDA here
    seen = []
    aware = Transport(roles.comm, cuda_aware="true", timeout_s=30.0,
                      send_hook=lambda dest, e, nbytes: seen.append((dest, e.iteration, nbytes)))
    assert aware.cuda_aware and aware.cuda_aware_method == "set to true"
    check_fake_device(aware, rank, 0)
    if rank == 0:
        assert seen == [(1, 0, 6 * 7 * 4)], seen
    if rank == 1:
        try:
            aware.isend(0, FakeDeviceArray(np.zeros((4, 4), np.float32)[:, :2]), env(9))
        except ValueError as error:
            assert "non-contiguous" in str(error), str(error)
        else:
            raise AssertionError("a strided device array was sent")

    staged = Transport(roles.comm, cuda_aware="false", timeout_s=30.0)
    assert not staged.cuda_aware
    check_fake_device(staged, rank, 1)
    if rank in (0, 1):  # one staged send and one staged receive on each side, none on the CUDA-aware path
        assert COPIES == {"to_host": 1, "to_device": 1}, COPIES
    check_copies_in_flight(staged, rank)
    check_dtypes(staged, rank)
    check_mismatch(staged, rank)
    for t in (aware, staged):
        report = t.drain(5.0)
        assert report.unfinished_sends == 0 and report.cancelled == 0, report
    roles.comm.Barrier()
    if rank == 0:
        print(f"cuda-aware detection: {awareness.method}", flush=True)
        print("OK devbuf", flush=True)
    aware.close()
    staged.close()
    roles.free()


if __name__ == "__main__":
    main()
