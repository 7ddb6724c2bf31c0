"""Tests of psframework.data.augment: seeded crop/flip draws and per-channel normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from psframework.data.augment import CropFlip, Normalize, draws
from psframework.errors import ConfigError


def _images(n: int, c: int = 3, h: int = 8, w: int = 8, seed: int = 0) -> torch.Tensor:
    """Return n random float32 images of shape (c, h, w)."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32))


def _reference(images: torch.Tensor, padding: int, dy: np.ndarray, dx: np.ndarray, flipped: np.ndarray) -> torch.Tensor:
    """Return the crop/flip of each image by explicit loops over samples, channels and pixels."""
    n, c, h, w = images.shape
    out = torch.zeros_like(images)
    for k in range(n):
        for ch in range(c):
            for y in range(h):
                for x in range(w):
                    # Pixel (y, x) of the crop is pixel (y + dy, x + dx) of the padded image, before the flip.
                    sx = w - 1 - x if flipped[k] else x
                    py, px = y + dy[k] - padding, sx + dx[k] - padding
                    if 0 <= py < h and 0 <= px < w:
                        out[k, ch, y, x] = images[k, ch, py, px]
    return out


def test_same_sample_same_image_whatever_the_batch() -> None:
    """Equal (seed, epoch, index) give bit-identical images in a batch, a shuffled sub-batch and alone."""
    aug = CropFlip(padding=4, flip=0.5, seed=11)
    base = _images(64, 3, 32, 32)
    indices = np.arange(1000, 1064)
    whole = aug(base, indices, epoch=3)
    perm = np.random.default_rng(5).permutation(64)[:23]
    sub = aug(base[torch.from_numpy(perm)], indices[perm], epoch=3)
    assert torch.equal(sub, whole[torch.from_numpy(perm)])
    for k in (0, 17, 63):
        single = aug(base[k:k + 1], indices[k:k + 1], epoch=3)
        assert torch.equal(single[0], whole[k])


def test_input_not_modified_and_result_new() -> None:
    """The transform leaves its input alone and returns a new tensor of the same shape and dtype."""
    images = _images(8)
    before = images.clone()
    out = CropFlip()(images, np.arange(8), 0)
    assert torch.equal(images, before)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert out.data_ptr() != images.data_ptr()


def test_draws_depend_on_epoch_and_seed() -> None:
    """Another epoch or another seed changes the draws of most samples."""
    indices = np.arange(2000)

    def changed(a: tuple, b: tuple) -> float:
        return float(np.mean((a[0] != b[0]) | (a[1] != b[1]) | (a[2] != b[2])))

    ref = draws(0, 0, indices, 4, 0.5)
    assert changed(ref, draws(0, 1, indices, 4, 0.5)) > 0.9
    assert changed(ref, draws(1, 0, indices, 4, 0.5)) > 0.9
    assert changed(draws(0, 1, indices, 4, 0.5), draws(1, 0, indices, 4, 0.5)) > 0.9
    again = draws(0, 0, indices, 4, 0.5)
    assert all(np.array_equal(x, y) for x, y in zip(ref, again))


def test_draws_independent_across_streams() -> None:
    """dy and dx of a sample are not the same draw, and neighbouring samples differ."""
    dy, dx, _ = draws(7, 2, np.arange(10000), 4, 0.5)
    assert np.mean(dy == dx) < 0.2
    assert np.mean(dy[1:] == dy[:-1]) < 0.2


@pytest.mark.parametrize("padding,flip", [(4, 0.5), (2, 0.25), (1, 0.9)])
def test_draws_in_range_and_at_rate(padding: int, flip: float) -> None:
    """Offsets lie in 0..2p and cover every value about evenly; flips occur at the configured rate."""
    dy, dx, flipped = draws(3, 5, np.arange(10000), padding, flip)
    span = 2 * padding + 1
    for offsets in (dy, dx):
        assert offsets.dtype == np.int64 and offsets.min() >= 0 and offsets.max() <= 2 * padding
        counts = np.bincount(offsets, minlength=span)
        assert len(counts) == span and counts.min() > 0.8 * 10000 / span
    assert flipped.dtype == bool
    assert abs(flipped.mean() - flip) < 0.03


def test_flip_extremes() -> None:
    """Flip probability 0 never flips and 1 always does."""
    assert not draws(0, 0, np.arange(5000), 4, 0.0)[2].any()
    assert draws(0, 0, np.arange(5000), 4, 1.0)[2].all()


@pytest.mark.parametrize("padding,flip", [(2, 0.5), (3, 1.0), (0, 1.0), (1, 0.0)])
def test_matches_loop_reference(padding: int, flip: float) -> None:
    """A known arange image, cropped and flipped by the drawn choices, equals the explicit-loop reference."""
    images = torch.arange(6 * 2 * 5 * 7, dtype=torch.float32).reshape(6, 2, 5, 7) + 1.0
    indices = np.array([9, 3, 40, 0, 7, 12])
    dy, dx, flipped = draws(4, 1, indices, padding, flip)
    out = CropFlip(padding=padding, flip=flip, seed=4)(images, indices, 1)
    assert torch.equal(out, _reference(images, padding, dy, dx, flipped))


