"""Mixed precision of the coded convolution: workers convolve in bf16 or fp16, the server decodes in fp32.

The coded convolution is linear (docs/design.md#mixed-precision-of-the-coded-convolution), so worker j
may compute its packet conv(X, Wr_j) + br_j in a low precision; rank 0 casts the replies to fp32 and
decodes any k of them. For one seeded conv layer this measures, over EVERY k-subset of the n packets, the decoded output
against (a) the uncoded convolution computed in the same precision and (b) the fp32 convolution,
next to the precision's own rounding (the uncoded low-precision convolution against fp32), so what
decoding adds shows as a ratio. Weights and biases are encoded in fp32 and each packet cast to the
precision, as a worker holding fp32 master weights under autocast does.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from psframework.codes import Code, PolyCode, SAZDCode
from psframework.models.placement import geometry_of
from psframework.schemes.coded.layers import LayerCoding
from psframework.schemes.coded.state import rel_diff

PAIRS = [(4, 3), (6, 4), (8, 6), (12, 8)]
QUICK_PAIRS = 2  # --quick measures the first two pairs
PRECISIONS: Dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
CODES: List[Tuple[str, Callable[[int, int], Code]]] = [
    ("SAZD", lambda n, k: SAZDCode(n, k)),
    ("Poly chebyshev", lambda n, k: PolyCode(n, k, "chebyshev")),
]
IN_CHANNELS, OUT_CHANNELS, KERNEL, PADDING = 16, 32, 3, 1
INPUT_SHAPE = (8, IN_CHANNELS, 8, 8)
SYMBOL_SIZE = 1  # channels per symbol, as CodeSettings.symbol_size defaults
NATIVE, EMULATED = "native", "emulated"
TORCH_THREADS = 1  # the convolutions are tiny: more threads only wait on each other on a busy machine


@dataclass(frozen=True)
class Problem:
    """A seeded conv layer, its input, and its fp32 output."""

    conv: nn.Conv2d
    x: torch.Tensor
    reference: torch.Tensor  # the fp32 convolution


def make_problem(seed: int) -> Problem:
    """Return the seeded layer (kaiming-normal weight, default-range bias) and an N(0, 1) input."""
    generator = torch.Generator().manual_seed(seed)
    conv = nn.Conv2d(IN_CHANNELS, OUT_CHANNELS, KERNEL, padding=PADDING)
    bound = 1.0 / (IN_CHANNELS * KERNEL * KERNEL) ** 0.5
    with torch.no_grad():
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu", generator=generator)
        conv.bias.uniform_(-bound, bound, generator=generator)
    x = torch.randn(INPUT_SHAPE, generator=generator)
    with torch.no_grad():
        reference = conv(x)
    return Problem(conv, x, reference)


def conv_mode(dtype: torch.dtype) -> str:
    """Return NATIVE where this torch build convolves in `dtype` on the CPU, else EMULATED."""
    try:
        F.conv2d(torch.ones(1, 1, 3, 3, dtype=dtype), torch.ones(1, 1, 1, 1, dtype=dtype))
    except (RuntimeError, NotImplementedError):
        return EMULATED
    return NATIVE


def low_precision_conv(coding: LayerCoding, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       dtype: torch.dtype, mode: str) -> torch.Tensor:
    """Return conv(x, weight) + bias computed in `dtype`, cast back to fp32 (the reply the server decodes).

    NATIVE: torch's CPU convolution in `dtype`. EMULATED: inputs rounded to `dtype`, accumulated in fp32,
    output rounded to `dtype`.
    """
    args = coding.conv_args()
    b = None if bias is None else bias.to(dtype)
    if mode == NATIVE:
        return F.conv2d(x.to(dtype), weight.to(dtype), b, *args).float()
    out = F.conv2d(x.to(dtype).float(), weight.to(dtype).float(), None if b is None else b.float(), *args)
    return out.to(dtype).float()


def layer_coding(conv: nn.Conv2d, k: int) -> LayerCoding:
    """Return the coding of one Conv2d as `layer_codings` builds it for a placement (no column copy)."""
    return LayerCoding(0, geometry_of(conv), k, SYMBOL_SIZE, False)


def subset_errors(code: Code, coding: LayerCoding, replies: Sequence[torch.Tensor],
                  targets: Dict[str, torch.Tensor]) -> Dict[str, List[Tuple[float, Tuple[int, ...]]]]:
    """Decode every k-subset of `replies` in fp32; return per target its (relative max error, subset) list."""
    errors: Dict[str, List[Tuple[float, Tuple[int, ...]]]] = {name: [] for name in targets}
    for used in itertools.combinations(range(code.n), code.k):
        decoded = coding.decode(code, {j: replies[j] for j in used}, axis=1, length=coding.out_channels)
        for name, target in targets.items():
            errors[name].append((rel_diff(decoded, target), used))
    return errors


def precision_row(problem: Problem, name: str, code: Code, precision: str, mode: str) -> Dict[str, Any]:
    """Return the errors of one code in one precision over every k-subset of its packets."""
    start = time.perf_counter()
    dtype, conv = PRECISIONS[precision], problem.conv
    coding = layer_coding(conv, code.k)
    weight, bias = conv.weight.detach(), conv.bias.detach()
    weights, biases = coding.encode(code, weight, 0), coding.encode(code, bias, 0)  # in fp32
    replies = [low_precision_conv(coding, problem.x, w, b, dtype, mode) for w, b in zip(weights, biases)]
    same = low_precision_conv(coding, problem.x, weight, bias, dtype, mode)
    own = rel_diff(same, problem.reference)
    errors = subset_errors(code, coding, replies, {"same": same, "fp32": problem.reference})
    row: Dict[str, Any] = {"code": name, "precision": precision, "n": code.n, "k": code.k,
                           "L": -(-OUT_CHANNELS // (code.k * SYMBOL_SIZE)),
                           "subsets": len(errors["same"]), "own_rel_error": own}
    for target, values in errors.items():
        worst, packets = max(values)
        row.update({f"worst_vs_{target}": worst, f"median_vs_{target}": statistics.median(v for v, _ in values),
                    f"worst_packets_vs_{target}": list(packets),
                    f"worst_vs_{target}_over_own": worst / own if own > 0 else None})
    row["seconds"] = time.perf_counter() - start
    return row


def precision_table(pairs: Sequence[Tuple[int, int]], seed: int,
                    modes: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Return the mixed-precision table: the layer, how each precision's conv is computed, one row per cell.

    `modes` forces NATIVE or EMULATED per precision (default: what this torch build supports).
    """
    problem = make_problem(seed)
    modes = {p: (modes or {}).get(p) or conv_mode(dtype) for p, dtype in PRECISIONS.items()}
    rows = []
    with torch_threads(TORCH_THREADS):
        for n, k in pairs:
            for name, make in CODES:
                code = make(n, k)
                for precision in PRECISIONS:
                    rows.append(precision_row(problem, name, code, precision, modes[precision]))
                    print_row(rows[-1])
    layer = {"in_channels": IN_CHANNELS, "out_channels": OUT_CHANNELS, "kernel": KERNEL, "padding": PADDING,
             "input_shape": list(INPUT_SHAPE), "symbol_size": SYMBOL_SIZE, "seed": seed}
    return {"layer": layer, "conv_modes": modes, "torch_threads": TORCH_THREADS, "rows": rows}


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def print_row(row: Dict[str, Any]) -> None:
    """Print one row's worst error against the same-precision conv as a progress line."""
    ratio = row["worst_vs_same_over_own"]
    print(f"precision {row['code']:14s} ({row['n']},{row['k']}) {row['precision']}: worst {row['worst_vs_same']:.3g} "
          f"vs the {row['precision']} conv" + ("" if ratio is None else f" = {ratio:.3g}x its own rounding")
          + f" {row['own_rel_error']:.3g}, over {row['subsets']} subsets", flush=True)
