"""Baselines with the same interface as SAZDCode: real polynomial (Vandermonde) codes and no code at all."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, List, Sequence, Tuple

import numpy as np

from psframework.codes.base import Code, Packets
from psframework.codes.checks import check_int

NODES = ("chebyshev", "equispaced", "integers")
_INVERSES_KEPT = 1024


def vandermonde_nodes(n: int, nodes: str) -> np.ndarray:
    """Return the n evaluation points of a polynomial code: Chebyshev points, equispaced on [-1, 1], or 1..n."""
    if nodes == "chebyshev":
        return np.cos((2 * np.arange(n) + 1) * np.pi / (2 * n))
    if nodes == "equispaced":
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
    if nodes == "integers":
        return np.arange(1, n + 1, dtype=np.float64)
    raise ValueError(f"unknown nodes {nodes!r}: expected one of {', '.join(NODES)}")


class PolyCode(Code):
    """An (n, k) real polynomial code: packet j = sum over i of x_j**i * block i.

    Decoding solves the k x k Vandermonde system of the packets used (its inverse is computed once
    per set of packets, in float64, and cached), then combines the packets with it. Over the reals
    this is ill-conditioned: the condition number grows exponentially in k.
    """

    def __init__(self, n: int, k: int, nodes: str = "chebyshev") -> None:
        self.k = check_int(k, "k", 1)
        self.n = check_int(n, "n", 1)
        if self.n < self.k:
            raise ValueError(f"n must be >= k, got n={self.n} < k={self.k}")
        self.nodes = nodes
        points = vandermonde_nodes(self.n, nodes)
        generator = np.vander(points, self.k, increasing=True)
        generator.setflags(write=False)
        self.generator = generator
        self._inverses: "OrderedDict[Tuple[int, ...], np.ndarray]" = OrderedDict()

    def inverse(self, used: Sequence[int]) -> np.ndarray:
        """Return the float64 inverse of the generator rows `used` (cached per set of packets)."""
        key = tuple(used)
        matrix = self._inverses.get(key)
        if matrix is None:
            matrix = np.linalg.inv(self.generator[list(key)])
            self._inverses[key] = matrix
            if len(self._inverses) > _INVERSES_KEPT:
                self._inverses.popitem(last=False)
        return matrix

    def encode(self, blocks: Sequence[Any], axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Return the n packets, each a linear combination of the blocks."""
        backend, blocks, axis, _ = self._check_blocks(blocks, axis, symbol_size)
        self._require_floating(backend, blocks[0].dtype)
        return backend.combine(self.generator, blocks)

    def encode_packet(self, blocks: Sequence[Any], j: int, axis: int = 0, symbol_size: int = 1) -> Any:
        """Return packet j alone: one row of the generator."""
        j = self._check_indices([j])[0]
        backend, blocks, axis, _ = self._check_blocks(blocks, axis, symbol_size)
        self._require_floating(backend, blocks[0].dtype)
        return backend.combine(self.generator[j:j + 1], blocks)[0]

    def decode(self, packets: Packets, axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Return the k blocks, solved from the k lowest-indexed packets given."""
        backend, arrived, axis, _ = self._check_packets(packets, axis, symbol_size)
        first = next(iter(arrived.values()))
        self._require_floating(backend, first.dtype)
        used = self.choose_packets(arrived)
        return backend.combine(self.inverse(used), [arrived[j] for j in used])

    def _require_floating(self, backend: Any, dtype: Any) -> None:
        if not backend.is_floating(dtype):
            raise ValueError(f"dtype {dtype} is not supported by PolyCode: real polynomial codes need a floating "
                             "dtype")

    def __repr__(self) -> str:
        return f"PolyCode(n={self.n}, k={self.k}, nodes={self.nodes!r})"


class UncodedCode(Code):
    """No redundancy (n = k): packet i is block i, and every packet is needed."""

    def __init__(self, k: int) -> None:
        self.k = self.n = check_int(k, "k", 1)

    def encode(self, blocks: Sequence[Any], axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Return copies of the blocks."""
        backend, blocks, axis, _ = self._check_blocks(blocks, axis, symbol_size)
        return [_copy(backend, b) for b in blocks]

    def encode_packet(self, blocks: Sequence[Any], j: int, axis: int = 0, symbol_size: int = 1) -> Any:
        """Return a copy of block j."""
        j = self._check_indices([j])[0]
        backend, blocks, axis, _ = self._check_blocks(blocks, axis, symbol_size)
        return _copy(backend, blocks[j])

    def decode(self, packets: Packets, axis: int = 0, symbol_size: int = 1) -> List[Any]:
        """Return copies of the k packets, in index order."""
        backend, arrived, axis, _ = self._check_packets(packets, axis, symbol_size)
        return [_copy(backend, arrived[j]) for j in self.choose_packets(arrived)]

    def __repr__(self) -> str:
        return f"UncodedCode(k={self.k})"


def _copy(backend: Any, x: Any) -> Any:
    out = backend.empty(tuple(x.shape), like=x)
    backend.copy(out, x)
    return out
