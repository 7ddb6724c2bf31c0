"""Turning tensors into MPI byte buffers: zero copy, staging, device arrays (no MPI needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fakedevice
from fakedevice import FakeDeviceArray, InterfaceOnlyArray
from psframework.arrays import CUDA, HOST
from psframework.comm.buffers import (StagingPool, TensorInfo, copy_bytes_into, host_empty, recv_buffer,
                                      send_buffer, tensor_info)


@pytest.fixture
def host_copies(monkeypatch):
    """Count the fake backend's device copies (host memmoves: the fake device memory is host memory)."""
    calls = {"to_host": 0, "to_device": 0}
    monkeypatch.setattr(fakedevice, "COPIES", calls)
    return calls


def as_bytes(obj) -> bytes:
    return bytes(memoryview(np.ascontiguousarray(obj)).cast("B"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.uint8, torch.bool])
def test_cpu_tensors_are_sent_as_zero_copy_views(dtype):
    t = (torch.arange(24) % 5).to(dtype).reshape(2, 3, 4)
    wire = send_buffer(t, cuda_aware=False, pool=StagingPool())
    assert wire.info == tensor_info(t)
    assert wire.info.dtype == str(dtype).split(".")[-1] and wire.info.shape == (2, 3, 4)
    assert wire.info.nbytes == t.numel() * t.element_size() and wire.info.location == HOST
    view = np.asarray(wire.data)
    assert view.ctypes.data == t.data_ptr() and view.nbytes == wire.info.nbytes
    assert as_bytes(view) == bytes(t.reshape(-1).view(torch.uint8).numpy())


def test_strided_and_grad_tensors_are_sent_detached_and_contiguous():
    base = torch.arange(12.0).reshape(3, 4)
    wire = send_buffer(base.t(), cuda_aware=False, pool=StagingPool())
    assert wire.info.shape == (4, 3)
    assert np.array_equal(np.asarray(wire.data), base.t().numpy())
    leaf = torch.ones(3, requires_grad=True)
    wire = send_buffer(leaf, cuda_aware=False, pool=StagingPool())
    assert np.asarray(wire.data).ctypes.data == leaf.data_ptr()
    lazy = torch.tensor([1 + 2j, 3 - 4j]).conj()  # the conjugation is a bit on the tensor, not yet in memory
    wire = send_buffer(lazy, cuda_aware=False, pool=StagingPool())
    assert np.array_equal(np.asarray(wire.data), [1 - 2j, 3 + 4j])


def test_received_bytes_land_in_the_tensor():
    out = torch.zeros(2, 3, dtype=torch.bfloat16)
    wire = recv_buffer(out, cuda_aware=False, pool=StagingPool())
    src = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    np.asarray(wire.data).reshape(-1).view(np.uint8)[:] = src.reshape(-1).view(torch.uint8).numpy()
    wire.done(received=True)
    assert torch.equal(out, src)


def test_receive_buffers_must_be_contiguous_and_writable():
    with pytest.raises(ValueError, match="non-contiguous float32 \\(4, 3\\) tensor"):
        recv_buffer(torch.zeros(3, 4).t(), cuda_aware=False, pool=StagingPool())
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only float64 \\(4,\\) array"):
        recv_buffer(ro, cuda_aware=False, pool=StagingPool())
    with pytest.raises(ValueError, match="non-contiguous float32 \\(4, 2\\) device array"):
        recv_buffer(FakeDeviceArray(np.zeros((4, 4), np.float32)[:, :2]), cuda_aware=True, pool=StagingPool())


def test_numpy_arrays_go_as_they_are():
    a = np.arange(10, dtype=np.int32)
    assert send_buffer(a, False, StagingPool()).data is a
    strided = np.arange(20, dtype=np.float64)[::2]
    wire = send_buffer(strided, False, StagingPool())
    assert wire.data.flags.c_contiguous and np.array_equal(wire.data, strided)


