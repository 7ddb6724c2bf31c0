"""Array namespace layer: one interface over NumPy, torch (CPU/CUDA) and CuPy arrays.

The codes never convert between backends: every operation runs on the backend and device of its
inputs. torch is imported only when a torch tensor is seen, CuPy only when a CuPy array is seen.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

Index = Tuple[slice, ...]


def axis_index(axis: int, start: int, stop: int) -> Index:
    """Return the index tuple that selects elements start..stop-1 along `axis`."""
    return (slice(None),) * axis + (slice(start, stop),)


class Backend:
    """Operations the codes need, for one array library."""

    name = "abstract"

    def owns(self, x: Any) -> bool:
        """Return whether `x` is an array of this backend."""
        raise NotImplementedError

    def device(self, x: Any) -> Any:
        """Return a comparable description of the device that holds `x`."""
        raise NotImplementedError

    def check_dtype(self, dtype: Any) -> None:
        """Raise ValueError unless the codes can add and subtract arrays of `dtype`."""
        raise NotImplementedError

    def is_floating(self, dtype: Any) -> bool:
        """Return whether `dtype` is a real or complex floating type."""
        raise NotImplementedError

    def prepare(self, x: Any) -> Any:
        """Return `x` ready for out-of-place arithmetic (no autograd history)."""
        return x

    def is_contiguous(self, x: Any) -> bool:
        """Return whether `x` is C-contiguous."""
        return bool(x.flags.c_contiguous)

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        """Return an uninitialised array of `shape` with the dtype and device of `like`."""
        raise NotImplementedError

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        """Return a zero array of `shape` with the dtype and device of `like`."""
        raise NotImplementedError

    def sub(self, out: Any, a: Any, b: Any) -> None:
        """Store a - b into `out`."""
        raise NotImplementedError

    def isub(self, out: Any, b: Any) -> None:
        """Subtract `b` from `out` in place."""
        raise NotImplementedError

    def iadd(self, out: Any, b: Any) -> None:
        """Add `b` to `out` in place."""
        raise NotImplementedError

    def sum_into(self, out: Any, a: Any, axis: int) -> None:
        """Store the sum of `a` over `axis` into `out`, in the dtype of `a` (integers wrap around)."""
        raise NotImplementedError

    def neg(self, out: Any, a: Any) -> None:
        """Store -a (0 - a, wrapping around for integers) into `out`."""
        raise NotImplementedError

    def host_views(self, arrays: Sequence[Any]) -> Optional[List[np.ndarray]]:
        """Return NumPy arrays sharing the memory of `arrays`, or None when they are not all in host memory."""
        return None

    def copy(self, out: Any, a: Any) -> None:
        """Copy `a` into `out`."""
        out[...] = a

    def fill_zero(self, out: Any) -> None:
        """Set every element of `out` to zero."""
        out[...] = 0

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        """Join arrays along `axis` into a new array."""
        raise NotImplementedError

    def combine(self, matrix: np.ndarray, arrays: Sequence[Any]) -> List[Any]:
        """Return the linear combinations sum_j matrix[i, j] * arrays[j], one per row of `matrix`."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        """Return a NumPy copy of `x` (for measurements and tests, never on the decode path)."""
        raise NotImplementedError


class NumpyBackend(Backend):
    """NumPy arrays; unsigned and signed integers wrap around."""

    name = "numpy"

    def owns(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def device(self, x: Any) -> Any:
        return "cpu"

    def check_dtype(self, dtype: Any) -> None:
        kind = np.dtype(dtype).kind
        if kind not in "iufc":
            raise ValueError(f"dtype {np.dtype(dtype)} is not supported: expected an integer, floating or "
                             "complex dtype")

    def is_floating(self, dtype: Any) -> bool:
        return np.dtype(dtype).kind in "fc"

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        return np.empty(tuple(shape), dtype=like.dtype)

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        return np.zeros(tuple(shape), dtype=like.dtype)

    def sub(self, out: Any, a: Any, b: Any) -> None:
        np.subtract(a, b, out=out)

    def isub(self, out: Any, b: Any) -> None:
        np.subtract(out, b, out=out)

    def iadd(self, out: Any, b: Any) -> None:
        np.add(out, b, out=out)

    def sum_into(self, out: Any, a: Any, axis: int) -> None:
        np.add.reduce(a, axis=axis, dtype=a.dtype, out=out)

    def neg(self, out: Any, a: Any) -> None:
        np.negative(a, out=out)

    def host_views(self, arrays: Sequence[Any]) -> Optional[List[np.ndarray]]:
        return list(arrays)

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        return np.concatenate(list(arrays), axis=axis)

    def combine(self, matrix: np.ndarray, arrays: Sequence[Any]) -> List[Any]:
        stacked = np.stack(arrays)
        flat = stacked.reshape(len(arrays), -1)
        result = np.matmul(matrix.astype(stacked.dtype), flat).reshape((matrix.shape[0],) + stacked.shape[1:])
        return [result[i] for i in range(matrix.shape[0])]

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.array(x, copy=True)


class TorchBackend(Backend):
    """torch tensors on any device; integer arithmetic wraps around."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        # torch has no add/sub kernels for these unsigned types; their bits travel as signed ints.
        self._unsupported = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
        self._unsupported.add(torch.bool)
        # dtypes whose CPU tensors NumPy can view without a copy (not bfloat16, not the float8 types)
        self._numpy_dtypes = {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
                              torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}

    def owns(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def device(self, x: Any) -> Any:
        return x.device

    def check_dtype(self, dtype: Any) -> None:
        if dtype in self._unsupported:
            raise ValueError(f"dtype {dtype} is not supported: torch cannot add or subtract it; expected a floating "
                             "or signed integer dtype (view unsigned data as the signed type of the same width)")

    def is_floating(self, dtype: Any) -> bool:
        return dtype.is_floating_point or dtype.is_complex

    def prepare(self, x: Any) -> Any:
        return x.detach()

    def is_contiguous(self, x: Any) -> bool:
        return bool(x.is_contiguous())

    def host_views(self, arrays: Sequence[Any]) -> Optional[List[np.ndarray]]:
        # NumPy's calls cost a fraction of torch's on the small slices of a decode, and they release
        # the interpreter lock, so CPU tensors decode through views of their memory.
        for x in arrays:
            if (x.device.type != "cpu" or x.layout != self.torch.strided or x.dtype not in self._numpy_dtypes
                    or x.requires_grad or x.is_conj() or x.is_neg()):
                return None
        return [x.numpy() for x in arrays]

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        return self.torch.empty(tuple(shape), dtype=like.dtype, device=like.device)

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        return self.torch.zeros(tuple(shape), dtype=like.dtype, device=like.device)

    def sub(self, out: Any, a: Any, b: Any) -> None:
        self.torch.sub(a, b, out=out)

    def isub(self, out: Any, b: Any) -> None:
        out.sub_(b)

    def iadd(self, out: Any, b: Any) -> None:
        out.add_(b)

    def sum_into(self, out: Any, a: Any, axis: int) -> None:
        self.torch.sum(a, dim=axis, dtype=a.dtype, out=out)

    def neg(self, out: Any, a: Any) -> None:
        self.torch.neg(a, out=out)

    def copy(self, out: Any, a: Any) -> None:
        out.copy_(a)

    def fill_zero(self, out: Any) -> None:
        out.zero_()

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        return self.torch.cat(list(arrays), dim=axis)

    def combine(self, matrix: np.ndarray, arrays: Sequence[Any]) -> List[Any]:
        torch = self.torch
        stacked = torch.stack(list(arrays))
        flat = stacked.reshape(len(arrays), -1)
        coeffs = torch.from_numpy(np.array(matrix, dtype=np.float64)).to(dtype=stacked.dtype, device=stacked.device)
        result = torch.matmul(coeffs, flat).reshape((matrix.shape[0],) + tuple(stacked.shape[1:]))
        return list(result.unbind(0))

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.detach().cpu().numpy().copy()


class CupyBackend(NumpyBackend):
    """CuPy arrays on a CUDA device; same ufunc interface as NumPy."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def owns(self, x: Any) -> bool:
        return isinstance(x, self.cupy.ndarray)

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

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.cupy.asnumpy(x)


_NUMPY = NumpyBackend()
_LAZY: dict = {}


def backend_of(x: Any) -> Backend:
    """Return the backend of array `x`; raise ValueError for anything that is not an array."""
    if isinstance(x, np.ndarray):
        return _NUMPY
    module = type(x).__module__.split(".")[0]
    if module == "torch" and "torch" in sys.modules:
        if "torch" not in _LAZY:
            _LAZY["torch"] = TorchBackend()
        if _LAZY["torch"].owns(x):
            return _LAZY["torch"]
    if module == "cupy":
        if "cupy" not in _LAZY:
            _LAZY["cupy"] = CupyBackend()
        if _LAZY["cupy"].owns(x):
            return _LAZY["cupy"]
    raise ValueError(f"expected a NumPy array, torch tensor or CuPy array, got {type(x).__name__}")


def common_backend(arrays: Sequence[Any], what: str, names: Sequence[Any]) -> Backend:
    """Return the one backend of `arrays`; raise ValueError naming the first array that differs.

    Also checks that all arrays share one dtype, shape and device, since coded arithmetic mixes them.
    """
    first = arrays[0]
    backend = backend_of(first)
    shape, dtype, device = tuple(first.shape), first.dtype, backend.device(first)
    backend.check_dtype(dtype)
    for name, x in zip(names[1:], arrays[1:]):
        other = backend_of(x)
        if other is not backend:
            raise ValueError(f"{what} {name} is a {other.name} array but {what} {names[0]} is a {backend.name} "
                             "array: expected one array library for all")
        if x.dtype != dtype:
            raise ValueError(f"{what} {name} has dtype {x.dtype}, expected {dtype} like {what} {names[0]}")
        if tuple(x.shape) != shape:
            raise ValueError(f"{what} {name} has shape {tuple(x.shape)}, expected {shape} like {what} {names[0]}")
        if backend.device(x) != device:
            raise ValueError(f"{what} {name} is on device {backend.device(x)}, expected {device} like "
                             f"{what} {names[0]}")
    return backend
