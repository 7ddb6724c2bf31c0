"""The command plan of a coded iteration: the coded passes rank 0 runs and those the workers answer, in order.

Rank 0's model runs every coded convolution forward, in forward order, then backward, in the order
autograd runs them. The workers answer the same passes in the same order, so a worker always knows
which command comes next. Both sides build the plan with `command_plan` from the same model: the
backward order is traced once, through the remote convolutions rank 0 trains with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ContextManager, Dict, List, Optional, Tuple

import torch
from torch import nn

from psframework.comm.envelope import Phase
from psframework.models import CodedConv, Placement, trace_run
from psframework.schemes.coded.remote import remote_convs

Shape = Tuple[int, ...]


@dataclass(frozen=True)
class Command:
    """One coded pass of one layer: forward (X in, the coded Y out) or backward (dY in, the coded dX out)."""

    phase: Phase
    layer: int


@dataclass(frozen=True)
class CommandPlan:
    """The coded passes of every iteration, in the order rank 0's model runs them."""

    names: Tuple[str, ...]  # module names of the coded convolutions, in forward order
    passes: Tuple[Command, ...]  # every coded pass rank 0 runs
    commands: Tuple[Command, ...]  # the passes the workers take part in, in the same order
    input_grads: Tuple[bool, ...]  # per layer: rank 0 needs its input gradient (the layer has a column copy)
    sample_shapes: Dict[Command, Shape]  # the tensor a pass is given, per sample: X (forward), dY (backward)

    def sends(self, command: Command) -> bool:
        """Return whether the workers take part in a pass (get a command for it)."""
        return command in self.commands

    def wants_reply(self, command: Command) -> bool:
        """Return whether rank 0 decodes a pass's result: every forward, a backward where it needs dX."""
        return command.phase == Phase.FORWARD or self.input_grads[command.layer]

    def shape(self, command: Command, batch: int) -> Shape:
        """Return the shape of the tensor a pass is given for a batch of `batch` samples."""
        return (batch, *self.sample_shapes[command])


def sample_shape(conv: CodedConv, phase: Phase) -> Shape:
    """Return a coded convolution's input (forward) or output gradient (backward) shape per sample."""
    return conv.input_shape if phase == Phase.FORWARD else conv.output_shape


def command_plan(model: nn.Module, placement: Placement, distributed_encoding_and_updating: bool,
                 name: str = "model") -> CommandPlan:
    """Return the plan of a model's coded passes.

    With `distributed_encoding_and_updating` the workers take every pass: they update their coded weights in
    each backward. Otherwise (the naive scheme) they take the passes whose result rank 0 decodes.
    """
    forward = [Command(Phase.FORWARD, c.index) for c in placement.coded]
    backward = [Command(Phase.BACKWARD, index) for index in backward_order(model, placement, name)]
    passes = tuple(forward + backward)
    shapes = {c: sample_shape(placement.coded[c.layer], c.phase) for c in passes}
    plan = CommandPlan(placement.coded_names, passes, passes, tuple(c.needs_input_grad for c in placement.coded),
                       shapes)
    if distributed_encoding_and_updating:
        return plan
    return CommandPlan(plan.names, passes, tuple(filter(plan.wants_reply, passes)), plan.input_grads, shapes)


def backward_order(model: nn.Module, placement: Placement, name: str = "model") -> Tuple[int, ...]:
    """Return the indices of the coded convolutions in the order autograd runs their backward passes."""
    tracers: List[_Tracer] = []

    def traced() -> ContextManager[None]:
        tracers.append(_Tracer())  # one per attempt: a trace may fall back from one device to the other
        return remote_convs(model, placement.coded_names, tracers[-1])

    trace_run(model, placement.input_shape, name, traced)
    return tuple(tracers[-1].order)


class _Tracer:
    """A session that computes convolutions locally and records the order of their backward passes."""

    def __init__(self) -> None:
        self.inputs: Dict[int, Shape] = {}
        self.order: List[int] = []

    def forward(self, index: int, conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
        self.inputs[index] = tuple(x.shape[1:])
        return conv._conv_forward(x, conv.weight.detach(), None if conv.bias is None else conv.bias.detach())

    def backward(self, index: int, dy: torch.Tensor, want_input_grad: bool) -> Optional[torch.Tensor]:
        self.order.append(index)
        if not want_input_grad:
            return None
        return torch.zeros((dy.shape[0], *self.inputs[index]), dtype=dy.dtype, device=dy.device)
