"""Deterministic epoch order, global batches and per-worker shards."""

from __future__ import annotations

from typing import Iterator, List

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """Return the sample permutation of one epoch; a pure function of (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(num_samples)


def num_batches(num_samples: int, batch_size: int, drop_last: bool = True) -> int:
    """Return the number of global batches per epoch."""
    if drop_last:
        return num_samples // batch_size
    return -(-num_samples // batch_size)


def batch_indices(num_samples: int, batch_size: int, seed: int, epoch: int, batch: int,
                  drop_last: bool = True) -> np.ndarray:
    """Return the sample indices of global batch `batch` of `epoch`."""
    total = num_batches(num_samples, batch_size, drop_last)
    if not 0 <= batch < total:
        raise IndexError(f"batch {batch} out of range 0..{total - 1}")
    order = epoch_order(num_samples, seed, epoch)
    return order[batch * batch_size:(batch + 1) * batch_size]


def iterate_batches(num_samples: int, batch_size: int, seed: int, epoch: int, start: int = 0,
                    drop_last: bool = True) -> Iterator[np.ndarray]:
    """Yield the index arrays of an epoch's global batches from batch `start` on."""
    order = epoch_order(num_samples, seed, epoch)
    for b in range(start, num_batches(num_samples, batch_size, drop_last)):
        yield order[b * batch_size:(b + 1) * batch_size]


def shard(indices: np.ndarray, worker: int, n: int) -> np.ndarray:
    """Return worker `worker`'s (0-based) contiguous share of a global batch split n ways."""
    if n < 1 or not 0 <= worker < n:
        raise ValueError(f"shard: worker {worker} out of range for n={n} workers")
    bounds = shard_bounds(len(indices), n)
    return indices[bounds[worker]:bounds[worker + 1]]


def shard_bounds(size: int, n: int) -> List[int]:
    """Return n+1 offsets that split `size` items into n near-equal contiguous parts."""
    base, extra = divmod(size, n)
    bounds = [0]
    for w in range(n):
        bounds.append(bounds[-1] + base + (1 if w < extra else 0))
    return bounds
