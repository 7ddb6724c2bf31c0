"""Where each part of any model runs: coded convolutions on the workers, the rest on rank 0, the Stanza cut.

Placement is found by running the model on a batch of two zero inputs, on torch's meta device
(shapes only, no memory) or, for small inputs, on the CPU, the model's own tensors untouched, to see
which leaf modules run in which order and on what. Rank 0 and the workers derive the same placement
from the same model. (The coded schemes trace the order of the coded convolutions' backward passes
themselves: schemes/coded/plan.py.)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from torch import nn

from psframework.errors import ConfigError

Pair = Tuple[int, int]


@dataclass(frozen=True)
class ConvGeometry:
    """What the coded layer identities need of a Conv2d: channels, kernel, stride, padding, dilation, bias."""

    in_channels: int
    out_channels: int
    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair
    bias: bool

    @property
    def weight_shape(self) -> Tuple[int, int, int, int]:
        """Return the shape of the uncoded weight."""
        return (self.out_channels, self.in_channels, *self.kernel)


@dataclass(frozen=True)
class CodedConv:
    """One coded convolution: its place in the forward pass, geometry and per-sample shapes."""

    index: int
    name: str
    geometry: ConvGeometry
    input_shape: Tuple[int, ...]
    output_shape: Tuple[int, ...]
    needs_input_grad: bool  # the layer's input depends on parameters: rank 0 needs its gradient


@dataclass(frozen=True)
class LayerCall:
    """One leaf-module call of the forward pass: what ran, its output per sample and its own parameters."""

    name: str
    kind: str
    output_shape: Tuple[int, ...]
    params: int


@dataclass(frozen=True)
class Placement:
    """The placement of one model for one input shape."""

    input_shape: Tuple[int, ...]
    output_shape: Tuple[int, ...]
    coded: Tuple[CodedConv, ...]  # in forward order
    calls: Tuple[LayerCall, ...]
    on_server: Dict[str, str]  # Conv2d name -> why it is not coded
    cut: Optional[int]  # index in `calls` of the first head layer (None: no head)
    head: FrozenSet[str]  # names of the head's parameters

    @property
    def coded_names(self) -> Tuple[str, ...]:
        """Return the module names of the coded convolutions, in forward order."""
        return tuple(c.name for c in self.coded)

    def worker_parameter_names(self) -> FrozenSet[str]:
        """Return the names of the parameters coded layers hold (weights and biases)."""
        names = [f"{c.name}.weight" for c in self.coded] + [f"{c.name}.bias" for c in self.coded if c.geometry.bias]
        return frozenset(names)


def geometry_of(conv: nn.Conv2d) -> ConvGeometry:
    """Return the geometry of a Conv2d whose padding may be given as 'same' or 'valid'."""
    kernel, dilation = tuple(conv.kernel_size), tuple(conv.dilation)
    padding = conv.padding
    if isinstance(padding, str):
        padding = tuple(0 if padding == "valid" else d * (k - 1) // 2 for k, d in zip(kernel, dilation))
    return ConvGeometry(conv.in_channels, conv.out_channels, kernel, tuple(conv.stride), tuple(padding), dilation,
                        conv.bias is not None)


def uncodable(conv: nn.Module) -> Optional[str]:
    """Return why a Conv2d cannot be coded by output-channel blocks, or None when it can."""
    if type(conv).forward is not nn.Conv2d.forward:
        return f"{type(conv).__name__} has its own forward"
    if conv.groups != 1:
        return f"grouped convolution (groups={conv.groups}): output-channel blocks need different inputs"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r}: only zero padding is coded"
    if conv.padding == "same" and any(d * (k - 1) % 2 for k, d in zip(conv.kernel_size, conv.dilation)):
        return "padding='same' with an even kernel pads unevenly"
    return None


def place(model: nn.Module, input_shape: Sequence[int], split_at: Optional[str] = None,
          name: str = "model") -> Placement:
    """Return where every part of `model` runs for inputs of `input_shape` (C, H, W); ConfigError otherwise."""
    input_shape = tuple(input_shape)
    seen = _leaf_calls(model, input_shape, name)
    calls, counts = seen.calls, seen.counts
    modules = dict(model.named_modules())
    on_server: Dict[str, str] = {}
    coded_names = []
    for call in calls:
        module = modules[call.name]
        if not isinstance(module, nn.Conv2d) or call.name in coded_names or call.name in on_server:
            continue
        reason = uncodable(module) or (f"called {counts[call.name]} times per forward pass"
                                       if counts[call.name] > 1 else None)
        if reason:
            on_server[call.name] = reason
        else:
            coded_names.append(call.name)
    coded = tuple(CodedConv(i, n, geometry_of(modules[n]), seen.inputs[n][0], _output_of(calls, n),
                            seen.inputs[n][1]) for i, n in enumerate(coded_names))
    cut = _cut(model, calls, split_at, name)
    return Placement(input_shape, seen.output_shape, coded, tuple(calls), on_server, cut,
                     _head_parameters(model, calls, cut))


def _output_of(calls: Sequence[LayerCall], name: str) -> Tuple[int, ...]:
    return next(c.output_shape for c in calls if c.name == name)


@dataclass
class _Seen:
    """What one run of a model shows: its leaf-module calls, how often each module ran, what each Conv2d
    was given (per-sample shape, whether it depends on parameters) and the output's per-sample shape."""

    calls: List[LayerCall] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    inputs: Dict[str, Tuple[Tuple[int, ...], bool]] = field(default_factory=dict)
    output_shape: Tuple[int, ...] = ()


