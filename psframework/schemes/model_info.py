"""What `psf model-info` prints: where each layer of a model runs, with its parameters and activations."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any, List, Optional

from torch import nn

from psframework.errors import ConfigError

from psframework.models.cut import cut_model
from psframework.models.placement import Placement
from psframework.schemes.preflight import gib

FLOAT_BYTES = 4


def _shape(shape) -> str:
    return "x".join(map(str, shape))


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
             f"rank 0's link: {gib(FLOAT_BYTES * coded_acts)}",
             f"activations per sample: trunk {gib(FLOAT_BYTES * sum(outputs[:cut]))}, "
             f"head {gib(FLOAT_BYTES * sum(outputs[cut:]))}"]
    if cut_features is not None:
        lines.append(f"stanza: workers run the trunk ({total - head:,} parameters), rank 0 the head ({head:,}); "
                     f"features {_shape(cut_features)} per sample ({gib(FLOAT_BYTES * math.prod(cut_features))})")
    return lines


def model_info(cfg: Any) -> List[str]:
    """Return the lines of `psf model-info`: coded layers, rank 0's layers, the Stanza cut, each side's sizes."""
    from psframework.schemes.coded.layers import code_of
    from psframework.schemes.common import input_shape, meta_model, placement_of
    from psframework.schemes.registry import get_scheme
    from psframework.settings import code_settings

    model = meta_model(cfg)
    placement = placement_of(cfg, model)
    settings = code_settings(cfg, get_scheme(cfg.scheme).code)
    code = code_of(settings if settings.kind else replace(settings, kind="shift-add"))
    k, size = settings.k, settings.symbol_size
    shape = "x".join(map(str, input_shape(cfg)))
    lines = [f"model {cfg.model.name}: input {shape}, {placement.output_shape[0]} classes; "
             f"coded with {code!r}, {size} channel(s) per symbol",
             f"coded convolutions (on the workers in sazd, sazd-naive, poly, uncoded): {len(placement.coded)}"]
    lines += coded_rows(placement, k, size, lambda symbols: code.packet_length(symbols, 1))
    lines.append(f"on rank 0: {server_layers(placement)}")
    for name, why in placement.on_server.items():
        lines.append(f"  convolution {name} runs on rank 0: {why}")
    try:
        features = cut_model(model, placement, cfg.model.name).feature_shape
        lines.append(f"stanza cut: before {placement.calls[placement.cut].name!r} "
                     f"(model.split_at={cfg.model.split_at or 'default'})")
    except ConfigError as exc:
        features = None
        lines.append(f"stanza cut: none ({exc})")
    return lines + sides(model, placement, k, features)
