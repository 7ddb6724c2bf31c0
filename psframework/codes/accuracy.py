"""Measured decode error: the worst case over arrival sets, and the longest blocks within an error budget."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from psframework.codes.base import Code
from psframework.codes.checks import check_int


@dataclass(frozen=True)
class ErrorReport:
    """Worst relative max error of decoding, over the arrival sets tried."""

    code: str
    symbols: int  # L
    dtype: str
    worst: float  # max |decoded - true| / max |true|, worst over arrival sets
    worst_packets: Tuple[int, ...]
    arrival_sets: int
    exhaustive: bool


def arrival_sets(n: int, k: int, limit: Optional[int] = None, seed: int = 0) -> Tuple[List[Tuple[int, ...]], bool]:
    """Return the k-subsets of range(n) to try, and whether that is all of them.

    When there are more than `limit`, a seeded random sample of `limit` distinct subsets is returned.
    """
    n = check_int(n, "n", 1)
    k = check_int(k, "k", 1)
    total = math.comb(n, k)
    if limit is None or total <= limit:
        return list(itertools.combinations(range(n), k)), True
    rng = np.random.default_rng(seed)
    chosen = set()
    while len(chosen) < limit:
        chosen.add(tuple(sorted(rng.choice(n, size=k, replace=False).tolist())))
    return sorted(chosen), False


def measure_decode_error(code: Code, symbols: int, dtype: Any = np.float32, width: int = 64,
                         limit: Optional[int] = None, seed: int = 0) -> ErrorReport:
    """Encode random normal blocks of `symbols` symbols and return the worst decode error over arrival sets.

    Each block is `symbols` x `width` (axis 0, one element per symbol); the error is measured in
    float64 against the original blocks.
    """
    symbols = check_int(symbols, "symbols", 1)
    width = check_int(width, "width", 1)
    rng = np.random.default_rng(seed)
    blocks = [rng.standard_normal((symbols, width)).astype(dtype) for _ in range(code.k)]
    truth = np.stack(blocks).astype(np.float64)
    scale = float(np.abs(truth).max())
    packets = code.encode(blocks)
    sets, exhaustive = arrival_sets(code.n, code.k, limit, seed)
    worst, worst_set = -1.0, sets[0]
    for chosen in sets:
        decoded = code.decode({j: packets[j] for j in chosen})
        error = float(np.abs(np.stack(decoded).astype(np.float64) - truth).max()) / scale
        if not error <= worst:  # also catches NaN
            worst, worst_set = error, chosen
    return ErrorReport(repr(code), symbols, np.dtype(dtype).name, worst, tuple(worst_set), len(sets), exhaustive)


def max_symbols_within(code: Code, budget: float, candidates: Sequence[int] = (4, 8, 16, 32, 64),
                       dtype: Any = np.float32, limit: Optional[int] = 200, seed: int = 0) -> int:
    """Return the largest L in `candidates` whose measured worst-case relative error stays within `budget`.

    Feed the result to `choose_symbol_size` as `max_symbols`. Raises ValueError when none fits.
    """
    if not budget > 0:
        raise ValueError(f"budget must be a positive relative error, got {budget!r}")
    best = 0
    for symbols in sorted(check_int(c, "candidate symbols", 1) for c in candidates):
        if measure_decode_error(code, symbols, dtype=dtype, limit=limit, seed=seed).worst <= budget:
            best = symbols
        else:
            break  # the error grows with L
    if not best:
        raise ValueError(f"no block length in {list(candidates)} keeps {code!r} within relative error {budget:g}")
    return best
