"""In-memory dataset container shared by every reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


class DatasetError(ValueError):
    """A dataset file is missing, truncated or not in the expected format."""


@dataclass
class TensorPair:
    """Images (N, C, H, W) float32 and labels (N,) int64."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: Any) -> "TensorPair":
        """Return the images and labels on `device`."""
        return TensorPair(self.images.to(device), self.labels.to(device))


@dataclass
class Dataset:
    """A train/test split with its shape and class count."""

    name: str
    train: TensorPair
    test: TensorPair
    num_classes: int

    def to(self, device: Any) -> "Dataset":
        """Return the dataset with both splits on `device` (itself when they are there already)."""
        return Dataset(self.name, self.train.to(device), self.test.to(device), self.num_classes)

    @property
    def image_shape(self) -> tuple:
        """Return (channels, height, width) of one image."""
        return tuple(self.train.images.shape[1:])


def to_tensor_pair(images: np.ndarray, labels: np.ndarray) -> TensorPair:
    """Wrap uint8 or float images (N, C, H, W) and integer labels as tensors."""
    return TensorPair(torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)),
                      torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)))


def standardize(train: TensorPair, test: TensorPair) -> None:
    """Scale both splits in place by the train split's per-channel mean and deviation."""
    dims = (0, 2, 3)
    mean = train.images.mean(dim=dims, keepdim=True)
    std = train.images.std(dim=dims, keepdim=True).clamp_min(1e-6)
    train.images.sub_(mean).div_(std)
    test.images.sub_(mean).div_(std)


def resize(pair: TensorPair, size: int) -> TensorPair:
    """Return the images resized to size x size (bilinear), labels unchanged."""
    if pair.images.shape[-2:] == (size, size):
        return pair
    images = F.interpolate(pair.images, size=(size, size), mode="bilinear", align_corners=False)
    return TensorPair(images.contiguous(), pair.labels)
