"""The transforms a `data` config asks for: normalisation of both splits and augmentation of training batches."""

from __future__ import annotations

from typing import Any, Optional

from psframework.data.augment import CropFlip, Normalize
from psframework.data.base import Augment, Split, TensorPair
from psframework.errors import DatasetError


def augmentation(data_cfg: Any) -> Optional[Augment]:
    """Return the augmentation of training batches that `data.augment` asks for (None: none)."""
    if data_cfg.augment == "none":
        return None
    return CropFlip(data_cfg.augment_padding, data_cfg.augment_flip, data_cfg.seed)


def normalize(train: Split, test: Split, how: str, data_cfg: Any) -> None:
    """Normalise both splits per channel: by the train split's statistics (auto), by data.mean/std (fixed), or not.

    Images held in memory are normalised once, in place; a streamed split normalises each batch it delivers.
    """
    if how == "none":
        return
    if how == "fixed":
        norm = Normalize(tuple(data_cfg.mean), tuple(data_cfg.std))
        channels = train.image_shape[0]
        if len(norm.mean) != channels:
            raise DatasetError(f"data.mean: got {len(norm.mean)} values, expected one per channel of the "
                               f"{channels}-channel images")
    elif isinstance(train, TensorPair):
        norm = Normalize.of(train.images)
    else:
        norm = Normalize.over(images for images, _ in train.batches(256))
    for split in (train, test):
        if isinstance(split, TensorPair):
            split.images = norm(split.images).contiguous()
        else:
            split.normalize = norm
