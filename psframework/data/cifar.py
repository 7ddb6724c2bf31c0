"""CIFAR-10, python version (pickled batches), read without arbitrary code execution."""

from __future__ import annotations

import io
import os
import pickle
from typing import Optional

import numpy as np

from psframework.errors import DatasetError

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
_EXPECTED = ("a CIFAR-10 python-version batch (a pickled dict with b'data': uint8 N x 3072 "
             "and b'labels': N integers)")
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"),
}
# Marks an absent batch entry (None is a value a file may hold).
_MISSING = object()


class _SafeUnpickler(pickle.Unpickler):
    """Unpickle only the NumPy pieces a CIFAR batch is made of."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def cifar_dir(root: str) -> str:
    """Return the directory holding the batches: root itself or root/cifar-10-batches-py."""
    nested = os.path.join(root, "cifar-10-batches-py")
    return nested if os.path.isdir(nested) else root


def _entry(batch: dict, name: str) -> object:
    """Return batch[b'name'] or batch['name'], or _MISSING when neither is there."""
    for key in (name.encode(), name):
        if key in batch:
            return batch[key]
    return _MISSING


def _describe(obj: object) -> str:
    """Name the kind of a pickled value for an error message."""
    if obj is None:
        return "None"
    if isinstance(obj, dict):
        return "a dict"
    if isinstance(obj, np.ndarray):
        return f"an array of shape {obj.shape}"
    return type(obj).__name__


def _show(value: object, limit: int = 40) -> str:
    """Return a short one-line repr of a value."""
    # NumPy scalars print as plain values (2.5, not np.float32(2.5)).
    if isinstance(value, (np.number, np.bool_)):
        return str(value)
    if isinstance(value, np.generic):
        value = value.item()
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _label_problem(value: object) -> Optional[str]:
    """Return what is wrong with one label, or None when it is an integer 0..9."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "is a bool, not an integer"
    if isinstance(value, float):
        # NaN and inf are not integral either.
        if not value.is_integer():
            return "is not an integer"
        value = int(value)
    if not isinstance(value, int):
        return f"is {type(value).__name__}, not an integer"
    if not 0 <= value <= 9:
        return "is outside 0..9"
    return None


def _check_data(path: str, data: object) -> np.ndarray:
    """Return the image rows; reject anything but a uint8 (N, 3072) array."""
    if not isinstance(data, np.ndarray):
        raise DatasetError(f"corrupt file {path}: data is {_describe(data)}, expected uint8 (N, 3072)")
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DatasetError(f"corrupt file {path}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    return data


def _check_labels(path: str, labels: object, count: int) -> np.ndarray:
    """Return the labels as int64; reject anything but `count` integers 0..9."""
    expected = f"expected {count} integer labels 0..9"
    if isinstance(labels, np.ndarray) and labels.ndim == 1:
        labels = labels.tolist()
    if not isinstance(labels, (list, tuple)):
        raise DatasetError(f"corrupt file {path}: labels are {_describe(labels)}; {expected}")
    if len(labels) != count:
        raise DatasetError(f"corrupt file {path}: {count} images but {len(labels)} labels; {expected}")
    for index, value in enumerate(labels):
        problem = _label_problem(value)
        if problem:
            raise DatasetError(f"corrupt file {path}: label {_show(value)} at index {index} {problem}; {expected}")
    return np.array([int(value) for value in labels], dtype=np.int64)


def read_batch(path: str) -> tuple:
    """Read one batch file; return images (N, 3, 32, 32) uint8 and labels (N,)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise DatasetError(f"missing file {path}: expected {_EXPECTED}") from None
    try:
        obj = _SafeUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # any unpickling failure means a corrupt or foreign file
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise DatasetError(f"corrupt file {path}: cannot unpickle it ({message}); expected {_EXPECTED}") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"corrupt file {path}: holds {type(obj).__name__}, expected {_EXPECTED}")
    data, labels = _entry(obj, "data"), _entry(obj, "labels")
    if data is _MISSING or labels is _MISSING:
        raise DatasetError(f"corrupt file {path}: no data/labels entries; expected {_EXPECTED}")
    data = _check_data(path, data)
    labels = _check_labels(path, labels, data.shape[0])
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(root: str) -> tuple:
    """Return (train_x, train_y, test_x, test_y) from the five training batches and the test batch."""
    directory = cifar_dir(root)
    parts = [read_batch(os.path.join(directory, name)) for name in TRAIN_BATCHES]
    test_x, test_y = read_batch(os.path.join(directory, TEST_BATCH))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), test_x, test_y)
