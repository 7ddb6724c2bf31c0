"""Max pooling with torch's own values and gradients, faster on the CPU: the window search in channels-last order.

On the CPU, torch's max_pool2d of a batch in the default memory format searches each window one
element at a time (about 6 ns an element on the machines of docs/benchmarks); the same kernel on the
channels-last layout searches every channel of a window at once. Rank 0 of the model-parallel schemes
runs every non-coded layer of the whole batch by itself, so there this is time on the critical path;
every model psframework trains (torch DDP's in `psf bench peers` too) pools this way.

The channels-last search picks the same element of every window as torch's default one (the first
maximum in row-major order, or the last NaN; tests/test_models.py checks ties and NaN), and the
backward pass is torch's own kernel given those indices, so values and gradients are torch's, bit
for bit, whatever the kernel, stride, padding, dilation and ceil_mode.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class ChannelsLastMaxPool(torch.autograd.Function):
    """nn.MaxPool2d's forward and backward, its windows searched on a channels-last copy of the input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pool: nn.MaxPool2d) -> torch.Tensor:
        args = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        y, indices = F.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), *args)
        indices = indices.contiguous()
        ctx.save_for_backward(x, indices)
        ctx.args = args
        return y.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        x, indices = ctx.saved_tensors
        kernel, stride, padding, dilation, ceil_mode = (_pair(a) if not isinstance(a, bool) else a for a in ctx.args)
        dx = torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, kernel, stride, padding, dilation,
                                                             ceil_mode, indices)
        return dx, None


def _pair(value: Any) -> list:
    return [value, value] if isinstance(value, int) else list(value)


def searches_faster(pool: nn.Module) -> bool:
    """Return whether a module is a max pool that ChannelsLastMaxPool can run."""
    return type(pool) is nn.MaxPool2d and not pool.return_indices


def use_fast_pooling(model: nn.Module) -> nn.Module:
    """Run the model's max pools through ChannelsLastMaxPool from now on (the same results, less time); return it."""
    for module in model.modules():
        if searches_faster(module) and "forward" not in vars(module):
            module.forward = _forward(module)
    return model


def _forward(pool: nn.MaxPool2d) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.device.type != "cpu" or not x.is_floating_point():
            return F.max_pool2d(x, pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        return ChannelsLastMaxPool.apply(x, pool)
    return forward
