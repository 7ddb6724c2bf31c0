"""The backends of arrays in CUDA device memory: CuPy arrays and any CUDA array interface object."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

import numpy as np

from psframework.arrays.backend import CUDA, ArrayInfo, Backend
from psframework.arrays.numpy_backend import NumpyBackend


def _interface_stream_sync(x: Any) -> None:
    """Wait for the stream named in the CUDA array interface of `x` (mpi4py does not)."""
    stream = x.__cuda_array_interface__.get("stream")
    if stream is None:  # the producer promises the data is ready (interface v2, or no stream)
        return
    try:
        import cupy

        cupy.cuda.ExternalStream(stream).synchronize()
    except ImportError:
        import torch

        torch.cuda.ExternalStream(stream).synchronize()


def _cupy_bytes(x: Any) -> Any:
    """Return a flat uint8 CuPy view of contiguous device array `x` (CuPy wraps any interface array)."""
    import cupy

    return cupy.asarray(x).reshape(-1).view(cupy.uint8)


class CudaMemoryBackend(Backend):
    """Arrays in CUDA device memory: stream synchronisation and copies through CuPy, no host views."""

    def host_view(self, x: Any) -> np.ndarray:
        raise ValueError(f"host view: got a {self.noun} in device memory, expected one in host memory")

    def synchronize(self, x: Any) -> None:
        _interface_stream_sync(x)

    def to_host(self, src: Any, host: np.ndarray) -> None:
        _cupy_bytes(src).get(out=host)

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        _cupy_bytes(dst).set(host)


class InterfaceBackend(CudaMemoryBackend):
    """Any other object exposing ``__cuda_array_interface__``: facts and copies only, no arithmetic."""

    name = "CUDA array interface"
    noun = "device array"
    arithmetic = False

    def owns(self, x: Any) -> bool:
        return hasattr(x, "__cuda_array_interface__")

    def info(self, x: Any) -> ArrayInfo:
        cai = x.__cuda_array_interface__
        dtype = np.dtype(cai["typestr"])
        shape = tuple(int(s) for s in cai["shape"])
        return ArrayInfo(dtype.name, shape, math.prod(shape) * dtype.itemsize, CUDA)

    def is_contiguous(self, x: Any) -> bool:
        cai = x.__cuda_array_interface__
        strides = cai.get("strides")
        if strides is None:
            return True
        shape = [int(s) for s in cai["shape"]]
        step = np.dtype(cai["typestr"]).itemsize
        for size, stride in zip(reversed(shape), reversed(strides)):
            if size != 1 and stride != step:
                return False
            step *= size
        return True

    def is_writable(self, x: Any) -> bool:
        return not x.__cuda_array_interface__["data"][1]

    def ascontiguous(self, x: Any) -> Any:
        if not self.is_contiguous(x):
            raise ValueError(f"device array: got a non-contiguous {self.info(x).describe()} one, expected a "
                             "C-contiguous one")
        return x


class CupyBackend(CudaMemoryBackend, NumpyBackend):
    """CuPy arrays on a CUDA device; same ufunc interface as NumPy."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def owns(self, x: Any) -> bool:
        return isinstance(x, self.cupy.ndarray)

    def info(self, x: Any) -> ArrayInfo:
        return ArrayInfo(x.dtype.name, tuple(x.shape), int(x.nbytes), CUDA)

    def is_writable(self, x: Any) -> bool:
        return True

    def ascontiguous(self, x: Any) -> Any:
        return self.cupy.ascontiguousarray(x)

    def device(self, x: Any) -> Any:
        return ("cuda", x.device.id)

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        with like.device:
            return self.cupy.empty(tuple(shape), dtype=like.dtype)

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        with like.device:
            return self.cupy.zeros(tuple(shape), dtype=like.dtype)

    def sub(self, out: Any, a: Any, b: Any) -> None:
        self.cupy.subtract(a, b, out=out)

    def isub(self, out: Any, b: Any) -> None:
        self.cupy.subtract(out, b, out=out)

    def iadd(self, out: Any, b: Any) -> None:
        self.cupy.add(out, b, out=out)

    def sum_into(self, out: Any, a: Any, axis: int) -> None:
        self.cupy.add.reduce(a, axis=axis, dtype=a.dtype, out=out)

    def neg(self, out: Any, a: Any) -> None:
        self.cupy.negative(a, out=out)

    def host_views(self, arrays: Sequence[Any]) -> Optional[List[np.ndarray]]:
        return None  # device memory: the calls run on the device's stream

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        return self.cupy.concatenate(list(arrays), axis=axis)

    def combine(self, matrix: np.ndarray, arrays: Sequence[Any]) -> List[Any]:
        cupy = self.cupy
        with arrays[0].device:
            stacked = cupy.stack(list(arrays))
            flat = stacked.reshape(len(arrays), -1)
            coeffs = cupy.asarray(matrix, dtype=stacked.dtype)
            result = cupy.matmul(coeffs, flat).reshape((matrix.shape[0],) + stacked.shape[1:])
        return [result[i] for i in range(matrix.shape[0])]
