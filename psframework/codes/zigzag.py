"""Zigzag (peeling) decoding of shift-and-addition codes, compiled into vectorised slice operations.

Which symbol is solved from which packet, and in what order, depends only on the shift matrix, the
packets used and the block length L (in symbols), never on the data. `compile_schedule` works that
order out once: it picks, for every symbol, the equation (packet position) with the smallest
estimated rounding error, then groups the solved symbols into levels of mutually independent
solutions. Within a level, consecutive symbols solved from the same packet merge into one slice,
and a lone symbol whose terms are evenly spaced in the decoded buffer (always so for the systematic
and non-systematic constructions) is solved by one strided sum. The result is a short tuple of
operations that only copy, add and subtract; it is cached per arrival set and block length.

The operations become array calls (`row_calls`, made with the schedule). The negated packet symbols
that RNEG operations start from are written before the first level, neighbours merged into one
slice. Arrays in host
memory (NumPy, and CPU torch tensors through zero-copy NumPy views) are decoded through one canonical
view, (outer, symbols, columns), in which every call treats each column alike: a large decode splits
the columns (or the outer rows) into stripes that threads decode at once, each running the whole
schedule on its stripe. Every element sees the same operations in the same order whatever the split,
so the result does not depend on the thread count. Other arrays (CUDA tensors, CuPy) run the same
calls on the same canonical views through their backend, in one stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache, partial
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from psframework.arrays import Backend
from psframework.codes.threads import POOL

# Operation kinds. Offsets and lengths are in symbols; "out" is the decoded buffer, block i of which
# starts at symbol i * L. Op = (kind, dst, n, slot, src, terms).
COPY = 0  # out[dst:dst+n] = packet[slot][src:src+n]                     terms: None
SUB = 1  # out[dst:dst+n] = packet[slot][src:src+n] - out[terms:terms+n]  terms: int
ISUB = 2  # out[dst:dst+n] -= out[terms:terms+n]                          terms: int
# One symbol (n == 1) just before the evenly spaced run of its terms, terms = (start, count, step):
# out[dst] = packet[slot][src] - sum(out[start + c*step] for c < count).
RSUB = 3
# One symbol inside or at the end of the evenly spaced run of its terms and itself, terms = (start, count,
# step) including dst: out[dst] = -packet[slot][src]; then out[dst] = -sum(out[start + c*step] for c < count).
RNEG = 4

Op = Tuple[int, int, int, int, int, Any]

# Primitive calls the bound schedules are made of, one array operation each: (call, a, b, c).
_COPY_P = 0  # out[a] = packets[b][c]
_SUB_PO = 1  # out[a] = packets[b][c[0]] - out[c[1]]
_ISUB_O = 2  # out[a] -= out[b]
_NEG_P = 3  # out[a] = -packets[b][c]
_NSUM = 5  # rows[c] = -(sum of rows[a] over the run axis), where rows[c] may be one of the summed symbols
# Canonical calls only: rows[c[0]] = packets[b][c[1]] - (sum of rows[a] over the run axis); c[2]: terms
_PSUM = 6

# A threaded decode gives each stripe at least this many bytes of every symbol (over all outer rows).
# Every call then works long enough, without the interpreter lock, that the threads seldom wait for
# it. On the 2-core machine of docs/benchmarks/codec.md two threads lost 5-10% with 32 KiB stripes
# and gained 1.1-1.4x with 48-256 KiB ones (`psf bench codec`, decode threads table).
MIN_STRIPE_SYMBOL_BYTES = 48 << 10
_CACHE_LINE = 64  # column stripes start on cache-line multiples, so two threads never write one line
# A block set too small ever to be split sums at most _BLAS_MAX_TERMS symbols of these dtypes as a
# matrix-vector product with BLAS, which reads each symbol once: a ufunc reduction rereads and
# rewrites the partial sum for every symbol, up to 1.7 times the time of one sum in cache and 1.1-1.2
# times that of a whole (12,8) decode.
# BLAS groups the terms by where a column falls in its call, so a split block set could round
# differently from an unsplit one: block sets large enough to split always take the reduction, whose
# order (increasing, for every column) no split changes. Longer sums take the reduction too: BLAS
# regroups them, which measurably raised the worst-case decode error of the (16,12) and (20,16) codes.
_BLAS_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
_BLAS_MAX_TERMS = 8
_minus_ones: dict = {}  # (terms, dtype) -> vector of -1


class NotDecodableError(ValueError):
    """Raised when the chosen packets cannot be zigzag decoded."""


@dataclass(frozen=True, eq=False)
class Schedule:
    """A compiled zigzag decoder for one set of packets and one block length."""

    used: Tuple[int, ...]  # packet indices, in slot order
    symbols: int  # L, symbols per block
    blocks: int  # k
    ops: Tuple[Op, ...]
    levels: int  # peeling levels (the depth of the dependency chain)

    @property
    def symbol_ops(self) -> int:
        """Return how many symbols the operations read from the packets and the decoded buffer."""
        total = 0
        for kind, _, n, _, _, terms in self.ops:
            if kind in (RSUB, RNEG):
                total += 1 + terms[1]
            else:
                total += n if kind == COPY else 2 * n
        return total

    @cached_property
    def row_calls(self) -> Tuple[Tuple[int, Any, Any, Any], ...]:
        """Return the schedule as primitive calls on canonical (outer, symbols, columns) views.

        Every index is (all outer rows, symbols), so the same calls decode any stripe of columns or rows.
        """
        every = slice(None)

        def span(start: int, n: int = 1) -> Tuple[slice, slice]:
            return every, slice(start, start + n)

        def run(start: int, count: int, step: int) -> Tuple[slice, slice]:
            return every, slice(start, start + (count - 1) * step + 1, step)

        negations: List[Tuple[int, int, int]] = []
        calls: List[Tuple[int, Any, Any, Any]] = []
        for kind, dst, n, slot, src, terms in self.ops:
            if kind == COPY:
                calls.append((_COPY_P, span(dst, n), slot, span(src, n)))
            elif kind == SUB:
                calls.append((_SUB_PO, span(dst, n), slot, (span(src, n), span(terms, n))))
            elif kind == ISUB:
                calls.append((_ISUB_O, span(dst, n), span(terms, n), None))
            elif kind == RSUB:  # packet - sum rounds exactly as -sum + packet
                calls.append((_PSUM, run(*terms), slot, ((every, dst), (every, src), terms[1])))
            else:
                calls.append((_NSUM, run(*terms), terms[1], (every, dst)))
                negations.append((slot, dst, src))
        first = [(_NEG_P, span(dst, n), slot, span(src, n)) for slot, dst, src, n in _merge_runs(negations)]
        return tuple(first + calls)

    def run(self, backend: Backend, packets: Sequence[Any], out: Any, axis: int, symbol_size: int,
            threads: int = 1) -> None:
        """Decode `packets` (in slot order) into `out`, contiguous, k * L * symbol_size long along `axis`.

        Host arrays decode in up to `threads` threads when the symbols are large enough (see plan_stripes).
        """
        shape = tuple(out.shape)
        a, s = axis, symbol_size
        outer, width = math.prod(shape[:a]), s * math.prod(shape[a + 1:])
        views = backend.host_views([out, *packets])
        host = views is not None
        if host:
            out, *packets = views
        # One row per symbol: a strided slice of rows is an evenly spaced run of symbols. The packets
        # reshape to views wherever their strides allow (always when they are contiguous).
        rows = out.reshape(outer, shape[a] // s, width)
        canonical = [p.reshape(outer, p.shape[a] // s, width) for p in packets]
        calls = self.row_calls
        if not host:  # device arrays: one stream, no host threads
            run_backend_rows(backend, calls, canonical, rows)
            return
        if outer * width * out.itemsize < 2 * MIN_STRIPE_SYMBOL_BYTES:  # never split, whatever the threads
            run_rows(calls, canonical, rows, blas=True)
        else:
            run_striped(calls, canonical, rows, plan_stripes(outer, width, out.itemsize, threads))


def plan_stripes(outer: int, width: int, itemsize: int, threads: int) -> List[Tuple[slice, slice]]:
    """Return the (outer rows, columns) stripes a host decode runs in parallel, one per thread.

    Each stripe gets at least MIN_STRIPE_SYMBOL_BYTES of every symbol, so small decodes stay in one
    stripe. Whole outer rows are split when they divide evenly (longer contiguous pieces), else columns,
    on cache-line boundaries.
    """
    every = slice(None)
    count = min(threads, outer * width * itemsize // MIN_STRIPE_SYMBOL_BYTES)
    if count >= 2 and outer % count == 0:
        step = outer // count
        return [(slice(i * step, (i + 1) * step), every) for i in range(count)]
    align = max(1, _CACHE_LINE // itemsize)
    count = min(count, width // align)
    if count < 2:
        return [(every, every)]
    bounds = [round(width * i / count / align) * align for i in range(count)] + [width]
    return [(every, slice(start, stop)) for start, stop in zip(bounds, bounds[1:]) if stop > start]


def run_striped(calls: Sequence[Tuple[int, Any, Any, Any]], packets: Sequence[Any], rows: Any,
                stripes: Sequence[Tuple[slice, slice]]) -> None:
    """Run canonical calls on every stripe of `rows` and `packets`, the stripes on the decode threads at once."""
    if len(stripes) == 1:
        run_stripe(calls, packets, rows, stripes[0])
    else:
        POOL.run([partial(run_stripe, calls, packets, rows, stripe) for stripe in stripes])


def run_stripe(calls: Sequence[Tuple[int, Any, Any, Any]], packets: Sequence[Any], rows: Any,
               stripe: Tuple[slice, slice]) -> None:
    """Run canonical calls on one (outer rows, columns) stripe of `rows` and `packets`."""
    lines, columns = stripe
    if lines != slice(None) or columns != slice(None):
        rows = rows[lines, :, columns]
        packets = [p[lines, :, columns] for p in packets]
    run_rows(calls, packets, rows)


def run_rows(calls: Sequence[Tuple[int, Any, Any, Any]], packets: Sequence[Any], rows: Any,
             blas: bool = False) -> None:
    """Execute canonical calls on NumPy views: copies, negations, subtractions and strided sums.

    Each strided sum adds its symbols in increasing order with one ufunc reduction, the same order for
    every column; with `blas`, sums of at most _BLAS_MAX_TERMS floating symbols are BLAS products.
    """
    dtype = rows.dtype.type  # the scalar type: a ufunc's dtype argument may not name a byte order
    blas = blas and rows.dtype in _BLAS_DTYPES
    scratch = np.empty((rows.shape[0], rows.shape[2]), dtype=rows.dtype)  # one symbol
    # Integers wrap around by design (bit-exact coding): NumPy's overflow warning is no news. Each
    # thread has its own error state, so it is set here, where every stripe runs.
    with np.errstate(over="ignore"):
        _run_calls(calls, packets, rows, scratch, dtype, blas)


def _run_calls(calls: Sequence[Tuple[int, Any, Any, Any]], packets: Sequence[Any], rows: Any, scratch: Any,
               dtype: Any, blas: bool) -> None:
    """Execute canonical calls as run_rows describes, `scratch` holding one symbol."""
    add_reduce, subtract, negative, add, matmul = np.add.reduce, np.subtract, np.negative, np.add, np.matmul
    for call, a, b, c in calls:
        if call == _NSUM:
            if blas and b <= _BLAS_MAX_TERMS:
                # NumPy gives an `out` overlapping the input the result it would have without the overlap.
                matmul(_minus_ones_vector(b, dtype), rows[a], out=rows[c])
            else:
                add_reduce(rows[a], axis=1, dtype=dtype, out=scratch)
                negative(scratch, out=rows[c])
        elif call == _PSUM:
            if blas and c[2] <= _BLAS_MAX_TERMS:
                matmul(_minus_ones_vector(c[2], dtype), rows[a], out=scratch)
                add(scratch, packets[b][c[1]], out=rows[c[0]])
            else:
                add_reduce(rows[a], axis=1, dtype=dtype, out=scratch)
                subtract(packets[b][c[1]], scratch, out=rows[c[0]])
        elif call == _SUB_PO:
            subtract(packets[b][c[0]], rows[c[1]], out=rows[a])
        elif call == _NEG_P:
            negative(packets[b][c], out=rows[a])
        elif call == _ISUB_O:
            view = rows[a]
            subtract(view, rows[b], out=view)
        else:
            rows[a] = packets[b][c]


def _minus_ones_vector(terms: int, dtype: np.dtype) -> np.ndarray:
    key = (terms, dtype)
    vector = _minus_ones.get(key)
    if vector is None:
        vector = _minus_ones[key] = np.full(terms, -1, dtype=dtype)
    return vector


def run_backend_rows(backend: Backend, calls: Sequence[Tuple[int, Any, Any, Any]], packets: Sequence[Any],
                     rows: Any) -> None:
    """Execute canonical calls through `backend`, one array operation each, in the order of run_rows."""
    scratch = backend.empty((rows.shape[0], rows.shape[2]), like=rows)  # one symbol
    for call, a, b, c in calls:
        if call == _NSUM:
            backend.sum_into(scratch, rows[a], 1)
            backend.neg(rows[c], scratch)
        elif call == _PSUM:
            backend.sum_into(scratch, rows[a], 1)
            backend.sub(rows[c[0]], packets[b][c[1]], scratch)
        elif call == _SUB_PO:
            backend.sub(rows[a], packets[b][c[0]], rows[c[1]])
        elif call == _NEG_P:
            backend.neg(rows[a], packets[b][c])
        elif call == _ISUB_O:
            backend.isub(rows[a], rows[b])
        else:
            backend.copy(rows[a], packets[b][c])


def compile_schedule(shifts: np.ndarray, used: Sequence[int], symbols: int) -> Schedule:
    """Return the zigzag schedule that decodes k blocks of `symbols` symbols from packets `used`.

    `shifts` is the n x k shift matrix (-1 where a block is absent from a packet). Raises
    NotDecodableError when peeling stalls before every symbol is solved.
    """
    matrix = np.asarray(shifts, dtype=np.int64)
    key = tuple(map(tuple, matrix.tolist()))
    return _compile(key, tuple(int(u) for u in used), int(symbols))


def compile_uncached(shifts: Tuple[Tuple[int, ...], ...], used: Tuple[int, ...], L: int) -> Schedule:
    """Compile a schedule without the cache (what a first decode of a new packet set costs)."""
    return _compile_impl(shifts, used, L)


def _compile_impl(shifts: Tuple[Tuple[int, ...], ...], used: Tuple[int, ...], L: int) -> Schedule:
    T = np.array([shifts[j] for j in used], dtype=np.int64)  # slots x k
    present = T >= 0
    # Error estimates of long non-systematic blocks outgrow float64: infinite ones still order the peeling.
    with np.errstate(over="ignore"):
        block, symbol, slot = _peel(T, L, used)
    levels = _levels(T, L, block, symbol, slot)
    ops: List[Op] = []
    for level in range(1, int(levels.max()) + 1):
        chosen = levels == level
        ops.extend(_level_ops(T, present, L, block[chosen], symbol[chosen], slot[chosen]))
    schedule = Schedule(used=used, symbols=L, blocks=T.shape[1], ops=tuple(ops), levels=int(levels.max()))
    schedule.row_calls  # made now, so that compiling is all the work a new arrival set costs
    return schedule


_compile = lru_cache(maxsize=4096)(_compile_impl)


def _peel(T: np.ndarray, L: int, used: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return which slot solves each symbol, as (block, symbol, slot) arrays in a valid solving order.

    Peeling succeeds or stalls whatever the order, so the order is chosen for accuracy. Each solved
    symbol gets an error estimate: the estimates of the other terms of its equation plus one rounding
    per term. The equations with one unknown left whose estimate is smallest are used first (Knuth's
    generalisation of Dijkstra's algorithm), which gives every symbol its smallest estimate and
    favours equations with few terms, so also few subtractions.
    """
    slots, k = T.shape
    present = T >= 0
    width = L + int(T.max(initial=0))  # packet length in symbols
    # terms[r, t]: how many blocks overlap position t of slot r; unknown[r, t]: how many are unsolved.
    terms = np.zeros((slots, width), dtype=np.int64)
    for r in range(slots):
        for i in np.flatnonzero(present[r]):
            terms[r, T[r, i]:T[r, i] + L] += 1
    unknown = terms.copy()
    known = np.zeros((k, L), dtype=bool)
    estimate = np.zeros((k, L))
    blocks = np.arange(k)[None, :]
    rows_of_block = [np.flatnonzero(present[:, i]) for i in range(k)]
    solved_block, solved_symbol, solved_slot = [], [], []
    remaining = k * L
    while remaining:
        ripe_r, ripe_t = np.nonzero(unknown == 1)
        if ripe_r.size == 0:
            raise NotDecodableError(f"packets {list(used)} cannot be zigzag decoded: peeling stalls with "
                                    f"{remaining} of {k * L} symbols unsolved")
        Q = ripe_t[:, None] - T[ripe_r]  # symbol of each block at each ripe position
        inside = present[ripe_r] & (Q >= 0) & (Q < L)
        Qc = np.clip(Q, 0, L - 1)
        unsolved = inside & ~known[blocks, Qc]
        cost = np.where(inside & ~unsolved, estimate[blocks, Qc], 0.0).sum(axis=1) + terms[ripe_r, ripe_t]
        best = cost == cost.min()
        block = np.argmax(unsolved[best], axis=1)
        symbol = Q[best][np.arange(block.size), block]
        slot, cost = ripe_r[best], cost[best]
        order = np.lexsort((slot, symbol, block))  # one equation per symbol: the lowest slot
        block, symbol, slot, cost = block[order], symbol[order], slot[order], cost[order]
        first = np.ones(block.size, dtype=bool)
        first[1:] = (block[1:] != block[:-1]) | (symbol[1:] != symbol[:-1])
        block, symbol, slot = block[first], symbol[first], slot[first]
        known[block, symbol] = True
        estimate[block, symbol] = cost[first]
        remaining -= block.size
        for i in np.unique(block):
            done = symbol[block == i]
            for r in rows_of_block[i]:
                np.subtract.at(unknown[r], done + T[r, i], 1)
        solved_block.append(block)
        solved_symbol.append(symbol)
        solved_slot.append(slot)
    return np.concatenate(solved_block), np.concatenate(solved_symbol), np.concatenate(solved_slot)


