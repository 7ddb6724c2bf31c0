"""The interface every erasure code of the project shares."""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from psframework.arrays import Backend, common_backend
from psframework.codes.checks import check_axis, check_int
from psframework.codes.layout import join_blocks

Packets = Union[Mapping[int, Any], Iterable[Tuple[int, Any]]]


class Code(ABC):
    """An (n, k) erasure code over tensors: k equal blocks in, n packets out, any k packets back to the blocks.

    Blocks and packets are cut along one `axis`; `symbol_size` elements along it make one symbol, the
    unit by which shift-and-addition codes shift. Encoding is linear, so the same code applies to
    weights and to the activations computed from coded weights.
    """

    n: int
    k: int

    @property
    def padding(self) -> int:
        """Return how many symbols longer than a block each packet is."""
        return 0

    def packet_length(self, block_length: int, symbol_size: int = 1) -> int:
        """Return the length along the axis of one packet coding blocks of `block_length` elements."""
        symbols = self._symbols(block_length, symbol_size)
        return (symbols + self.padding) * symbol_size

    def block_length(self, packet_length: int, symbol_size: int = 1) -> int:
        """Return the length along the axis of the blocks coded in packets of `packet_length` elements."""
        packet_length = check_int(packet_length, "packet length", 1)
        symbol_size = check_int(symbol_size, "symbol_size", 1)
        return self._block_symbols(packet_length, symbol_size, "") * symbol_size

    def _block_symbols(self, packet_length: int, symbol_size: int, where: str) -> int:
        """Return the symbols per block of packets `packet_length` long; ValueError if no block fits."""
        if packet_length % symbol_size:
            raise ValueError(f"packet length {packet_length}{where} is not a multiple of symbol_size {symbol_size}")
        symbols = packet_length // symbol_size - self.padding
        if symbols < 1:
            raise ValueError(f"packet length {packet_length}{where} is too short: packets of this code are "
                             f"{self.padding} symbols of {symbol_size} longer than a non-empty block")
        return symbols

    def choose_packets(self, available: Iterable[int]) -> Tuple[int, ...]:
        """Return the k packet indices that `decode` uses when the packets in `available` have arrived."""
        indices = sorted(self._check_indices(available))
        if len(indices) < self.k:
            raise ValueError(f"too few packets: got {len(indices)} ({indices}), need at least k={self.k}")
        return tuple(self._preferred(indices)[: self.k])

    def _preferred(self, indices: List[int]) -> List[int]:
        """Return arrived packet indices, best first (default: lowest index first)."""
        return indices

    @abstractmethod
    def encode(self, blocks: Sequence[Any], axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Encode k equally shaped blocks into n packets along `axis`."""

    def encode_packet(self, blocks: Sequence[Any], j: int, axis: int = 0, symbol_size: int = 1) -> Any:
        """Return packet j alone (what a worker needs of its own packet), as `encode(...)[j]` would."""
        j = self._check_indices([j])[0]
        return self.encode(blocks, axis, symbol_size)[j]

    @abstractmethod
    def decode(self, packets: Packets, axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Decode the k blocks from at least k packets given as {packet index: array}."""

    def decode_joined(self, packets: Packets, axis: int = 0, symbol_size: int = 1,
                      length: Optional[int] = None) -> Any:
        """Decode and return the blocks joined along `axis`, cut to `length` elements when given."""
        return join_blocks(self.decode(packets, axis, symbol_size), axis=axis, length=length)

    # --- input checks shared by the codes ---

    def _symbols(self, block_length: int, symbol_size: int) -> int:
        block_length = check_int(block_length, "block length", 1)
        symbol_size = check_int(symbol_size, "symbol_size", 1)
        if block_length % symbol_size:
            raise ValueError(f"block length {block_length} along the axis is not a multiple of symbol_size "
                             f"{symbol_size}")
        return block_length // symbol_size

    def _check_blocks(self, blocks: Sequence[Any], axis: int, symbol_size: int) -> Tuple[Backend, List[Any], int, int]:
        """Validate blocks; return (backend, blocks, normalised axis, symbols per block)."""
        if not isinstance(blocks, (list, tuple)):
            raise ValueError(f"blocks must be a list or tuple of {self.k} arrays, got {type(blocks).__name__}")
        if len(blocks) != self.k:
            raise ValueError(f"expected k={self.k} blocks, got {len(blocks)}")
        backend = common_backend(blocks, "block", list(range(self.k)))
        blocks = [backend.prepare(b) for b in blocks]
        ndim = len(blocks[0].shape)
        if ndim == 0:
            raise ValueError("blocks must have at least one dimension, got 0-dimensional arrays")
        axis = check_axis(axis, ndim)
        symbols = self._symbols(blocks[0].shape[axis], symbol_size)
        return backend, blocks, axis, symbols

    def _check_indices(self, indices: Iterable[Any]) -> List[int]:
        seen: List[int] = []
        for raw in indices:
            if isinstance(raw, bool):
                raise ValueError(f"unknown packet index {raw!r}: expected an integer in 0..{self.n - 1}")
            try:
                index = operator.index(raw)
            except TypeError:
                raise ValueError(f"unknown packet index {raw!r}: expected an integer in 0..{self.n - 1}") from None
            if not 0 <= index < self.n:
                raise ValueError(f"unknown packet index {index}: expected an integer in 0..{self.n - 1}")
            if index in seen:
                raise ValueError(f"duplicate packet index {index}")
            seen.append(index)
        return seen

    def _check_packets(self, packets: Packets, axis: int, symbol_size: int
                       ) -> Tuple[Backend, Dict[int, Any], int, int]:
        """Validate packets; return (backend, {index: array}, normalised axis, symbols per block)."""
        pairs = list(packets.items()) if isinstance(packets, Mapping) else list(packets)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"packets must map packet index -> array (a dict or (index, array) pairs), "
                                 f"got an item {type(pair).__name__}")
        indices = self._check_indices(i for i, _ in pairs)
        if len(indices) < self.k:
            raise ValueError(f"too few packets: got {len(indices)} ({sorted(indices)}), need at least k={self.k}")
        arrays = [a for _, a in pairs]
        backend = common_backend(arrays, "packet", indices)
        ndim = len(arrays[0].shape)
        if ndim == 0:
            raise ValueError("packets must have at least one dimension, got 0-dimensional arrays")
        axis = check_axis(axis, ndim)
        symbol_size = check_int(symbol_size, "symbol_size", 1)
        symbols = self._block_symbols(arrays[0].shape[axis], symbol_size, f" along axis {axis}")
        return backend, {i: backend.prepare(a) for i, a in zip(indices, arrays)}, axis, symbols

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, k={self.k})"
