"""Bit-exact transport: code the raw bits of float tensors as same-width integers.

Shift-and-addition coding only adds and subtracts, so on integers with wrap-around arithmetic
encode -> decode gives back every bit. Viewing floats as integers (no copy) makes coded
dissemination of activations and gradients exact, not merely close. NumPy floats are viewed as
unsigned integers; torch floats as signed ones, since torch cannot add most unsigned types.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from psframework.arrays import arithmetic_backend

_NUMPY_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _torch_bits(torch: Any, dtype: Any) -> Any:
    width = torch.empty((), dtype=dtype).element_size()
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]


def to_bits(x: Any) -> Any:
    """Return a view of float array `x` as integers of the same width (integer arrays come back unchanged)."""
    backend = arithmetic_backend(x)
    if backend.name == "torch":
        torch = backend.torch
        dtype = x.dtype
        if dtype.is_complex or dtype == torch.bool:
            raise ValueError(f"dtype {dtype} has no bit view: expected a real floating or integer dtype")
        if dtype.is_floating_point or dtype in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64")):
            return x.detach().view(_torch_bits(torch, dtype))
        return x
    dtype = np.dtype(x.dtype)
    if dtype.kind == "f" and dtype.itemsize in _NUMPY_BITS:
        return x.view(_NUMPY_BITS[dtype.itemsize])
    if dtype.kind in "iu":
        return x
    raise ValueError(f"dtype {dtype} has no bit view: expected float16, float32, float64 or an integer dtype")


def from_bits(x: Any, dtype: Any) -> Any:
    """Return integer array `x` viewed as `dtype`, which must have the same width (the inverse of to_bits)."""
    backend = arithmetic_backend(x)
    if backend.name == "torch":
        torch = backend.torch
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"from_bits expects an integer tensor, got dtype {x.dtype}")
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype for a torch tensor, got {dtype!r}")
        if torch.empty((), dtype=dtype).element_size() != x.element_size():
            raise ValueError(f"cannot view {x.dtype} as {dtype}: widths differ")
        return x.view(dtype)
    if np.dtype(x.dtype).kind not in "iu":
        raise ValueError(f"from_bits expects an integer array, got dtype {x.dtype}")
    try:
        target = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be a NumPy dtype for a NumPy array, got {dtype!r}") from None
    if target.itemsize != x.dtype.itemsize:
        raise ValueError(f"cannot view {x.dtype} as {target}: widths differ")
    return x.view(target)
