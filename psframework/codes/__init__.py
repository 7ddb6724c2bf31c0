"""Erasure codes for coded model-parallel training: pure maths, no MPI, no torch.nn.

Codes (one interface, `Code`): `SAZDCode(n, k, systematic=True)` (shift-and-addition coding with
compiled zigzag decoding), `PolyCode(n, k, nodes="chebyshev")` (real Vandermonde baseline) and
`UncodedCode(k)` (plain split, n = k); `make_code(kind, n, k)` builds one by kind. Each has
`n`, `k`, `padding` (extra symbols per packet), `encode(blocks, axis=0, symbol_size=1) -> list` of n
packets, `decode(packets, axis=0, symbol_size=1) -> list` of k blocks from any k packets given as
{index: array}, `decode_joined(...)` (the blocks back to back), `packet_length(block_length,
symbol_size=1)` and `choose_packets(available)` (the k packets decode uses). SAZDCode's decode
and decode_joined also take `out=` (a contiguous array from an earlier decode, reused) and `threads=`
(host threads for a large decode; the result is bit-identical whatever the count). Arrays may be
NumPy, torch (CPU or CUDA) or CuPy; integers wrap around, so integer coding is bit-exact.

Layout helpers:
  split_blocks(x, k, axis=0, symbol_size=1) -> list   cut into k blocks, zero-padding the length to a
                                                      multiple of k * symbol_size
  join_blocks(blocks, axis=0, length=None) -> array   join decoded blocks, dropping the padding
  choose_symbol_size(channels_per_block, max_symbols)  elements per symbol keeping L <= max_symbols
  plan_layout(length, k, max_symbols=None, symbol_size=None) -> BlockLayout
  wide_layout(length, k, padding) -> BlockLayout       the widest symbols within WIDE_OVERHEAD extra
                                                      bytes per packet (bit-exact coding of integers)
  max_symbols_within(code, budget, ...) -> int         largest L whose measured worst-case error fits
  measure_decode_error(code, symbols, ...) -> ErrorReport
Bit-exact transport:
  to_bits(x) / from_bits(x, dtype)                     float tensor <-> same-width integer view
Decode threads (default: PSF_DECODE_THREADS, else the usable cores, at most 4):
  set_decode_threads(n) / get_decode_threads()         set (None: back to the default) / read the default
"""

from psframework.codes.accuracy import ErrorReport, arrival_sets, max_symbols_within, measure_decode_error
from psframework.codes.base import Code
from psframework.codes.bits import from_bits, to_bits
from psframework.codes.factory import CODE_KINDS, make_code
from psframework.codes.layout import (WIDE_OVERHEAD, BlockLayout, choose_symbol_size, join_blocks,
                                      plan_layout, split_blocks, wide_layout)
from psframework.codes.poly import NODES, PolyCode, UncodedCode, vandermonde_nodes
from psframework.codes.sazd import SAZDCode, has_increasing_difference, nonsystematic_shifts, systematic_shifts
from psframework.codes.threads import get_decode_threads, set_decode_threads
from psframework.codes.zigzag import NotDecodableError, Schedule, compile_schedule

__all__ = [
    "BlockLayout", "CODE_KINDS", "Code", "ErrorReport", "NODES", "NotDecodableError", "PolyCode", "SAZDCode",
    "Schedule", "UncodedCode", "arrival_sets", "choose_symbol_size", "compile_schedule", "from_bits",
    "get_decode_threads", "has_increasing_difference", "join_blocks", "make_code", "max_symbols_within",
    "measure_decode_error", "nonsystematic_shifts", "plan_layout", "set_decode_threads", "split_blocks",
    "systematic_shifts", "to_bits", "vandermonde_nodes", "WIDE_OVERHEAD", "wide_layout",
]
