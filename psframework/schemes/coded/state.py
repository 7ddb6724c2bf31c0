"""The coded convolutions' state as it crosses between rank 0 and the workers.

Rank 0 sends the uncoded state (each layer's weight, bias, and their momentum) as one flat vector;
worker j encodes its packets of it (distributed encoding). Workers send their coded state back
(every coded tensor, then its momentum) and rank 0 decodes the uncoded state from any k of them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from psframework.codes import Code
from psframework.schemes.coded.layers import CodedWeights, LayerCoding, encode_layer, tensor_names
from psframework.schemes.vectors import unpack

Momentum = List[Dict[str, Optional[torch.Tensor]]]  # per layer: "weight_momentum" and "bias_momentum"


def conv_state_tensors(model: nn.Module, names: Sequence[str], momentum: Optional[Momentum]) -> List[torch.Tensor]:
    """Return [W, b, momentum W, momentum b] of every coded convolution (no b without bias; zeros for no momentum)."""
    modules = dict(model.named_modules())
    out = []
    for i, name in enumerate(names):
        conv = modules[name]
        params = [conv.weight.detach()] + ([] if conv.bias is None else [conv.bias.detach()])
        keys = ("weight_momentum", "bias_momentum")
        out += params + [momentum[i][key] if momentum else torch.zeros_like(p) for key, p in zip(keys, params)]
    return out


def conv_state_shapes(codings: Sequence[LayerCoding]) -> List[torch.Size]:
    """Return the shapes of `conv_state_tensors`."""
    shapes: List[torch.Size] = []
    for c in codings:
        params = [torch.Size(c.geometry.weight_shape)] + ([torch.Size([c.out_channels])] if c.has_bias else [])
        shapes += params * 2
    return shapes


def encode_state(code: Code, codings: Sequence[LayerCoding], state: torch.Tensor,
                 j: int) -> Tuple[List[CodedWeights], List[CodedWeights]]:
    """Return worker j's packets of an uncoded conv state (`conv_state_tensors`, flat): weights, momentum."""
    tensors = iter(unpack(state, conv_state_shapes(codings)))
    weights, buffers = [], []
    for coding in codings:
        w, b = next(tensors), next(tensors) if coding.has_bias else None
        mw, mb = next(tensors), next(tensors) if coding.has_bias else None
        weights.append(encode_layer(coding, code, w, b, j)[0])
        buffers.append(encode_layer(coding, code, mw, mb, j)[0])
    return weights, buffers


def worker_state_shapes(codings: List[LayerCoding], code: Code) -> List[torch.Size]:
    """Return the shapes of a worker's `EncodingWorker.state()` tensors (each tensor, then its momentum)."""
    shapes = []
    for c in codings:
        row = torch.Size(c.row_shape(code))
        named = {"weight": row, "bias": torch.Size(row[:1]), "col_weight": torch.Size(c.col_shape(code))}
        for name in tensor_names(c):
            shapes += [named[name]] * 2
    return shapes


def decode_conv_state(code: Code, codings: List[LayerCoding], states: Dict[int, List[torch.Tensor]]
                      ) -> List[Dict[str, torch.Tensor]]:
    """Decode uncoded weights, biases and momentum buffers from k workers' `EncodingWorker.state()`.

    Each layer gives {"weight", "weight_momentum", "bias", "bias_momentum", "col_weight"}; the bias
    entries are None for a layer without bias, "col_weight" for a layer without a column copy.
    """
    layers, base = [], 0
    for coding in codings:
        layer: Dict[str, Any] = {"bias": None, "bias_momentum": None, "col_weight": None}
        for name in tensor_names(coding):
            for offset, key in enumerate((name, f"{name}_momentum")):
                part = {j: s[base + offset] for j, s in states.items()}
                if name == "col_weight":
                    layer[key] = coding.decode(code, part, axis=1, length=coding.in_channels)
                else:
                    layer[key] = coding.decode(code, part, axis=0, length=coding.out_channels)
            base += 2
        layers.append(layer)
    return layers


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return max |a - b| relative to max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
