"""Dataset container and the split interface every training scheme reads through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Tuple, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F


@runtime_checkable
class Split(Protocol):
    """What a training scheme reads from a train or test split, in memory or streamed."""

    def __len__(self) -> int: ...

    @property
    def image_shape(self) -> Tuple[int, ...]: ...

    def fetch(self, indices: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]: ...

    def labels_of(self, indices: np.ndarray) -> torch.Tensor: ...

    def batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]: ...

    def prefetch(self, plan: Iterable[np.ndarray]) -> None: ...

    def to(self, device: Any) -> "Split": ...

    def close(self) -> None: ...


def index_tensor(indices: np.ndarray) -> torch.Tensor:
    """Return sample indices as an int64 tensor (any integer array, slice views included)."""
    return torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64))


@dataclass
class TensorPair:
    """Images (N, C, H, W) float32 and labels (N,) int64, held in memory."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> Tuple[int, ...]:
        """Return (channels, height, width) of one image."""
        return tuple(self.images.shape[1:])

    def to(self, device: Any) -> "TensorPair":
        """Return the images and labels on `device`."""
        return TensorPair(self.images.to(device), self.labels.to(device))

    def fetch(self, indices: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return the images and labels of these samples, in this order."""
        index = index_tensor(indices)
        return self.images[index], self.labels[index]

    def labels_of(self, indices: np.ndarray) -> torch.Tensor:
        """Return the labels of these samples, in this order."""
        return self.labels[index_tensor(indices)]

    def batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Yield the whole split in order, batch_size samples at a time."""
        for start in range(0, len(self), batch_size):
            yield self.images[start:start + batch_size], self.labels[start:start + batch_size]

    def prefetch(self, plan: Iterable[np.ndarray]) -> None:
        """Do nothing: every sample is in memory already."""

    def close(self) -> None:
        """Do nothing: an in-memory split holds no loader."""


Augment = Callable[[torch.Tensor, np.ndarray, int], torch.Tensor]  # (images, sample indices, epoch) -> images


@dataclass
class Dataset:
    """A train/test split with its shape and class count, and the augmentation of training batches."""

    name: str
    train: Split
    test: Split
    num_classes: int
    augment: Optional[Augment] = None

    def to(self, device: Any) -> "Dataset":
        """Return the dataset with both splits on `device` (itself when they are there already)."""
        return Dataset(self.name, self.train.to(device), self.test.to(device), self.num_classes, self.augment)

    def train_batch(self, indices: np.ndarray, epoch: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return the training images of these samples as augmented in `epoch`, and their labels."""
        images, labels = self.train.fetch(indices)
        return (images if self.augment is None else self.augment(images, indices, epoch)), labels

    @property
    def image_shape(self) -> tuple:
        """Return (channels, height, width) of one image."""
        return tuple(self.train.image_shape)

    def close(self) -> None:
        """Stop the loader processes of both splits."""
        self.train.close()
        self.test.close()


def to_tensor_pair(images: np.ndarray, labels: np.ndarray) -> TensorPair:
    """Wrap uint8 or float images (N, C, H, W) and integer labels as tensors."""
    return TensorPair(torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)),
                      torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)))


def resize(pair: TensorPair, size: int) -> TensorPair:
    """Return the images resized to size x size (bilinear), labels unchanged."""
    if pair.images.shape[-2:] == (size, size):
        return pair
    images = F.interpolate(pair.images, size=(size, size), mode="bilinear", align_corners=False)
    return TensorPair(images.contiguous(), pair.labels)
