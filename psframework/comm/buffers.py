"""Turn arrays into the contiguous byte buffers MPI sends and receives.

Every fact about an array (dtype, shape, bytes, location, contiguity, host views, stream
synchronisation, device copies) comes from its backend in `psframework.arrays`; this module decides
only how the bytes travel. Host arrays travel as zero-copy NumPy views. Device arrays go to MPI
directly when the MPI library is CUDA-aware, after the producing stream is synchronised (mpi4py does
not synchronise streams); otherwise they are staged through pinned host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from psframework.arrays import HOST, ArrayInfo, Backend, allocate, array_info, backend_of, host_empty

from .envelope import DTYPE_CODES

__all__ = ["StagingPool", "TensorInfo", "WireBuffer", "allocate", "copy_bytes_into", "host_empty", "recv_buffer",
           "send_buffer", "tensor_info"]

TensorInfo = ArrayInfo  # the transport's name for the facts of one message's array


@dataclass
class WireBuffer:
    """The bytes of one tensor, ready to hand to MPI as ``[data, MPI.BYTE]``."""

    data: Any
    info: TensorInfo
    finish: Optional[Callable[[], None]] = None  # after a staged receive: copy host bytes to the device
    release: Optional[Callable[[], None]] = None  # give staging memory back once MPI is done with it
    keep: Any = None  # objects that must outlive the MPI operation
    pending: Any = None  # a staged send's device-to-host copy still in flight (query(), synchronize())

    def ready(self) -> bool:
        """Return whether the bytes are in place for MPI (a staged send's copy has completed)."""
        if self.pending is not None and self.pending.query():
            self.pending = None
        return self.pending is None

    def done(self, received: bool) -> None:
        """Finish a receive (copy staged bytes home) and release staging memory."""
        if self.pending is not None:  # a send dropped while its copy was in flight: let the copy end first
            self.pending.synchronize()
            self.pending = None
        if received and self.finish is not None:
            self.finish()
        if self.release is not None:
            self.release()
            self.release = None


def tensor_info(obj: Any) -> TensorInfo:
    """Return the facts of array `obj`; raise ValueError unless its dtype can travel in a message."""
    info = array_info(obj)
    if info.dtype not in DTYPE_CODES:
        raise ValueError(f"buffer dtype: got {info.dtype}, expected one of {', '.join(DTYPE_CODES)}")
    return info


def _pinned_empty(nbytes: int) -> np.ndarray:
    """Return page-locked host memory when a GPU runtime is present, plain memory otherwise."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    try:
        import cupyx

        return cupyx.empty_pinned(nbytes, dtype=np.uint8)
    except ImportError:
        return np.empty(nbytes, dtype=np.uint8)


class StagingPool:
    """Reusable pinned host buffers for staging device data through a non-CUDA-aware MPI."""

    def __init__(self, keep_per_size: int = 4) -> None:
        self.keep_per_size = keep_per_size
        self._free: Dict[int, List[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray:
        """Return a host byte buffer of exactly `nbytes` bytes."""
        free = self._free.get(nbytes)
        return free.pop() if free else _pinned_empty(nbytes)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer taken from this pool."""
        free = self._free.setdefault(buf.nbytes, [])
        if len(free) < self.keep_per_size:
            free.append(buf)


def _wire(backend: Backend, array: Any, info: TensorInfo, cuda_aware: bool, pool: StagingPool,
          for_send: bool) -> WireBuffer:
    """Return the wire bytes of contiguous, detached `array`, staged when it is on a device MPI cannot read.

    A staged send's copy to host memory may still be in flight (`WireBuffer.pending`): the transport
    posts the message once it has completed, so the copy overlaps with the work that follows.
    """
    if info.location == HOST:
        return WireBuffer(backend.host_view(array), info, keep=array)
    if for_send and not cuda_aware:
        host = pool.take(info.nbytes)
        pending = backend.to_host_async(array, host)
        return WireBuffer(host, info, release=partial(pool.give, host), keep=array, pending=pending)
    # sends: the data must be complete; receives: no kernel may still use the memory MPI overwrites
    backend.synchronize(array)
    if cuda_aware:
        return WireBuffer(backend.device_view(array), info, keep=array)
    host = pool.take(info.nbytes)
    finish = partial(backend.from_host, host, array)
    return WireBuffer(host, info, finish=finish, release=partial(pool.give, host), keep=array)


def send_buffer(obj: Any, cuda_aware: bool, pool: StagingPool, info: Optional[TensorInfo] = None) -> WireBuffer:
    """Return the wire bytes of `obj` for sending: detached, contiguous, synchronised."""
    backend = backend_of(obj)
    info = tensor_info(obj) if info is None else info
    array = backend.ascontiguous(backend.prepare(obj))  # a strided array costs the one copy MPI cannot avoid
    return _wire(backend, array, info, cuda_aware, pool, for_send=True)


def recv_buffer(obj: Any, cuda_aware: bool, pool: StagingPool, info: Optional[TensorInfo] = None) -> WireBuffer:
    """Return wire bytes that land in `obj` when received (staged when MPI is not CUDA-aware)."""
    backend = backend_of(obj)
    info = tensor_info(obj) if info is None else info
    array = backend.prepare(obj)
    if not backend.is_contiguous(array):
        raise ValueError(f"receive buffer: got a non-contiguous {info.describe()} {backend.noun}, "
                         "expected a C-contiguous one")
    if not backend.is_writable(array):
        raise ValueError(f"receive buffer: got a read-only {info.describe()} {backend.noun}, expected a writable one")
    return _wire(backend, array, info, cuda_aware, pool, for_send=False)


def copy_bytes_into(out: Any, payload: np.ndarray) -> None:
    """Copy host bytes (a message kept aside earlier) into a receive buffer."""
    info = tensor_info(out)
    if payload.nbytes != info.nbytes:
        raise ValueError(f"payload: got {payload.nbytes} bytes, expected {info.nbytes} for {info.describe()}")
    backend = backend_of(out)
    backend.synchronize(out)  # no kernel may still be using the memory about to be overwritten
    backend.from_host(payload, out)
