"""Deterministic data augmentation (random crop with zero padding, horizontal flip) and per-channel normalisation.

Every random choice is a pure function of (seed, epoch, sample index), drawn from a counter-based hash
(the splitmix64 finaliser on uint64 numpy arrays) rather than from a stateful generator. So any process that
augments a sample of a given epoch makes the identical image, whatever batch or shard holds the sample and
in whatever position: rank 0 augmenting whole batches, data-parallel workers their shards and the
single-process reference trainer all agree bit for bit. A batch costs a few array operations: one pad,
one gather through a flat index built from per-sample row and column offsets, no per-image Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from psframework.errors import ConfigError

_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# One stream constant per draw (dy, dx, flip), so the three draws of a sample are independent.
_STREAMS = (0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B)


def _mix(z: np.ndarray) -> np.ndarray:
    """Return the splitmix64 finaliser of a uint64 array (a bijection that scrambles every bit)."""
    # numpy integer arrays wrap silently on overflow, which is the modular arithmetic the hash needs.
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _stream_bits(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """Return (3, N) random uint64 words, row s a pure function of (seed, epoch, stream s, index)."""
    # The keys are a small array, not numpy scalars: scalar uint64 arithmetic warns on overflow.
    keys = _mix(np.array([(int(seed) ^ stream) & _MASK for stream in _STREAMS], dtype=np.uint64))
    keys = _mix(keys ^ np.uint64(int(epoch) & _MASK))
    # Hashing the index before adding a key keeps streams with nearby keys from being shifts of each other.
    hashed = _mix(indices.astype(np.uint64) + _GOLDEN)
    return _mix(keys[:, None] + hashed[None, :])


def _below(bits: np.ndarray, span: int) -> np.ndarray:
    """Return integers uniform in 0..span-1 from random uint64 words (multiply-shift of the top 32 bits)."""
    # Integer arithmetic, unlike floor(u * span), can never round up to span itself.
    return (((bits >> np.uint64(32)) * np.uint64(span)) >> np.uint64(32)).astype(np.int64)


def _unit(bits: np.ndarray) -> np.ndarray:
    """Return floats uniform in [0, 1) from random uint64 words (the top 53 bits fill a double's mantissa)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _check_indices(indices: np.ndarray) -> np.ndarray:
    """Return the sample indices as a 1-D int64 array, refusing non-integer or negative ones."""
    array = np.asarray(indices)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ConfigError(f"sample indices must be a 1-D integer array, got {array.dtype} of shape {array.shape}")
    array = array.astype(np.int64, copy=False)
    if array.size and int(array.min()) < 0:
        raise ConfigError(f"sample indices must be non-negative, got {int(array.min())}")
    return array


def _check_params(padding: int, flip: float, epoch: int = 0) -> None:
    """Refuse a negative padding or epoch and a flip probability outside [0, 1]."""
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
        raise ConfigError(f"augmentation padding must be a non-negative integer, got {padding!r}")
    if not 0.0 <= float(flip) <= 1.0:
        raise ConfigError(f"augmentation flip probability must be in [0, 1], got {flip!r}")
    if int(epoch) < 0:
        raise ConfigError(f"epoch must be non-negative, got {epoch!r}")


def draws(seed: int, epoch: int, indices: np.ndarray, padding: int,
          flip: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the per-sample crop offsets dy, dx (int64 in 0..2*padding) and flip flags (bool) of CropFlip."""
    _check_params(padding, flip, epoch)
    indices = _check_indices(indices)
    bits = _stream_bits(seed, epoch, indices)
    span = 2 * int(padding) + 1
    # u < flip is never true for flip 0 and always true for flip 1, since u lies in [0, 1).
    return _below(bits[0], span), _below(bits[1], span), _unit(bits[2]) < float(flip)


@dataclass(frozen=True)
class CropFlip:
    """Random crop of a zero-padded image and random horizontal flip, seeded per (seed, epoch, sample)."""

    padding: int = 4
    flip: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse out-of-range parameters when the transform is made, not at the first batch."""
        _check_params(self.padding, self.flip)

    def __call__(self, images: torch.Tensor, indices: np.ndarray, epoch: int) -> torch.Tensor:
        """Return a new (N, C, H, W) tensor, on the images' device, of the augmented images."""
        if images.dim() != 4:
            raise ConfigError(f"CropFlip needs (N, C, H, W) images, got shape {tuple(images.shape)}")
        dy, dx, flipped = draws(self.seed, epoch, indices, self.padding, self.flip)
        if len(dy) != images.shape[0]:
            raise ConfigError(f"{len(dy)} sample indices for a batch of {images.shape[0]} images")
        if self.padding == 0 and not flipped.any():
            return images.clone()
        return _gather(images, self.padding, dy, dx, flipped)


def _gather(images: torch.Tensor, padding: int, dy: np.ndarray, dx: np.ndarray,
            flipped: np.ndarray) -> torch.Tensor:
    """Return the H x W windows at (dy, dx) of the zero-padded images, columns reversed where flipped."""
    n, c, h, w = images.shape
    p = int(padding)
    hp, wp = h + 2 * p, w + 2 * p
    padded = F.pad(images, (p, p, p, p)) if p else images.contiguous()
    # Flat offsets into the padded batch: rows (N, H) carry the sample and the row, cols (N, W) the column.
    rows = ((np.arange(n) * (c * hp))[:, None] + dy[:, None] + np.arange(h)) * wp
    columns = np.arange(w)
    cols = dx[:, None] + np.where(flipped[:, None], columns[::-1], columns)
    # Only these small arrays cross to the device; the full (N, C, H, W) index is composed there.
    rows_t = torch.from_numpy(rows).to(images.device)
    cols_t = torch.from_numpy(np.ascontiguousarray(cols)).to(images.device)
    channels = torch.arange(0, c * hp * wp, hp * wp, device=images.device)
    index = (rows_t[:, :, None] + cols_t[:, None, :])[:, None] + channels[:, None, None]
    return torch.take(padded, index)


@dataclass(frozen=True)
class Normalize:
    """Per-channel normalisation (x - mean) / std of (N, C, H, W) images."""

    mean: Tuple[float, ...]
    std: Tuple[float, ...]

    def __post_init__(self) -> None:
        """Store the statistics as tuples of floats and refuse mismatched or non-positive ones."""
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if not self.mean or len(self.mean) != len(self.std):
            raise ConfigError(f"Normalize needs one mean and one std per channel, got {self.mean} and {self.std}")
        if min(self.std) <= 0.0:
            raise ConfigError(f"Normalize std must be positive, got {self.std}")

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Return (images - mean) / std per channel, broadcast over (N, C, H, W)."""
        if images.dim() != 4 or images.shape[1] != len(self.mean):
            raise ConfigError(f"Normalize of {len(self.mean)} channels got images of shape {tuple(images.shape)}")
        mean = torch.tensor(self.mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
        return (images - mean) / std

    @classmethod
    def of(cls, images: torch.Tensor) -> "Normalize":
        """Return the Normalize of the per-channel mean and unbiased std (clamped at 1e-6) of the images."""
        if images.dim() != 4 or images.shape[0] * images.shape[2] * images.shape[3] < 2:
            raise ConfigError(f"Normalize.of needs (N, C, H, W) images of 2 or more values, got {tuple(images.shape)}")
        # In the images' own dtype, as the statistics have always been taken: float32 data normalise to the
        # same bits as before (`over`, for streamed splits, sums in float64).
        x = images.detach()
        mean = x.mean(dim=(0, 2, 3))
        std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
        return cls(tuple(mean.tolist()), tuple(std.tolist()))

    @classmethod
    def over(cls, batches: Iterable[torch.Tensor]) -> "Normalize":
        """Return the Normalize of the per-channel statistics of all batches, in one streaming pass."""
        shift = total = total_sq = None
        count = 0
        for batch in batches:
            if batch.dim() != 4 or (shift is not None and batch.shape[1] != shift.numel()):
                raise ConfigError(f"Normalize.over got a batch of shape {tuple(batch.shape)}")
            x = batch.detach().to(device="cpu", dtype=torch.float64).transpose(0, 1).reshape(batch.shape[1], -1)
            if x.shape[1] == 0:
                continue
            if shift is None:
                # Summing x - (first batch's mean) rather than x keeps sum(x^2) - sum(x)^2/n from cancelling.
                shift = x.mean(dim=1)
                total = torch.zeros_like(shift)
                total_sq = torch.zeros_like(shift)
            centred = x - shift[:, None]
            total += centred.sum(dim=1)
            total_sq += (centred * centred).sum(dim=1)
            count += x.shape[1]
        if count < 2:
            raise ConfigError(f"Normalize.over needs 2 or more values per channel, got {count}")
        variance = (total_sq - total * total / count) / (count - 1)
        std = variance.clamp_min(0.0).sqrt().clamp_min(1e-6)
        return cls(tuple((shift + total / count).tolist()), tuple(std.tolist()))
