"""The Backend interface: what the project asks of an array of one library, and what an array holds.

A `Backend` answers the arithmetic the codes run (always on the backend and device of their inputs,
never converting) and the facts the MPI transport needs (dtype name, shape, bytes, location,
contiguity, host views, stream synchronisation, copies between device and host memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

Index = Tuple[slice, ...]

HOST = "host"
CUDA = "cuda"


def axis_index(axis: int, start: int, stop: int) -> Index:
    """Return the index tuple that selects elements start..stop-1 along `axis`."""
    return (slice(None),) * axis + (slice(start, stop),)


@dataclass(frozen=True)
class ArrayInfo:
    """What an array holds: dtype name, shape, size in bytes and where it lives (HOST or CUDA)."""

    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    location: str

    def describe(self) -> str:
        """Return e.g. 'float32 (4, 8)'."""
        return f"{self.dtype} {self.shape}"


class Backend:
    """Arithmetic and facts for the arrays of one library."""

    name = "abstract"
    noun = "array"  # what error messages call one of its arrays
    arithmetic = True  # whether the codes can compute on its arrays

    def owns(self, x: Any) -> bool:
        """Return whether `x` is an array of this backend."""
        raise NotImplementedError

    # --- facts ---

    def info(self, x: Any) -> ArrayInfo:
        """Return the dtype name, shape, size in bytes and location of `x`."""
        raise NotImplementedError

    def is_contiguous(self, x: Any) -> bool:
        """Return whether `x` is C-contiguous."""
        return bool(x.flags.c_contiguous)

    def is_writable(self, x: Any) -> bool:
        """Return whether the memory of `x` may be written."""
        return True

    def ascontiguous(self, x: Any) -> Any:
        """Return `x` when it is C-contiguous, else a contiguous copy."""
        raise NotImplementedError

    def host_view(self, x: Any) -> np.ndarray:
        """Return a zero-copy NumPy view of contiguous, prepared host array `x` (bytes where NumPy lacks its dtype)."""
        raise NotImplementedError

    def device_view(self, x: Any) -> Any:
        """Return contiguous device array `x` as an object a CUDA-aware MPI takes (one with the interface)."""
        return x

    def synchronize(self, x: Any) -> None:
        """Wait until the stream that produced `x` is done with it (nothing to wait for in host memory)."""

    def to_host(self, src: Any, host: np.ndarray) -> None:
        """Copy the bytes of contiguous `src` into the host byte array `host`."""
        raise NotImplementedError

    def to_host_async(self, src: Any, host: np.ndarray) -> Any:
        """Start copying device array `src` into `host` once its producer is done; return the pending copy.

        The pending copy has query() (done yet?) and synchronize() (wait); None means the copy is done.
        By default the copy is made at once, after waiting for the producing stream.
        """
        self.synchronize(src)
        self.to_host(src, host)
        return None

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        """Copy the host byte array `host` into the memory of `dst`."""
        raise NotImplementedError

    # --- arithmetic for the codes ---

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
        """Return `x` ready for out-of-place arithmetic and for MPI (no autograd history)."""
        return x

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
        """Return NumPy arrays of the same dtype sharing the memory of `arrays`, or None unless all can be."""
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