def test_reference_known_offsets() -> None:
    """The loop reference itself gives the expected window for a hand-picked offset and flip."""
    image = torch.arange(9, dtype=torch.float32).reshape(1, 1, 3, 3) + 1.0
    shifted = _reference(image, 1, np.array([2]), np.array([0]), np.array([False]))
    assert shifted[0, 0].tolist() == [[0, 4, 5], [0, 7, 8], [0, 0, 0]]
    flipped = _reference(image, 1, np.array([1]), np.array([1]), np.array([True]))
    assert flipped[0, 0].tolist() == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]


def test_identity_without_padding_or_flip() -> None:
    """Padding 0 and flip 0 return the input unchanged (as a new tensor)."""
    images = _images(10, 3, 6, 5)
    out = CropFlip(padding=0, flip=0.0, seed=9)(images, np.arange(10), 4)
    assert torch.equal(out, images)
    assert out.data_ptr() != images.data_ptr()


def test_empty_batch() -> None:
    """A batch of no images gives no images."""
    out = CropFlip()(torch.zeros(0, 3, 8, 8), np.zeros(0, dtype=np.int64), 0)
    assert out.shape == (0, 3, 8, 8)


def test_bad_inputs() -> None:
    """Bad parameters, shapes and indices raise ConfigError."""
    with pytest.raises(ConfigError):
        CropFlip(padding=-1)
    with pytest.raises(ConfigError):
        CropFlip(flip=1.5)
    aug = CropFlip()
    with pytest.raises(ConfigError):
        aug(_images(4), np.arange(3), 0)
    with pytest.raises(ConfigError):
        aug(_images(2), np.array([0, -1]), 0)
    with pytest.raises(ConfigError):
        aug(_images(2), np.array([0.0, 1.0]), 0)
    with pytest.raises(ConfigError):
        aug(_images(2)[0], np.arange(2), 0)
    with pytest.raises(ConfigError):
        aug(_images(2), np.arange(2), -1)


def _shifted_data() -> torch.Tensor:
    """Return 3-channel data with distinct per-channel means and spreads, far from (0, 1)."""
    data = _images(300, 3, 6, 6, seed=2)
    return data * torch.tensor([2.0, 0.5, 10.0]).view(1, 3, 1, 1) + torch.tensor([100.0, -3.0, 7.0]).view(1, 3, 1, 1)


def test_normalize_of_and_over_agree() -> None:
    """Streaming statistics over uneven batches equal those of the concatenation and of torch."""
    data = _shifted_data()
    whole = Normalize.of(data)
    streamed = Normalize.over([data[:1], data[1:130], data[130:130], data[130:]])
    # `of` takes float32 images' statistics in float32 (as the built-in datasets always have), `over` in float64
    np.testing.assert_allclose(streamed.mean, whole.mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(streamed.std, whole.std, rtol=1e-6, atol=1e-6)
    flat = data.double().transpose(0, 1).reshape(3, -1)
    np.testing.assert_allclose(streamed.mean, flat.mean(dim=1).numpy(), atol=1e-9)
    np.testing.assert_allclose(streamed.std, flat.std(dim=1).numpy(), rtol=1e-9)
    np.testing.assert_allclose(whole.mean, flat.mean(dim=1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(whole.std, flat.std(dim=1).numpy(), rtol=1e-6)


def test_normalized_data_is_standard() -> None:
    """Normalised data has per-channel mean about 0 and std about 1, and keeps its shape and dtype."""
    data = _shifted_data()
    out = Normalize.of(data)(data)
    assert out.shape == data.shape and out.dtype == torch.float32
    flat = out.double().transpose(0, 1).reshape(3, -1)
    np.testing.assert_allclose(flat.mean(dim=1).numpy(), 0.0, atol=1e-5)
    np.testing.assert_allclose(flat.std(dim=1).numpy(), 1.0, atol=1e-5)


def test_normalize_constant_channel_and_errors() -> None:
    """A constant channel gets std 1e-6 rather than 0; mismatched statistics or shapes raise ConfigError."""
    data = torch.ones(4, 1, 3, 3)
    assert Normalize.of(data).std == (pytest.approx(1e-6),)
    assert Normalize.over([data]).std == (1e-6,)
    with pytest.raises(ConfigError):
        Normalize((0.0, 0.0), (1.0,))
    with pytest.raises(ConfigError):
        Normalize((0.0,), (0.0,))
    with pytest.raises(ConfigError):
        Normalize((0.0,), (1.0,))(torch.zeros(2, 3, 4, 4))
    with pytest.raises(ConfigError):
        Normalize.over([])
    with pytest.raises(ConfigError):
        Normalize.over([torch.zeros(2, 1, 2, 2), torch.zeros(2, 2, 2, 2)])
