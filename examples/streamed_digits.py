"""Your own dataset: a factory returning map-style torch Datasets, which psframework streams.

    data:
      dataset: examples/streamed_digits.py:digits   # or mypackage.data:factory on PYTHONPATH
      args: {noise: 0.0}
      loader_workers: 2                            # DataLoader processes reading ahead

A factory returns (train, test) or (train, test, num_classes). Each split is either a pair of
tensors or arrays (images (N, C, H, W), labels (N,)), held in memory, or a map-style Dataset whose
items are (image (C, H, W), label); a Dataset is read batch by batch in the order the run's plan
fixes (a pure function of data.seed and the epoch), and a data-parallel worker reads only its own
shard. Normalise the images in the Dataset, or set data.normalize (auto: by the training set's
per-channel statistics); psframework does not standardise a factory's data by default.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch


class DigitImages(torch.utils.data.Dataset):
    """8x8 digit images, one (image, label) per item, standardised by the train split's statistics."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, mean: float, std: float, noise: float, seed: int):
        self.images, self.labels = images, labels
        self.mean, self.std, self.noise, self.seed = mean, std, noise, seed
        self.classes = list(range(10))
        self.targets = labels.tolist()  # lets rank 0 read labels without loading images

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        image = (self.images[index] - self.mean) / self.std
        if self.noise:  # seeded per sample: the same item always gives the same image
            image = image + self.noise * np.random.default_rng([self.seed, index]).standard_normal(image.shape)
        return torch.from_numpy(image.astype(np.float32)[None]), int(self.labels[index])


def digits(noise: float = 0.0, seed: int = 0) -> Tuple[DigitImages, DigitImages, int]:
    """Return scikit-learn's bundled digits as streamed train and test Datasets and their 10 classes."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    order = np.random.default_rng(20231).permutation(len(images))
    test, train = order[:360], order[360:]
    mean, std = float(images[train].mean()), float(images[train].std())
    return (DigitImages(images[train], bunch.target[train], mean, std, noise, seed),
            DigitImages(images[test], bunch.target[test], mean, std, noise, seed), 10)


def digits_in_memory(noise: float = 0.0, seed: int = 0) -> Tuple[tuple, tuple, int]:
    """Return the same samples as tensors held in memory (the same run, without streaming)."""
    train, test, classes = digits(noise, seed)
    return tuple(_stack(split) for split in (train, test)) + (classes,)


def _stack(split: DigitImages) -> Tuple[torch.Tensor, torch.Tensor]:
    items = [split[i] for i in range(len(split))]
    return torch.stack([image for image, _ in items]), torch.tensor([label for _, label in items])
