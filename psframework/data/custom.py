"""Datasets from a user's "package.module:factory": tensors held in memory or a torch Dataset streamed."""

from __future__ import annotations

import contextlib
import json
from typing import Any, ContextManager, Dict, Optional, Tuple

import numpy as np
import torch

from psframework.data.base import Dataset, TensorPair, resize
from psframework.data.stream import Samples, StreamedSplit, check_labels, label_array
from psframework.data.transforms import augmentation, normalize
from psframework.errors import ConfigError, DatasetError
from psframework.imports import call_factory, load_factory

KEY = "data.dataset"
_EXPECTED_SPLIT = "expected a map-style torch.utils.data.Dataset or an (images, labels) pair of tensors or arrays"
# ((C, H, W) of the stored train images, num_classes) per (import path, args): a factory is called once
# per process to learn them.
_SHAPES: Dict[Tuple[str, str], Tuple[Tuple[int, ...], int]] = {}


def _describe(obj: Any) -> str:
    """Name the kind of a returned value for an error message."""
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)} item{'' if len(obj) == 1 else 's'}"
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return f"{'a tensor' if isinstance(obj, torch.Tensor) else 'an array'} of shape {tuple(obj.shape)}"
    return "None" if obj is None else f"a {type(obj).__name__}"


def call_dataset_factory(data_cfg: Any) -> Tuple[Any, Any, Optional[int]]:
    """Call the configured factory and return (train, test, num_classes or None)."""
    path = data_cfg.dataset
    result = call_factory(load_factory(path, KEY), data_cfg.args, KEY)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ConfigError(f"{KEY}: {path} returned {_describe(result)}, expected a tuple (train, test) or "
                          f"(train, test, num_classes)")
    classes = result[2] if len(result) == 3 else None
    if classes is not None:
        if isinstance(classes, bool) or not isinstance(classes, (int, np.integer)) or classes < 1:
            raise ConfigError(f"{KEY}: {path} returned num_classes={classes!r}, expected a positive integer")
        classes = int(classes)
    for split, obj in (("train", result[0]), ("test", result[1])):
        is_streamed(obj, path, split)
    return result[0], result[1], classes


def is_streamed(obj: Any, path: str, split: str) -> bool:
    """Return whether a returned split is a Dataset to stream (else an in-memory pair); reject anything else."""
    if isinstance(obj, torch.utils.data.IterableDataset):
        raise ConfigError(f"{KEY}: {path} returned an iterable-style {type(obj).__name__} as {split}, "
                          f"{_EXPECTED_SPLIT}")
    if isinstance(obj, torch.utils.data.Dataset):
        if not hasattr(obj, "__len__"):
            raise ConfigError(f"{KEY}: {path} returned a {type(obj).__name__} without __len__ as {split}, "
                              f"{_EXPECTED_SPLIT}")
        return True
    arrays = (torch.Tensor, np.ndarray)
    if (isinstance(obj, (tuple, list)) and len(obj) == 2 and isinstance(obj[0], arrays)
            and isinstance(obj[1], arrays + (list, tuple))):
        return False
    raise ConfigError(f"{KEY}: {path} returned {_describe(obj)} as {split}, {_EXPECTED_SPLIT}")


def _images(images: Any, where: str) -> torch.Tensor:
    """Return in-memory images as a (N, C, H, W) tensor of their own numeric type (no copy)."""
    expected = "expected numeric images of shape (N, C, H, W) or (N, H, W)"
    if isinstance(images, np.ndarray) and images.dtype.kind not in "biuf":
        raise DatasetError(f"{where}: images are an array of {images.dtype}; {expected}")
    tensor = torch.as_tensor(images)
    if tensor.is_complex() or tensor.dim() not in (3, 4):
        raise DatasetError(f"{where}: images are {tensor.dtype} of shape {tuple(tensor.shape)}; {expected}")
    if tensor.shape[0] == 0:
        raise DatasetError(f"{where} is empty, expected at least one sample")
    return tensor.unsqueeze(1) if tensor.dim() == 3 else tensor


def _classes_from_labels(labels: np.ndarray) -> int:
    """Return max+1 of integer labels (at least 1; bad labels are reported by the range check after)."""
    if labels.dtype.kind not in "iuf" or labels.size == 0 or not np.isfinite(labels).all():
        return 1
    return max(int(np.floor(labels.max())) + 1, 1)


