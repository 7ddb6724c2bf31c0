"""Flat vectors: tensors packed into one 1-D float32 vector for a message or a sum, and unpacked again;
the SGD momentum buffer of a tensor, read and written."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return the tensors, detached, as one contiguous 1-D float32 vector."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])


def unpack(vector: torch.Tensor, shapes: Sequence[Sequence[int]]) -> List[torch.Tensor]:
    """Return views of consecutive pieces of `vector`, one of each shape; ValueError unless they fill it."""
    out, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(vector[offset:offset + size].reshape(shape))
        offset += size
    _check_length(vector, offset)
    return out


def unpack_into(tensors: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy consecutive pieces of `vector` into `tensors` (in order, each reshaped to fit)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            size = t.numel()
            t.copy_(vector[offset:offset + size].view_as(t))
            offset += size
    _check_length(vector, offset)


def set_grads(params: Sequence[torch.Tensor], vector: torch.Tensor, add: bool = False) -> None:
    """Set every parameter's .grad from consecutive pieces of `vector` (copies: the vector may be reused);
    `add` adds them to the gradients already there (accumulation)."""
    offset = 0
    for p in params:
        size = p.numel()
        piece = vector[offset:offset + size].view_as(p)
        if add and p.grad is not None:
            p.grad.add_(piece)
        else:
            p.grad = piece.clone()
        offset += size


def momentum_of(optimizer: torch.optim.Optimizer, tensor: torch.Tensor) -> Optional[torch.Tensor]:
    """Return the SGD momentum buffer the optimizer keeps for `tensor` (None before its first step)."""
    return optimizer.state.get(tensor, {}).get("momentum_buffer")


def set_momentum(optimizer: torch.optim.Optimizer, tensor: torch.Tensor, buffer: torch.Tensor) -> None:
    """Make `buffer` the SGD momentum buffer the optimizer keeps for `tensor`."""
    optimizer.state[tensor]["momentum_buffer"] = buffer


def _check_length(vector: torch.Tensor, used: int) -> None:
    if used != vector.numel():
        raise ValueError(f"vector of {vector.numel()} values, expected {used}")
