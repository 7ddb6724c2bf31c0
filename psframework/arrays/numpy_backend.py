"""The backend of NumPy arrays."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from psframework.arrays.backend import HOST, ArrayInfo, Backend


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
