"""Shift-and-addition (SA) codes with compiled zigzag decoding (ZD)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from psframework.arrays import arithmetic_backend, axis_index
from psframework.codes.base import Code, Packets
from psframework.codes.checks import check_int
from psframework.codes.threads import resolve_threads
from psframework.codes.zigzag import Schedule, _compile, compile_uncached


def systematic_shifts(n: int, k: int) -> np.ndarray:
    """Return the systematic shift matrix: rows 0..k-1 are the blocks, parity row r shifts block i by r*i."""
    shifts = np.full((n, k), -1, dtype=np.int64)
    shifts[np.arange(k), np.arange(k)] = 0
    for r in range(n - k):
        shifts[k + r] = r * np.arange(k)
    return shifts


def nonsystematic_shifts(n: int, k: int) -> np.ndarray:
    """Return the non-systematic shift matrix: packet j shifts block i by i*j."""
    return np.outer(np.arange(n), np.arange(k)).astype(np.int64)


def has_increasing_difference(shifts: np.ndarray) -> bool:
    """Return whether every two rows' shift differences change strictly monotonically across their common blocks.

    This "increasing difference" property is what makes every choice of k packets zigzag decodable.
    """
    shifts = np.asarray(shifts)
    for a in range(shifts.shape[0]):
        for b in range(a + 1, shifts.shape[0]):
            common = (shifts[a] >= 0) & (shifts[b] >= 0)
            steps = np.diff(shifts[b][common] - shifts[a][common])
            if steps.size and not (np.all(steps > 0) or np.all(steps < 0)):
                return False
    return True


class SAZDCode(Code):
    """An (n, k) shift-and-addition code; any k of its n packets give back the k blocks by zigzag decoding.

    Packet j is the sum of the blocks, block i shifted by `shifts[j, i]` symbols (absent where -1), so
    every packet is `padding` symbols longer than a block. Decoding only adds and subtracts, so it is
    exact on integer dtypes (wrap-around arithmetic) and stable on floats for short blocks.
    """

    def __init__(self, n: int, k: int, systematic: bool = True) -> None:
        self.k = check_int(k, "k", 1)
        self.n = check_int(n, "n", 1)
        if self.n < self.k:
            raise ValueError(f"n must be >= k, got n={self.n} < k={self.k}")
        if not isinstance(systematic, (bool, np.bool_)):
            raise ValueError(f"systematic must be True or False, got {systematic!r}")
        self.systematic = bool(systematic)
        shifts = systematic_shifts(self.n, self.k) if self.systematic else nonsystematic_shifts(self.n, self.k)
        if not has_increasing_difference(shifts):  # holds by construction; checked so a change cannot slip by
            raise ValueError(f"shift matrix of ({self.n}, {self.k}) lacks the increasing difference property")
        shifts.setflags(write=False)
        self.shifts = shifts
        self._key = tuple(map(tuple, shifts.tolist()))
        self._padding = int(shifts.max(initial=0))

    @property
    def padding(self) -> int:
        return self._padding

    def schedule(self, used: Sequence[int], symbols: int, cache: bool = True) -> Schedule:
        """Return the zigzag schedule decoding blocks of `symbols` symbols from the packets `used`."""
        used = tuple(self._check_indices(used))
        if len(used) != self.k:
            raise ValueError(f"a schedule uses exactly k={self.k} packets, got {len(used)}")
        symbols = check_int(symbols, "symbols", 1)
        return _compile(self._key, used, symbols) if cache else compile_uncached(self._key, used, symbols)

    def encode(self, blocks: Sequence[Any], axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Return the n packets: packet j = sum over i of block i shifted by shifts[j, i] symbols.

        The packets are contiguous views of one array (one allocation).
        """
        backend, blocks, axis, L = self._check_blocks(blocks, axis, symbol_size)
        # One allocation for all packets: large fresh buffers cost page faults, one buffer costs them once.
        store = backend.empty([self.n] + self._packet_shape(blocks[0], axis, L, symbol_size), like=blocks[0])
        for j in range(self.n):
            self._write_packet(backend, store[j], j, blocks, axis, L, symbol_size)
        return [store[j] for j in range(self.n)]

    def encode_packet(self, blocks: Sequence[Any], j: int, axis: int = 0, symbol_size: int = 1) -> Any:
        """Return packet j alone: only its own shifted blocks are added."""
        j = self._check_indices([j])[0]
        backend, blocks, axis, L = self._check_blocks(blocks, axis, symbol_size)
        packet = backend.empty(self._packet_shape(blocks[0], axis, L, symbol_size), like=blocks[0])
        self._write_packet(backend, packet, j, blocks, axis, L, symbol_size)
        return packet

    def _packet_shape(self, block: Any, axis: int, L: int, symbol_size: int) -> List[int]:
        shape = list(block.shape)
        shape[axis] = (L + self.padding) * symbol_size
        return shape

    def _write_packet(self, backend: Any, packet: Any, j: int, blocks: Sequence[Any], axis: int, L: int,
                      s: int) -> None:
        """Write packet j into `packet`: the first block copied, the bare ends zeroed, the rest added on top."""
        row = self.shifts[j]
        width = (L + self.padding) * s
        terms = sorted((int(row[i]), i) for i in range(self.k) if row[i] >= 0)
        first_shift, first = terms[0]
        start, stop = first_shift * s, (first_shift + L) * s
        backend.copy(packet[axis_index(axis, start, stop)], blocks[first])
        if start:
            backend.fill_zero(packet[axis_index(axis, 0, start)])
        if stop < width:
            backend.fill_zero(packet[axis_index(axis, stop, width)])
        for shift, i in terms[1:]:
            backend.iadd(packet[axis_index(axis, shift * s, (shift + L) * s)], blocks[i])

    def decode(self, packets: Packets, axis: int = 0, symbol_size: int = 1, out: Any = None,
               threads: Optional[int] = None) -> List[Any]:
        """Return the k blocks, zigzag decoded from k of the given packets (systematic ones first).

        The blocks are views of one array holding them back to back along `axis`; pass that array as
        `out` (contiguous, same type, dtype and device as the packets) to decode into it again.
        `threads` caps the host threads a large NumPy decode uses (default: `get_decode_threads()`);
        the result is the same, bit for bit, whatever the count.
        """
        threads = resolve_threads(threads)
        backend, arrived, axis, L = self._check_packets(packets, axis, symbol_size)
        out = self._decode_into(backend, arrived, axis, symbol_size, L, out, threads)
        step = L * symbol_size
        return [out[axis_index(axis, i * step, (i + 1) * step)] for i in range(self.k)]

    def decode_joined(self, packets: Packets, axis: int = 0, symbol_size: int = 1, length: Any = None,
                      out: Any = None, threads: Optional[int] = None) -> Any:
        """Decode into one array holding the blocks back to back along `axis`, cut to `length` when given.

        `out`, when given, is that array (contiguous) from an earlier decode, reused; `threads` as in `decode`.
        """
        threads = resolve_threads(threads)
        backend, arrived, axis, L = self._check_packets(packets, axis, symbol_size)
        out = self._decode_into(backend, arrived, axis, symbol_size, L, out, threads)
        if length is None:
            return out
        length = check_int(length, "length", 0)
        if length > out.shape[axis]:
            raise ValueError(f"length {length} exceeds the {out.shape[axis]} decoded elements along axis {axis}")
        return out[axis_index(axis, 0, length)]

    def _decode_into(self, backend: Any, arrived: dict, axis: int, symbol_size: int, L: int, out: Any,
                     threads: int) -> Any:
        used = self.choose_packets(arrived)
        schedule = _compile(self._key, used, L)
        first = arrived[used[0]]
        shape = list(first.shape)
        shape[axis] = self.k * L * symbol_size
        if out is None:
            out = backend.empty(shape, like=first)
        else:
            self._check_out(backend, out, tuple(shape), first)
        schedule.run(backend, [arrived[j] for j in used], out, axis, symbol_size, threads)
        return out

    @staticmethod
    def _check_out(backend: Any, out: Any, shape: Tuple[int, ...], like: Any) -> None:
        other = arithmetic_backend(out)
        if other is not backend:
            raise ValueError(f"out is a {other.name} array but the packets are {backend.name} arrays")
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
        if out.dtype != like.dtype:
            raise ValueError(f"out has dtype {out.dtype}, expected {like.dtype} like the packets")
        if backend.device(out) != backend.device(like):
            raise ValueError(f"out is on device {backend.device(out)}, expected {backend.device(like)}")
        if not backend.is_contiguous(out):
            raise ValueError("out must be contiguous, got a strided view")

    def __repr__(self) -> str:
        return f"SAZDCode(n={self.n}, k={self.k}, systematic={self.systematic})"
