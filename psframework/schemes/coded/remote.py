"""Remote convolutions: rank 0 runs its model with each coded Conv2d computed elsewhere, through a session.

The session is rank 0's rounds with the workers in training (core.py) or a local tracer that records
the order of the backward passes (plan.py); autograd keeps the model's own structure either way.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, Tuple

import torch
from torch import nn


class Session(Protocol):
    """What remote convolutions call: rank 0's exchange with the workers (or the plan's tracer)."""

    def forward(self, index: int, conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
        """Return the convolution's output for input `x`."""

    def backward(self, index: int, dy: torch.Tensor, want_input_grad: bool) -> Optional[torch.Tensor]:
        """Take the output gradient; return the input gradient when wanted."""


class RemoteConv(torch.autograd.Function):
    """A convolution computed elsewhere: forward and backward go through a session.

    The weight is an input only so that autograd runs every layer's backward (the workers update their
    coded weights there), also where the layer's input needs no gradient; its gradient is the session's
    business.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, session: Session, index: int,
                conv: nn.Conv2d) -> torch.Tensor:
        ctx.session, ctx.index = session, index
        y = session.forward(index, conv, x)
        # A decoded output may be a view (of the padded decode); autograd forbids in-place work on a view that
        # a custom Function returns, and models do it: ReLU(inplace=True) right after a convolution.
        return y if y._base is None else y.clone()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None, None]:
        return ctx.session.backward(ctx.index, dy.contiguous(), ctx.needs_input_grad[0]), None, None, None, None


@contextlib.contextmanager
def remote_convs(model: nn.Module, names: Sequence[str], session: Session) -> Iterator[None]:
    """Run the named Conv2d modules of `model` through `session` while inside the block."""
    modules = dict(model.named_modules())
    swapped = []
    try:
        for index, name in enumerate(names):
            conv = modules[name]
            conv.forward = _remote_forward(conv, session, index)
            swapped.append(conv)
        yield
    finally:
        for conv in swapped:
            del conv.forward


def _remote_forward(conv: nn.Conv2d, session: Session, index: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return RemoteConv.apply(x, conv.weight, session, index, conv)
    return forward