def test_unsupported_objects_and_dtypes_are_rejected():
    with pytest.raises(ValueError, match="array exposing __cuda_array_interface__, got list"):
        tensor_info([1, 2, 3])
    with pytest.raises(ValueError, match="buffer dtype: got"):
        tensor_info(np.zeros(2, dtype="datetime64[s]"))


def test_device_arrays_go_to_a_cuda_aware_mpi_as_they_are():
    fake = FakeDeviceArray(np.arange(12, dtype=np.float32).reshape(3, 4))
    info = tensor_info(fake)
    assert (info.dtype, info.shape, info.nbytes, info.location) == ("float32", (3, 4), 48, CUDA)
    assert send_buffer(fake, cuda_aware=True, pool=StagingPool()).data is fake
    assert recv_buffer(fake, cuda_aware=True, pool=StagingPool()).data is fake
    with pytest.raises(ValueError, match="non-contiguous"):
        send_buffer(FakeDeviceArray(np.zeros((4, 4), np.float32)[:, :2]), cuda_aware=True, pool=StagingPool())


def test_any_array_exposing_the_cuda_array_interface_is_a_device_buffer():
    bare = InterfaceOnlyArray(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert tensor_info(bare) == TensorInfo("int16", (2, 3), 12, CUDA)
    assert send_buffer(bare, cuda_aware=True, pool=StagingPool()).data is bare
    assert recv_buffer(bare, cuda_aware=True, pool=StagingPool()).data is bare
    with pytest.raises(ValueError, match="read-only int16 \\(2, 3\\) device array"):
        recv_buffer(InterfaceOnlyArray(bare.host, readonly=True), cuda_aware=True, pool=StagingPool())


def test_device_arrays_are_staged_through_host_memory_otherwise(host_copies):
    pool = StagingPool()
    fake = FakeDeviceArray(np.arange(12, dtype=np.float32).reshape(3, 4))
    wire = send_buffer(fake, cuda_aware=False, pool=pool)
    assert host_copies["to_host"] == 1
    assert isinstance(wire.data, np.ndarray) and wire.data.ctypes.data != fake.host.ctypes.data
    assert as_bytes(wire.data) == as_bytes(fake.host)
    staging = wire.data
    wire.done(received=False)
    assert pool.take(48) is staging  # given back and reused

    out = FakeDeviceArray(np.zeros((3, 4), np.float32))
    wire = recv_buffer(out, cuda_aware=False, pool=pool)
    wire.data[:] = np.frombuffer(as_bytes(fake.host), np.uint8)
    assert not out.host.any()  # nothing reaches the device before the receive is finished
    wire.done(received=True)
    assert host_copies["to_device"] == 1 and np.array_equal(out.host, fake.host)


def test_kept_bytes_are_copied_into_any_buffer(host_copies):
    src = np.arange(6, dtype=np.float32)
    payload = np.frombuffer(src.tobytes(), np.uint8).copy()
    for out in (torch.zeros(2, 3), np.zeros((3, 2), np.float32), torch.zeros(3, 2).t(), np.zeros((2, 3), np.float32).T):
        copy_bytes_into(out, payload)  # strided buffers too: each value lands where it belongs
        assert np.array_equal(np.asarray(out).reshape(-1), src)
    fake = FakeDeviceArray(np.zeros(6, np.float32))
    copy_bytes_into(fake, payload)
    assert np.array_equal(fake.host, src) and host_copies["to_device"] == 1
    with pytest.raises(ValueError, match="got 24 bytes, expected 16"):
        copy_bytes_into(torch.zeros(4), payload)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "complex64"])
def test_host_empty_gives_numpy_backed_tensors(dtype):
    t = host_empty((3, 5), dtype)
    assert t.dtype == getattr(torch, dtype) and t.shape == (3, 5) and t.is_contiguous()
    t.zero_()
    assert torch.count_nonzero(t).item() == 0
    assert host_empty((0, 4), dtype).numel() == 0


def test_host_empty_rejects_unknown_dtypes():
    with pytest.raises(ValueError, match="dtype: got 'float8'"):
        host_empty((2,), "float8")