def _leaf_calls(model: nn.Module, input_shape: Tuple[int, ...], name: str) -> _Seen:
    """Run the model once, recording every leaf-module call in order and the input of every Conv2d."""
    seen = _Seen()

    def hook(module_name: str) -> Any:
        def record(module: nn.Module, inputs: Any, output: Any) -> None:
            seen.counts[module_name] = seen.counts.get(module_name, 0) + 1
            first = output[0] if isinstance(output, (tuple, list)) else output
            shape = tuple(first.shape[1:]) if isinstance(first, torch.Tensor) else ()
            seen.calls.append(LayerCall(module_name, type(module).__name__, shape,
                                        sum(p.numel() for p in module.parameters(recurse=False))))
            if isinstance(module, nn.Conv2d) and inputs and isinstance(inputs[0], torch.Tensor):
                seen.inputs[module_name] = (tuple(inputs[0].shape[1:]), inputs[0].requires_grad)
        return record

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    leaves = [(n, m) for n, m in model.named_modules()
              if n and not any(True for _ in m.children()) and not isinstance(m, containers)]
    handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
    try:
        seen.output_shape = tuple(trace_run(model, input_shape, name, contextlib.nullcontext).shape[1:])
    finally:
        for h in handles:
            h.remove()
    return seen


# A trace on real zeros costs milliseconds for a small model on small inputs (up to a 3x32x32 image and
# 4 M parameters), less than the second or so torch takes to set up its meta-device kernels in a fresh
# process; anything larger is traced on the meta device, which allocates and computes nothing.
SMALL_INPUT = 3 * 32 * 32
SMALL_MODEL = 4_000_000


def trace_devices(model: nn.Module, input_shape: Tuple[int, ...]) -> Tuple[str, str]:
    """Return the devices to trace `model` on, in order: the CPU first when it is small, else the meta device."""
    elements = 1
    for size in input_shape:
        elements *= size
    parameters = sum(t.numel() for t in model.parameters()) + sum(t.numel() for t in model.buffers())
    small = elements <= SMALL_INPUT and parameters <= SMALL_MODEL
    return ("cpu", "meta") if small else ("meta", "cpu")


def trace_run(model: nn.Module, input_shape: Tuple[int, ...], name: str,
              context: Callable[[], ContextManager[Any]]) -> torch.Tensor:
    """Run forward and backward on a batch of two zero inputs inside `context()`, the model's own tensors
    untouched: on the CPU for small inputs, else on the meta device (each falls back on the other)."""
    from torch.func import functional_call

    last: Optional[BaseException] = None
    for device in trace_devices(model, input_shape):
        try:
            # torch.zeros, not zeros_like: a like-copy of a meta tensor goes through torch's slow Python kernels.
            tensors = {key: torch.zeros(t.shape, dtype=t.dtype, device=device).requires_grad_(t.requires_grad)
                       for key, t in model.named_parameters()}
            tensors.update({key: torch.zeros(t.shape, dtype=t.dtype, device=device)
                            for key, t in model.named_buffers()})
            with context():
                out = functional_call(model, tensors, (torch.zeros(2, *input_shape, device=device),))
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    # A scalar's backward: one with an explicit gradient imports torch's symbolic shapes and
                    # sympy (half a second of every rank's start-up), which most ranks never need.
                    out.sum().backward()
            if not isinstance(out, torch.Tensor):
                raise ConfigError(f"model.name: model {name} returns a {type(out).__name__}, expected a tensor of "
                                  "class scores")
            return out
        except ConfigError:
            raise
        except (NotImplementedError, RuntimeError) as exc:
            last = exc  # an operation without a kernel on this device, or no memory for it: try the other
        except Exception as exc:
            last = exc
            break
    text = str(last).strip().splitlines()[0] if str(last).strip() else ""
    raise ConfigError(f"model {name}: fails on a batch of {'x'.join(map(str, input_shape))} inputs: "
                      f"{type(last).__name__}: {text}")


def _cut(model: nn.Module, calls: Sequence[LayerCall], split_at: Optional[str], name: str) -> Optional[int]:
    """Return the index of the first head call: `split_at`'s first call, or the first Linear after the last Conv2d."""
    if split_at is not None:
        modules = dict(model.named_modules())
        if split_at not in modules or split_at == "":
            raise ConfigError(f"model.split_at: got {split_at!r}, model {name} has no module of that name "
                              f"(top-level modules: {', '.join(n for n, _ in model.named_children())})")
        for i, call in enumerate(calls):
            if call.name == split_at or call.name.startswith(split_at + "."):
                return i
        raise ConfigError(f"model.split_at: module {split_at!r} of model {name} is never called in its forward pass")
    last_conv = max((i for i, c in enumerate(calls) if c.kind == "Conv2d"), default=-1)
    return next((i for i, c in enumerate(calls) if i > last_conv and c.kind == "Linear"), None)


def _head_parameters(model: nn.Module, calls: Sequence[LayerCall], cut: Optional[int]) -> FrozenSet[str]:
    """Return the names of the parameters of leaf modules that run only at or after the cut."""
    if cut is None:
        return frozenset()
    before = {c.name for c in calls[:cut]}
    head_modules = {c.name for c in calls[cut:]} - before
    modules = dict(model.named_modules())
    return frozenset(f"{m}.{p}" for m in head_modules for p, _ in modules[m].named_parameters(recurse=False))


def split_parameters(model: nn.Module, placement: Placement) -> Tuple[List[nn.Parameter], List[nn.Parameter]]:
    """Return (trunk, head) parameters in the model's own order: the head is what runs after the cut."""
    trunk, head = [], []
    for key, p in model.named_parameters():
        (head if key in placement.head else trunk).append(p)
    return trunk, head
