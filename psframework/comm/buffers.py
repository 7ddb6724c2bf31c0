"""Turn torch tensors, NumPy arrays and CUDA arrays into contiguous byte buffers for MPI.

CPU tensors travel as zero-copy NumPy views. CUDA tensors and objects exposing
``__cuda_array_interface__`` (CuPy arrays) go to MPI directly when the MPI library is CUDA-aware,
after the producing stream is synchronised (mpi4py does not synchronise streams); otherwise they
are staged through pinned host memory. CuPy and CUDA are only touched when a device buffer shows up.
"""

from __future__ import annotations

from dataclasses import dataclass
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .envelope import DTYPE_CODES

HOST = "host"
CUDA = "cuda"


@dataclass(frozen=True)
class TensorInfo:
    """What a buffer holds: dtype name, shape, size in bytes and where it lives."""

    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    location: str

    def describe(self) -> str:
        """Return e.g. 'float32 (4, 8)'."""
        return f"{self.dtype} {self.shape}"


@dataclass
class WireBuffer:
    """The bytes of one tensor, ready to hand to MPI as ``[data, MPI.BYTE]``."""

    data: Any
    info: TensorInfo
    finish: Optional[Callable[[], None]] = None  # after a staged receive: copy host bytes to the device
    release: Optional[Callable[[], None]] = None  # give staging memory back once MPI is done with it
    keep: Any = None  # objects that must outlive the MPI operation

    def done(self, received: bool) -> None:
        """Finish a receive (copy staged bytes home) and release staging memory."""
        if received and self.finish is not None:
            self.finish()
        if self.release is not None:
            self.release()
            self.release = None


_TORCH_DTYPE_NAMES: Dict[Any, str] = {}


def _torch_module() -> Any:
    """Return torch if it has been imported (a torch tensor cannot exist otherwise)."""
    return sys.modules.get("torch")