def num_classes_of(train: Any, classes: Optional[int], path: str) -> int:
    """Return the class count: the factory's, else len(train.classes), else max+1 of in-memory train labels."""
    if classes is not None:
        return classes
    names = getattr(train, "classes", None)
    if names is not None and hasattr(names, "__len__"):
        return len(names)
    if not is_streamed(train, path, "train"):
        return _classes_from_labels(label_array(train[1]))
    raise ConfigError(f"{KEY}: {path} returned a train Dataset without a .classes attribute, expected the factory "
                      f"to return (train, test, num_classes)")


def memory_split(pair: Any, classes: int, where: str, input_size: Optional[int]) -> TensorPair:
    """Return an (images, labels) pair as checked float32 images and int64 labels, resized to input_size."""
    images = _images(pair[0], where)
    labels = label_array(pair[1])
    if labels.ndim != 1 or len(labels) != images.shape[0]:
        raise DatasetError(f"{where}: {images.shape[0]} images but labels of shape {labels.shape}; "
                           f"expected one label per image")
    checked = check_labels(labels, classes, len(labels), f"{where}: its labels")
    split = TensorPair(images.to(torch.float32).contiguous(), checked)
    return resize(split, input_size) if input_size is not None else split


def _split(obj: Any, data_cfg: Any, split: str, classes: int, input_size: Optional[int]) -> Any:
    """Return one returned split as a StreamedSplit or a TensorPair."""
    path = data_cfg.dataset
    where = f"{KEY}: {path} {split} split"
    if is_streamed(obj, path, split):
        return StreamedSplit(obj, where, classes, data_cfg.loader_workers, input_size=input_size)
    return memory_split(obj, classes, where, input_size)


def _cache_key(data_cfg: Any) -> Tuple[str, str]:
    """Return the key of a factory call: its path and its arguments."""
    return data_cfg.dataset, json.dumps(data_cfg.args, sort_keys=True, default=repr)


def load_custom(data_cfg: Any, input_size: Optional[int] = None) -> Dataset:
    """Return the dataset a factory builds, normalised as `data.normalize` says (by default not: the factory's own)."""
    path = data_cfg.dataset
    with real_tensors():
        train, test, classes = call_dataset_factory(data_cfg)
        classes = num_classes_of(train, classes, path)
        dataset = Dataset(name=path, train=_split(train, data_cfg, "train", classes, input_size),
                          test=_split(test, data_cfg, "test", classes, input_size), num_classes=classes,
                          augment=augmentation(data_cfg))
        normalize(dataset.train, dataset.test, data_cfg.normalize or "none", data_cfg)
    stored = dataset.image_shape if is_streamed(train, path, "train") else _images(train[0], "").shape[1:]
    _SHAPES[_cache_key(data_cfg)] = (tuple(int(n) for n in stored), classes)
    return dataset


def real_tensors() -> ContextManager[Any]:
    """Return a context that lifts an ambient meta default device, under which a factory's data has no values."""
    return torch.device("cpu") if torch.get_default_device().type == "meta" else contextlib.nullcontext()


def custom_shape(data_cfg: Any) -> Tuple[int, int]:
    """Return (in_channels, num_classes) of a factory's dataset from its first train sample."""
    shape, classes = _stored(data_cfg)
    return shape[0], classes


def custom_image_shape(data_cfg: Any) -> Tuple[int, ...]:
    """Return (channels, height, width) of a factory's train images as stored (before any resize)."""
    return _stored(data_cfg)[0]


def _stored(data_cfg: Any) -> Tuple[Tuple[int, ...], int]:
    """Return the cached ((C, H, W), num_classes) of a factory's dataset, calling the factory the first time."""
    key = _cache_key(data_cfg)
    if key not in _SHAPES:
        with real_tensors():
            _SHAPES[key] = _first_sample_shape(data_cfg)
    return _SHAPES[key]


def _first_sample_shape(data_cfg: Any) -> Tuple[Tuple[int, ...], int]:
    """Call the factory and return ((C, H, W), num_classes) from its first train sample."""
    path = data_cfg.dataset
    train, _, classes = call_dataset_factory(data_cfg)
    classes = num_classes_of(train, classes, path)
    where = f"{KEY}: {path} train split"
    if not is_streamed(train, path, "train"):
        return tuple(int(n) for n in _images(train[0], where).shape[1:]), classes
    if len(train) == 0:
        raise DatasetError(f"{where} is empty, expected at least one sample")
    image, _, problem = Samples(train, where, classes)[0]
    if problem:
        raise DatasetError(problem)
    return tuple(int(n) for n in image.shape), classes
