"""Seeded class-conditional synthetic images of any shape, for benchmarks."""

from __future__ import annotations

import numpy as np


def make_synthetic(channels: int, height: int, width: int, classes: int, train_size: int,
                   test_size: int, seed: int, noise: float = 1.0) -> tuple:
    """Return (train_x, train_y, test_x, test_y): a smooth class template plus Gaussian noise."""
    rng = np.random.default_rng([seed, 7919])
    coarse = rng.standard_normal((classes, channels, max(height // 4, 1), max(width // 4, 1)))
    templates = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3)[:, :, :height, :width]
    if templates.shape[2] < height or templates.shape[3] < width:
        pad = ((0, 0), (0, 0), (0, height - templates.shape[2]), (0, width - templates.shape[3]))
        templates = np.pad(templates, pad, mode="edge")

    def draw(size: int) -> tuple:
        labels = rng.integers(0, classes, size=size)
        images = templates[labels] + noise * rng.standard_normal((size, channels, height, width))
        return images.astype(np.float32), labels.astype(np.int64)

    train_x, train_y = draw(train_size)
    test_x, test_y = draw(test_size)
    return train_x, train_y, test_x, test_y
