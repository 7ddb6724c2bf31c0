"""The backend of torch tensors, on the CPU or a CUDA device (torch is imported when one is first seen)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from psframework.arrays.backend import CUDA, HOST, ArrayInfo, Backend


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
