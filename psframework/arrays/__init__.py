"""One tensor adapter for the project: NumPy, torch (CPU/CUDA), CuPy and CUDA interface arrays.

A `Backend` (backend.py) answers everything the project asks of an array of one library: the arithmetic
the codes run (always on the backend and device of their inputs, never converting) and the facts the MPI
transport needs (dtype name, shape, bytes, location, contiguity, host views, stream synchronisation,
copies between device and host memory). The backends are in numpy_backend.py, torch_backend.py and
cuda_backends.py. This module is the adapter's public entry (the names in __all__): `backend_of` finds
the backend of any array the project handles; `arithmetic_backend` only those the codes can compute on.

torch is imported only when a torch tensor is seen (or `host_empty` is called), CuPy only when a CuPy
or CUDA interface array needs it; this package imports neither MPI nor torch.nn.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from psframework.arrays.backend import CUDA, HOST, ArrayInfo, Backend, Index, axis_index
from psframework.arrays.cuda_backends import CupyBackend, InterfaceBackend
from psframework.arrays.numpy_backend import NumpyBackend
from psframework.arrays.torch_backend import TorchBackend

__all__ = ["CUDA", "HOST", "ArrayInfo", "Backend", "Index", "allocate", "arithmetic_backend", "array_info",
           "axis_index", "backend_of", "common_backend", "host_empty", "register_backend"]

_NUMPY = NumpyBackend()
_INTERFACE = InterfaceBackend()
# Array type -> backend. The first array of a type pays for the search; later ones cost one dict lookup,
# which keeps the codes' per-call checks cheap.
_BY_TYPE: Dict[type, Backend] = {np.ndarray: _NUMPY}
_REGISTERED: Dict[type, Backend] = {}
_LAZY: Dict[str, Backend] = {}
_LAZY_FACTORIES: Dict[str, Callable[[], Backend]] = {"torch": TorchBackend, "cupy": CupyBackend}


def register_backend(array_type: type, backend: Backend) -> None:
    """Make `backend` serve arrays of `array_type` and its subclasses."""
    _REGISTERED[array_type] = backend
    _BY_TYPE[array_type] = backend


def _library_backend(x: Any) -> Optional[Backend]:
    """Return the backend of `x` among NumPy, registered types, torch and CuPy, or None."""
    if isinstance(x, np.ndarray):
        return _NUMPY
    for array_type, backend in _REGISTERED.items():
        if isinstance(x, array_type):
            return backend
    module = type(x).__module__.split(".")[0]
    if module not in _LAZY_FACTORIES:
        return None
    if module not in _LAZY:  # the library is imported already: one of its arrays exists
        _LAZY[module] = _LAZY_FACTORIES[module]()
    return _LAZY[module] if _LAZY[module].owns(x) else None


def _find(x: Any) -> Optional[Backend]:
    """Return the backend of `x` found the slow way (caching it per type), or None for a non-array."""
    backend = _library_backend(x)
    if backend is not None:
        _BY_TYPE[type(x)] = backend
    elif _INTERFACE.owns(x):  # not cached: whether an object exposes the interface may vary per object
        backend = _INTERFACE
    return backend


def backend_of(x: Any) -> Backend:
    """Return the backend of array `x`; raise ValueError for anything the project cannot handle as an array."""
    backend = _BY_TYPE.get(type(x)) or _find(x)
    if backend is None:
        raise ValueError(f"expected a NumPy array, torch tensor, CuPy array or an array exposing "
                         f"__cuda_array_interface__, got {type(x).__name__}")
    return backend


def arithmetic_backend(x: Any) -> Backend:
    """Return the backend of `x` when the codes can compute on it; raise ValueError otherwise."""
    backend = _BY_TYPE.get(type(x)) or _find(x)
    if backend is None or not backend.arithmetic:
        raise ValueError(f"expected a NumPy array, torch tensor or CuPy array, got {type(x).__name__}")
    return backend


def array_info(x: Any) -> ArrayInfo:
    """Return the dtype name, shape, size in bytes and location of array `x`."""
    return backend_of(x).info(x)


def common_backend(arrays: Sequence[Any], what: str, names: Sequence[Any]) -> Backend:
    """Return the one arithmetic backend of `arrays`; raise ValueError naming the first array that differs.

    Also checks that all arrays share one dtype, shape and device, since coded arithmetic mixes them.
    """
    first = arrays[0]
    backend = arithmetic_backend(first)
    shape, dtype, device = tuple(first.shape), first.dtype, backend.device(first)
    backend.check_dtype(dtype)
    for name, x in zip(names[1:], arrays[1:]):
        other = arithmetic_backend(x)
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


def host_empty(shape: Tuple[int, ...], dtype: str = "float32") -> Any:
    """Return an empty CPU torch tensor backed by NumPy memory, good for large messages.

    NumPy asks Linux for transparent huge pages on large arrays; torch's allocator does so only
    with THP_MEM_ALLOC_ENABLE=1. Large messages move several times faster from such memory.
    """
    import torch

    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype: got {dtype!r}, expected the name of a torch dtype such as 'float32'")
    shape = tuple(int(s) for s in shape)
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=torch_dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    raw = torch.from_numpy(np.empty(count * itemsize, dtype=np.uint8))
    return raw.view(torch_dtype).reshape(shape)


def allocate(dtype: str, shape: Tuple[int, ...], device: Any = None) -> Any:
    """Return an empty torch tensor of `dtype` and `shape` to receive into: on the CPU, or on `device`."""
    if device is None or str(device) == "cpu":
        return host_empty(shape, dtype)
    import torch

    return torch.empty(tuple(int(s) for s in shape), dtype=getattr(torch, dtype), device=device)
