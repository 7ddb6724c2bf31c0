"""What `psf model-info` prints: where each layer of a model runs, with its parameters and activations."""

from __future__ import annotations

import math
from collections import Counter
from typing import List, Optional

from torch import nn

from psframework.models.placement import Placement

FLOAT_BYTES = 4


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def _size(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def coded_rows(placement: Placement, k: int, symbol_size: int, packet_length) -> List[str]:
    """Return one line per coded convolution: geometry, shapes, symbols per block, zero padding, packet size.

    `packet_length(block_symbols)` gives a packet's symbols for blocks of that many symbols (the code's shifts).
    """
    lines = [f"  {'#':>3} {'layer':<26} {'weight':<14} {'stride/pad/dil':<15} {'input':<11} {'output':<11} "
             f"{'sym/block':>9} {'zero ch':>7} {'packet ch':>9} {'dX':>3}"]
    for c in placement.coded:
        g = c.geometry
        symbols = -(-g.out_channels // (k * symbol_size))
        pad = symbols * k * symbol_size - g.out_channels
        packet = packet_length(symbols) * symbol_size
        geometry = f"{g.stride[0]}/{g.padding[0]}/{g.dilation[0]}" + ("" if g.bias else " nb")
        lines.append(f"  {c.index:>3} {c.name:<26} {_shape(g.weight_shape):<14} {geometry:<15} "
                     f"{_shape(c.input_shape):<11} {_shape(c.output_shape):<11} {symbols:>9} {pad:>7} {packet:>9} "
                     f"{'yes' if c.needs_input_grad else 'no':>3}")
    return lines


def server_layers(placement: Placement) -> str:
    """Return the kinds of layers rank 0 runs between and after the coded convolutions, with counts."""
    coded = set(placement.coded_names)
    kinds = Counter(c.kind for c in placement.calls if c.name not in coded)
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(kinds.items())) or "none"


def sides(model: nn.Module, placement: Placement, k: int, cut_features: Optional[tuple]) -> List[str]:
    """Return the parameters and activations of each side, per scheme family."""
    sizes = {key: p.numel() for key, p in model.named_parameters()}
    total = sum(sizes.values())
    coded = sum(sizes[key] for key in placement.worker_parameter_names())
    head = sum(sizes[key] for key in placement.head)
    outputs = [math.prod(c.output_shape) for c in placement.calls]
    cut = len(outputs) if placement.cut is None else placement.cut
    coded_acts = sum(math.prod(c.input_shape) + math.prod(c.output_shape) for c in placement.coded)
    lines = [f"parameters: total {total:,}; coded convolutions {coded:,} ({100 * coded / max(total, 1):.1f}%), "
             f"head {head:,} ({100 * head / max(total, 1):.1f}%)",
             f"coded schemes: each worker holds {2 * coded / k:,.0f} coded values (row and column copies, 1/k each); "
             f"rank 0 trains {total - coded:,} parameters; per sample, each coded layer's input and output cross "
             f"rank 0's link: {_size(FLOAT_BYTES * coded_acts)}",
             f"activations per sample: trunk {_size(FLOAT_BYTES * sum(outputs[:cut]))}, "
             f"head {_size(FLOAT_BYTES * sum(outputs[cut:]))}"]
    if cut_features is not None:
        lines.append(f"stanza: workers run the trunk ({total - head:,} parameters), rank 0 the head ({head:,}); "
                     f"features {_shape(cut_features)} per sample ({_size(FLOAT_BYTES * math.prod(cut_features))})")
    return lines