def _is_torch(obj: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_dtype_name(dtype: Any) -> str:
    name = _TORCH_DTYPE_NAMES.get(dtype)
    if name is None:
        name = _TORCH_DTYPE_NAMES[dtype] = str(dtype).split(".")[-1]
    return name


def tensor_info(obj: Any) -> TensorInfo:
    """Return dtype, shape, bytes and location of a torch tensor, NumPy array or CUDA array."""
    if type(obj) is np.ndarray:
        info = TensorInfo(obj.dtype.name, obj.shape, obj.nbytes, HOST)
    elif _is_torch(obj):
        device = obj.device.type
        if device not in ("cpu", "cuda"):
            raise ValueError(f"tensor device: got {obj.device}, expected cpu or cuda")
        info = TensorInfo(_torch_dtype_name(obj.dtype), tuple(obj.shape), obj.numel() * obj.element_size(),
                          HOST if device == "cpu" else CUDA)
    elif isinstance(obj, np.ndarray):
        info = TensorInfo(obj.dtype.name, obj.shape, int(obj.nbytes), HOST)
    elif hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        dtype = np.dtype(cai["typestr"])
        shape = tuple(int(s) for s in cai["shape"])
        info = TensorInfo(dtype.name, shape, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, CUDA)
    else:
        raise ValueError(f"buffer: got {type(obj).__name__}, expected a torch tensor, a NumPy array "
                         "or an array exposing __cuda_array_interface__")
    if info.dtype not in DTYPE_CODES:
        raise ValueError(f"buffer dtype: got {info.dtype}, expected one of {', '.join(DTYPE_CODES)}")
    return info


def _cai_contiguous(obj: Any) -> bool:
    cai = obj.__cuda_array_interface__
    strides = cai.get("strides")
    if strides is None:
        return True
    itemsize = np.dtype(cai["typestr"]).itemsize
    expected, step = [], itemsize
    for size in reversed(cai["shape"]):
        expected.append(step)
        step *= int(size)
    return all(s == e or n == 1 for s, e, n in zip(strides, reversed(expected), cai["shape"]))


def synchronize(obj: Any) -> None:
    """Wait until the stream that produced a CUDA buffer is done with it."""
    if _is_torch(obj):
        if obj.is_cuda:
            import torch

            torch.cuda.current_stream(obj.device).synchronize()
        return
    cai = getattr(obj, "__cuda_array_interface__", None)
    stream = None if cai is None else cai.get("stream")
    if stream is None:  # the producer promises the data is ready (interface v2, or no stream)
        return
    try:
        import cupy

        cupy.cuda.ExternalStream(stream).synchronize()
    except ImportError:
        import torch

        torch.cuda.ExternalStream(stream).synchronize()


def _torch_bytes(tensor: Any) -> Any:
    """Return a flat uint8 view of a contiguous torch tensor."""
    import torch

    return tensor.detach().reshape(-1).view(torch.uint8)


def _host_view(tensor: Any) -> Any:
    """Return a zero-copy NumPy view of a contiguous CPU tensor (MPI sends it as bytes)."""
    try:
        return tensor.numpy()
    except TypeError:  # dtypes NumPy lacks, such as bfloat16: view the bytes instead
        return _torch_bytes(tensor).numpy()


def _device_to_host(src: Any, host: np.ndarray) -> None:
    """Copy the bytes of a CUDA buffer into a host byte array."""
    if _is_torch(src):
        import torch

        torch.from_numpy(host).copy_(_torch_bytes(src))
        return
    import cupy

    flat = cupy.asarray(src).reshape(-1).view(cupy.uint8)
    flat.get(out=host)


def _host_to_device(host: np.ndarray, dst: Any) -> None:
    """Copy a host byte array into the bytes of a CUDA buffer."""
    if _is_torch(dst):
        import torch

        _torch_bytes(dst).copy_(torch.from_numpy(host))
        return
    import cupy

    flat = cupy.asarray(dst).reshape(-1).view(cupy.uint8)
    flat.set(host)


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


def _staged(obj: Any, info: TensorInfo, pool: StagingPool, for_send: bool) -> WireBuffer:
    host = pool.take(info.nbytes)
    if for_send:
        _device_to_host(obj, host)
        finish = None
    else:
        def finish() -> None:
            _host_to_device(host, obj)
    return WireBuffer(host, info, finish=finish, release=lambda: pool.give(host), keep=obj)


def send_buffer(obj: Any, cuda_aware: bool, pool: StagingPool, info: Optional[TensorInfo] = None) -> WireBuffer:
    """Return the wire bytes of `obj` for sending: detached, contiguous, synchronised."""
    info = tensor_info(obj) if info is None else info
    if type(obj) is np.ndarray or isinstance(obj, np.ndarray):
        array = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        return WireBuffer(array, info, keep=array)
    if _is_torch(obj):
        tensor = obj.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()  # the one copy MPI cannot avoid for a strided tensor
        if info.location == HOST:
            return WireBuffer(_host_view(tensor), info, keep=tensor)
        synchronize(tensor)
        if not cuda_aware:
            return _staged(tensor, info, pool, for_send=True)
        return WireBuffer(_cuda_view(_torch_bytes(tensor)), info, keep=tensor)
    synchronize(obj)
    if not _cai_contiguous(obj):
        raise ValueError(f"device buffer: got a non-contiguous {info.describe()} array, expected a C-contiguous one")
    if not cuda_aware:
        return _staged(obj, info, pool, for_send=True)
    return WireBuffer(obj, info, keep=obj)


def recv_buffer(obj: Any, cuda_aware: bool, pool: StagingPool, info: Optional[TensorInfo] = None) -> WireBuffer:
    """Return wire bytes that land in `obj` when received (staged when MPI is not CUDA-aware)."""
    info = tensor_info(obj) if info is None else info
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous or not obj.flags.writeable:
            raise ValueError(f"receive buffer: got a non-contiguous or read-only {info.describe()} array, "
                             "expected a writable C-contiguous one")
        return WireBuffer(obj, info, keep=obj)
    if _is_torch(obj):
        tensor = obj.detach()
        if not tensor.is_contiguous():
            raise ValueError(f"receive buffer: got a non-contiguous {info.describe()} tensor, "
                             "expected a contiguous one")
        if info.location == HOST:
            return WireBuffer(_host_view(tensor), info, keep=tensor)
        synchronize(tensor)  # no kernel may still be using the memory MPI is about to overwrite
        if not cuda_aware:
            return _staged(tensor, info, pool, for_send=False)
        return WireBuffer(_cuda_view(_torch_bytes(tensor)), info, keep=tensor)
    if not _cai_contiguous(obj):
        raise ValueError(f"receive buffer: got a non-contiguous {info.describe()} device array, "
                         "expected a C-contiguous one")
    synchronize(obj)
    if not cuda_aware:
        return _staged(obj, info, pool, for_send=False)
    return WireBuffer(obj, info, keep=obj)


def _cuda_view(flat_bytes: Any) -> Any:
    """Return a CuPy view of a torch CUDA byte tensor via DLPack, or the tensor itself without CuPy."""
    try:
        import cupy
    except ImportError:
        return flat_bytes  # torch tensors expose __cuda_array_interface__ too
    return cupy.from_dlpack(flat_bytes)


def copy_bytes_into(out: Any, payload: np.ndarray) -> None:
    """Copy host bytes (a message kept aside earlier) into a receive buffer."""
    info = tensor_info(out)
    if payload.nbytes != info.nbytes:
        raise ValueError(f"payload: got {payload.nbytes} bytes, expected {info.nbytes} for {info.describe()}")
    if info.location == CUDA:
        synchronize(out)
        _host_to_device(payload, out)
    elif _is_torch(out):
        _torch_bytes(out).numpy()[:] = payload
    else:
        out.reshape(-1).view(np.uint8)[:] = payload


def host_empty(shape: Tuple[int, ...], dtype: str = "float32") -> Any:
    """Return an empty CPU torch tensor backed by NumPy memory, good for large messages.

    NumPy asks Linux for transparent huge pages on large arrays; torch's allocator does so only
    with THP_MEM_ALLOC_ENABLE=1. Large messages move several times faster from such memory.
    """
    import torch

    torch_dtype = getattr(torch, dtype, None)
    if dtype not in DTYPE_CODES or not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype: got {dtype!r}, expected one of {', '.join(DTYPE_CODES)}")
    shape = tuple(int(s) for s in shape)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return torch.empty(shape, dtype=torch_dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    raw = torch.from_numpy(np.empty(count * itemsize, dtype=np.uint8))
    return raw.view(torch_dtype).reshape(shape)


def allocate(dtype: str, shape: Tuple[int, ...]) -> Any:
    """Return an empty CPU torch tensor of `dtype` and `shape` to receive into."""
    return host_empty(shape, dtype)