def _levels(T: np.ndarray, L: int, block: np.ndarray, symbol: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """Return each solved symbol's level: one more than the latest level among its equation's other terms."""
    k = T.shape[1]
    level = np.zeros((k, L), dtype=np.int64)
    levels = np.empty(block.size, dtype=np.int64)
    present = T >= 0
    for n, (m, q, r) in enumerate(zip(block.tolist(), symbol.tolist(), slot.tolist())):
        sources = q + T[r, m] - T[r]
        inside = present[r] & (sources >= 0) & (sources < L)
        inside[m] = False
        deps = level[np.flatnonzero(inside), sources[inside]]
        levels[n] = level[m, q] = (int(deps.max()) if deps.size else 0) + 1
    return levels


def _level_ops(T: np.ndarray, present: np.ndarray, L: int, block: np.ndarray, symbol: np.ndarray,
               slot: np.ndarray) -> List[Op]:
    """Return the operations of one peeling level: one group per run of symbols solved from one packet."""
    order = np.lexsort((symbol, block, slot))
    block, symbol, slot = block[order], symbol[order], slot[order]
    breaks = np.flatnonzero((np.diff(symbol) != 1) | (np.diff(block) != 0) | (np.diff(slot) != 0)) + 1
    ops: List[Op] = []
    for start, stop in zip(np.r_[0, breaks], np.r_[breaks, block.size]):
        r, m = int(slot[start]), int(block[start])
        q0, q1 = int(symbol[start]), int(symbol[stop - 1]) + 1
        src = q0 + int(T[r, m])
        dst = m * L + q0
        terms = []  # (dst start, dst stop, other start): out[m, a:b] -= out[i, a - d : b - d]
        for i in np.flatnonzero(present[r]):
            if i == m:
                continue
            d = int(T[r, i] - T[r, m])
            a, b = max(q0, d), min(q1, L + d)
            if a < b:
                terms.append((a, b, int(i) * L + a - d))
        if q1 - q0 == 1 and len(terms) >= 2:
            run = _evenly_spaced(sorted([t[2] for t in terms] + [dst]))
            if run is not None:  # one strided sum instead of a subtraction per term
                start, count, step = run
                # Both kinds sum the terms in increasing order, the packet symbol placed where dst is.
                ops.append((RSUB, dst, 1, r, src, (start + step, count - 1, step)) if dst == start
                           else (RNEG, dst, 1, r, src, run))
                continue
        full = next((t for t in terms if t[0] == q0 and t[1] == q1), None)
        if full is not None:
            ops.append((SUB, dst, q1 - q0, r, src, full[2]))
            terms.remove(full)
        else:
            ops.append((COPY, dst, q1 - q0, r, src, None))
        for a, b, other in terms:
            ops.append((ISUB, m * L + a, b - a, r, 0, other))
    return ops


def _evenly_spaced(offsets: List[int]) -> Optional[Tuple[int, int, int]]:
    """Return sorted `offsets` as (start, count, step) when they are evenly spaced, else None."""
    step = offsets[1] - offsets[0]
    if any(b - a != step for a, b in zip(offsets[1:], offsets[2:])):
        return None
    return offsets[0], len(offsets), step


def _merge_runs(symbols: List[Tuple[int, int, int]]) -> List[Tuple[int, int, int, int]]:
    """Merge (slot, dst, src) symbol copies into (slot, dst, src, n) runs of consecutive dst and src."""
    runs: List[Tuple[int, int, int, int]] = []
    for slot, dst, src in sorted(symbols):
        if runs:
            last_slot, last_dst, last_src, n = runs[-1]
            if slot == last_slot and dst == last_dst + n and src == last_src + n:
                runs[-1] = (slot, last_dst, last_src, n + 1)
                continue
        runs.append((slot, dst, src, 1))
    return runs
