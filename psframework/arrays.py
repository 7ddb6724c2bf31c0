"""One tensor adapter for the project: NumPy, torch (CPU/CUDA), CuPy and CUDA interface arrays.

A `Backend` answers everything the project asks of an array of one library: the arithmetic the codes
run (always on the backend and device of their inputs, never converting) and the facts the MPI
transport needs (dtype name, shape, bytes, location, contiguity, host views, stream synchronisation,
copies between device and host memory). `backend_of` finds the backend of any array the project
handles; `arithmetic_backend` only those the codes can compute on.

torch is imported only when a torch tensor is seen (or `host_empty` is called), CuPy only when a CuPy
or CUDA interface array needs it; this module imports neither MPI nor torch.nn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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


class NumpyBackend(Backend):
    """NumPy arrays; unsigned and signed integers wrap around."""

    name = "numpy"

    def owns(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def info(self, x: Any) -> ArrayInfo:
        return ArrayInfo(x.dtype.name, x.shape, int(x.nbytes), HOST)

    def is_writable(self, x: Any) -> bool:
        return bool(x.flags.writeable)

    def ascontiguous(self, x: Any) -> Any:
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)

    def host_view(self, x: Any) -> np.ndarray:
        return x

    def to_host(self, src: Any, host: np.ndarray) -> None:
        host[...] = src.reshape(-1).view(np.uint8)

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        dst[...] = host.view(dst.dtype).reshape(dst.shape)  # any strides: the values land where they belong

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


class TorchBackend(Backend):
    """torch tensors on any device; integer arithmetic wraps around."""

    name = "torch"
    noun = "tensor"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        # torch has no add/sub kernels for these unsigned types; their bits travel as signed ints.
        self._unsupported = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
        self._unsupported.add(torch.bool)
        # dtypes whose CPU tensors NumPy can view without a copy (not bfloat16, not the float8 types)
        self._numpy_dtypes = {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
                              torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool}
        self._dtype_names: Dict[Any, str] = {}

    def owns(self, x: Any) -> bool:
        return isinstance(x, self.torch.Tensor)

    def info(self, x: Any) -> ArrayInfo:
        device = x.device.type
        if device not in ("cpu", "cuda"):
            raise ValueError(f"tensor device: got {x.device}, expected cpu or cuda")
        name = self._dtype_names.get(x.dtype)
        if name is None:
            name = self._dtype_names[x.dtype] = str(x.dtype).split(".")[-1]
        return ArrayInfo(name, tuple(x.shape), x.numel() * x.element_size(), HOST if device == "cpu" else CUDA)

    def is_contiguous(self, x: Any) -> bool:
        return bool(x.is_contiguous())

    def ascontiguous(self, x: Any) -> Any:
        if x.is_contiguous() and not (x.is_conj() or x.is_neg()):
            return x
        # conjugate and negative bits are lazy: until resolved, the bytes in memory do not hold the values
        return x.resolve_conj().resolve_neg().contiguous()

    def _bytes(self, x: Any) -> Any:
        """Return a flat uint8 view of contiguous, prepared tensor `x`."""
        return x.reshape(-1).view(self.torch.uint8)

    def host_view(self, x: Any) -> np.ndarray:
        # `x` is prepared (detached) already: a second detach would cost as much as the view
        if x.dtype in self._numpy_dtypes:
            return x.numpy()
        return self._bytes(x).numpy()  # bfloat16 and the like: MPI only needs the bytes

    def device_view(self, x: Any) -> Any:
        flat = self._bytes(x)
        try:
            import cupy
        except ImportError:
            return flat  # torch CUDA tensors expose __cuda_array_interface__ too
        return cupy.from_dlpack(flat)

    def synchronize(self, x: Any) -> None:
        if x.is_cuda:
            self.torch.cuda.current_stream(x.device).synchronize()

    def to_host(self, src: Any, host: np.ndarray) -> None:
        self.torch.from_numpy(host).copy_(self._bytes(src))

    def to_host_async(self, src: Any, host: np.ndarray) -> Any:
        """Copy a CUDA tensor to pinned host memory on a side stream, after the stream that produced it.

        The host does not wait: the copy overlaps with what the producing stream does next, and the
        caller posts the MPI send once the returned event has completed.
        """
        if not src.is_cuda:
            self.to_host(src, host)
            return None
        torch = self.torch
        stream = self._copy_stream(src.device)
        stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(stream):
            torch.from_numpy(host).copy_(self._bytes(src), non_blocking=True)
        src.record_stream(stream)  # the allocator must not reuse src's memory before the copy has read it
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _copy_stream(self, device: Any) -> Any:
        """Return this device's side stream for staging copies (made once)."""
        streams = self.__dict__.setdefault("_streams", {})
        if device not in streams:
            streams[device] = self.torch.cuda.Stream(device)
        return streams[device]

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        # viewed as the tensor's dtype and shape, the bytes land right whatever the strides of `dst`
        dst.detach().copy_(self.torch.from_numpy(host).view(dst.dtype).view(dst.shape))

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
