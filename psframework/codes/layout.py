"""Symbol layout: cutting a tensor into k coded blocks and joining decoded blocks back.

A tensor of `length` elements along the coded axis (a layer's channels) is zero-padded to
k * L * symbol_size and cut into k blocks of L symbols; `symbol_size` elements (channels) make one
symbol. The zigzag decoder's rounding error grows with L, so `choose_symbol_size` groups channels
into symbols until L fits a budget (see `psframework.codes.accuracy` for measured budgets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from psframework.arrays import arithmetic_backend, axis_index, common_backend
from psframework.codes.checks import check_axis, check_int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_symbol_size(channels_per_block: int, max_symbols: int) -> int:
    """Return the fewest elements per symbol that keep a block of `channels_per_block` within `max_symbols` symbols.

    Among symbol sizes giving that many symbols, the smallest is returned, which keeps padding below one
    symbol per block.
    """
    channels_per_block = check_int(channels_per_block, "channels_per_block", 1)
    max_symbols = check_int(max_symbols, "max_symbols", 1)
    size = _ceil_div(channels_per_block, max_symbols)
    symbols = _ceil_div(channels_per_block, size)
    return _ceil_div(channels_per_block, symbols)


@dataclass(frozen=True)
class BlockLayout:
    """How `length` elements along an axis are padded and cut into k blocks of whole symbols."""

    length: int
    k: int
    symbol_size: int

    def __post_init__(self) -> None:
        check_int(self.length, "length", 1)
        check_int(self.k, "k", 1)
        check_int(self.symbol_size, "symbol_size", 1)

    @property
    def symbols(self) -> int:
        """Return L, the number of symbols per block."""
        return _ceil_div(self.length, self.k * self.symbol_size)

    @property
    def block_length(self) -> int:
        """Return the elements per block along the axis."""
        return self.symbols * self.symbol_size

    @property
    def padded_length(self) -> int:
        """Return the padded length, k blocks back to back."""
        return self.k * self.block_length

    @property
    def padding(self) -> int:
        """Return the number of zero elements appended before cutting."""
        return self.padded_length - self.length


# Wide symbols: packets are `padding` symbols longer than a block, so L = padding / WIDE_OVERHEAD
# symbols per block keep the extra bytes within this fraction. Bit-exact (integer) coding has no
# rounding error to bound, so this is the only limit on the symbol width. Compiling a schedule takes
# about 0.3-0.7 ms per symbol and decoding makes about 6 array calls per symbol, so L stays within
# WIDE_MAX_SYMBOLS: codes with long shifts (non-systematic ones, or many parity packets) pay more bytes.
WIDE_OVERHEAD = 1 / 32
WIDE_MAX_SYMBOLS = 128


def wide_layout(length: int, k: int, padding: int, max_overhead: float = WIDE_OVERHEAD) -> BlockLayout:
    """Return the layout of `length` elements in k blocks of the fewest, widest symbols a code allows.

    A code whose packets are `padding` symbols longer than a block gets L = ceil(padding / max_overhead)
    symbols per block (one when it pads nothing), at most WIDE_MAX_SYMBOLS, so its packets carry about
    `max_overhead` more than a block (padding / WIDE_MAX_SYMBOLS where that is more). Decoding then
    costs a number of array calls set by the code alone, however long the tensor, each call moving a
    whole symbol at memory speed.
    """
    length = check_int(length, "length", 1)
    k = check_int(k, "k", 1)
    padding = check_int(padding, "padding", 0)
    if not 0 < max_overhead <= 1:
        raise ValueError(f"max_overhead must be in (0, 1], got {max_overhead!r}")
    symbols = min(max(1, math.ceil(padding / max_overhead)), WIDE_MAX_SYMBOLS, _ceil_div(length, k))
    return BlockLayout(length, k, _ceil_div(length, k * symbols))


def plan_layout(length: int, k: int, max_symbols: Optional[int] = None, symbol_size: Optional[int] = None
                ) -> BlockLayout:
    """Return the layout of `length` elements in k blocks, with a given symbol size or one chosen for `max_symbols`."""
    length = check_int(length, "length", 1)
    k = check_int(k, "k", 1)
    if (max_symbols is None) == (symbol_size is None):
        raise ValueError("give exactly one of max_symbols and symbol_size")
    if symbol_size is None:
        symbol_size = choose_symbol_size(_ceil_div(length, k), max_symbols)
    return BlockLayout(length, k, check_int(symbol_size, "symbol_size", 1))


def split_blocks(x: Any, k: int, axis: int = 0, symbol_size: int = 1) -> List[Any]:
    """Cut `x` along `axis` into k equal blocks, zero-padding its length to a multiple of k * symbol_size.

    Blocks that lie within `x` are views of it; a block that reaches past its end is a zero-padded copy
    of what it holds of `x` (so padding copies at most one block's worth, not the whole tensor).
    """
    backend = arithmetic_backend(x)
    backend.check_dtype(x.dtype)
    x = backend.prepare(x)
    axis = check_axis(axis, len(x.shape))
    layout = BlockLayout(check_int(x.shape[axis], "length along the axis", 1), k, symbol_size)
    step = layout.block_length
    blocks = []
    for i in range(layout.k):
        start, stop = i * step, (i + 1) * step
        if stop <= layout.length:
            blocks.append(x[axis_index(axis, start, stop)])
            continue
        shape = list(x.shape)
        shape[axis] = step
        block = backend.empty(shape, like=x)
        held = max(0, layout.length - start)
        if held:
            backend.copy(block[axis_index(axis, 0, held)], x[axis_index(axis, start, layout.length)])
        backend.fill_zero(block[axis_index(axis, held, step)])
        blocks.append(block)
    return blocks


def join_blocks(blocks: Sequence[Any], axis: int = 0, length: Optional[int] = None) -> Any:
    """Join blocks along `axis` into one new contiguous array, keeping the first `length` elements when given."""
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise ValueError(f"blocks must be a non-empty list or tuple of arrays, got {blocks!r:.60}")
    backend = common_backend(list(blocks), "block", list(range(len(blocks))))
    blocks = [backend.prepare(b) for b in blocks]
    axis = check_axis(axis, len(blocks[0].shape))
    step = blocks[0].shape[axis]
    total = step * len(blocks)
    length = total if length is None else check_int(length, "length", 0)
    if length > total:
        raise ValueError(f"length {length} exceeds the {total} elements of the blocks along axis {axis}")
    shape = list(blocks[0].shape)
    shape[axis] = length
    out = backend.empty(shape, like=blocks[0])
    for i, block in enumerate(blocks):
        stop = min(step, length - i * step)
        if stop <= 0:
            break
        backend.copy(out[axis_index(axis, i * step, i * step + stop)], block[axis_index(axis, 0, stop)])
    return out
