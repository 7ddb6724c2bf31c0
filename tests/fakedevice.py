"""A fake CUDA array over host memory: exercises the device paths of the codes and of the MPI buffers.

Importing this module registers its backend with `psframework.arrays`, so fake arrays are device
arrays to every part of the project: the codes decode them through backend calls (no host views),
and the buffers hand them to a CUDA-aware MPI as they are or stage them through host copies.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, Sequence

import numpy as np

from psframework.arrays import register_backend
from psframework.arrays.cuda_backends import InterfaceBackend
from psframework.arrays.numpy_backend import NumpyBackend

COPIES: Dict[str, int] = {"to_host": 0, "to_device": 0}  # device copies made so far, by direction


class FakeDeviceArray:
    """Host memory dressed as a CUDA array (interface version 3, no stream to synchronise).

    With MPICH on a CPU the pointer really is host memory, so handing it to MPI exercises the
    CUDA-aware path, and the backend's device copies, plain memmoves, the staging path.
    """

    def __init__(self, host: np.ndarray) -> None:
        self.host = host

    @property
    def __cuda_array_interface__(self) -> dict:
        h = self.host
        return {"shape": h.shape, "typestr": h.dtype.str, "data": (h.ctypes.data, False),
                "strides": None if h.flags.c_contiguous else h.strides, "version": 3, "stream": None}

    @property
    def shape(self) -> tuple:
        return self.host.shape

    @property
    def dtype(self) -> np.dtype:
        return self.host.dtype

    def __getitem__(self, index: Any) -> "FakeDeviceArray":
        return FakeDeviceArray(self.host[index])

    def reshape(self, *shape: Any) -> "FakeDeviceArray":
        return FakeDeviceArray(self.host.reshape(*shape))


class InterfaceOnlyArray:
    """An object exposing nothing but the CUDA array interface, as the arrays of other libraries may."""

    def __init__(self, host: np.ndarray, readonly: bool = False) -> None:
        self.host = host
        self.__cuda_array_interface__ = dict(FakeDeviceArray(host).__cuda_array_interface__,
                                             data=(host.ctypes.data, readonly))


def _host(x: Any) -> Any:
    return x.host if isinstance(x, FakeDeviceArray) else x


def _on_host(name: str) -> Callable[..., Any]:
    """Return a backend method running NumPy's `name` on the host memory of fake arrays."""
    method = getattr(NumpyBackend, name)

    def call(self: "FakeDeviceBackend", *args: Any, **kwargs: Any) -> Any:
        result = method(self, *(_host(a) for a in args), **{k: _host(v) for k, v in kwargs.items()})
        return FakeDeviceArray(result) if isinstance(result, np.ndarray) else result

    return call


class FakeDeviceBackend(InterfaceBackend):
    """Facts from the CUDA array interface (as for any device array), arithmetic and copies on the host."""

    name = "fake device"
    arithmetic = True

    def owns(self, x: Any) -> bool:
        return isinstance(x, FakeDeviceArray)

    def device(self, x: Any) -> Any:
        return ("cuda", 0)

    check_dtype = _on_host("check_dtype")
    is_floating = _on_host("is_floating")
    empty = _on_host("empty")
    zeros = _on_host("zeros")
    sub = _on_host("sub")
    isub = _on_host("isub")
    iadd = _on_host("iadd")
    sum_into = _on_host("sum_into")
    neg = _on_host("neg")
    copy = _on_host("copy")
    fill_zero = _on_host("fill_zero")

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        return FakeDeviceArray(np.concatenate([a.host for a in arrays], axis=axis))

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.host.copy()

    def to_host(self, src: Any, host: np.ndarray) -> None:
        COPIES["to_host"] += 1
        ctypes.memmove(host.ctypes.data, src.host.ctypes.data, host.nbytes)

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        COPIES["to_device"] += 1
        ctypes.memmove(dst.host.ctypes.data, host.ctypes.data, host.nbytes)


register_backend(FakeDeviceArray, FakeDeviceBackend())


class SlowCopyArray(FakeDeviceArray):
    """A fake device array whose copies to the host land only after a few queries, as on a side stream."""


class PendingCopy:
    """A device-to-host copy in flight: the bytes land when query() has been asked `after` times."""

    def __init__(self, src: np.ndarray, host: np.ndarray, after: int) -> None:
        self.src, self.host, self.left = src, host, after

    def query(self) -> bool:
        self.left -= 1
        if self.left <= 0:
            self.synchronize()
        return self.left <= 0

    def synchronize(self) -> None:
        if self.src is not None:
            ctypes.memmove(self.host.ctypes.data, self.src.ctypes.data, self.host.nbytes)
            self.src = None
        self.left = 0


class SlowCopyBackend(FakeDeviceBackend):
    """The fake device's backend, with copies to the host that complete later (`to_host_async`)."""

    name = "slow-copy fake device"
    queries = 3

    def owns(self, x: Any) -> bool:
        return isinstance(x, SlowCopyArray)

    def to_host_async(self, src: Any, host: np.ndarray) -> Any:
        COPIES["to_host"] += 1
        return PendingCopy(src.host, host, self.queries)


register_backend(SlowCopyArray, SlowCopyBackend())
