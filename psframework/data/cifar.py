"""CIFAR-10, python version (pickled batches), read without arbitrary code execution."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np

from psframework.data.base import DatasetError

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
_EXPECTED = ("a CIFAR-10 python-version batch (a pickled dict with b'data': uint8 N x 3072 "
             "and b'labels': N integers)")
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"),
}


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
        raise DatasetError(f"corrupt file {path}: cannot unpickle it ({type(exc).__name__}: {exc}); "
                           f"expected {_EXPECTED}") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"corrupt file {path}: holds {type(obj).__name__}, expected {_EXPECTED}")
    data = obj.get(b"data", obj.get("data"))
    labels = obj.get(b"labels", obj.get("labels"))
    if data is None or labels is None:
        raise DatasetError(f"corrupt file {path}: no data/labels entries; expected {_EXPECTED}")
    data = np.asarray(data)
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DatasetError(f"corrupt file {path}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    if labels.shape != (data.shape[0],):
        raise DatasetError(f"corrupt file {path}: {data.shape[0]} images but {labels.size} labels")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetError(f"corrupt file {path}: labels {labels.min()}..{labels.max()}, expected 0..9")
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(root: str) -> tuple:
    """Return (train_x, train_y, test_x, test_y) from the five training batches and the test batch."""
    directory = cifar_dir(root)
    parts = [read_batch(os.path.join(directory, name)) for name in TRAIN_BATCHES]
    test_x, test_y = read_batch(os.path.join(directory, TEST_BATCH))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), test_x, test_y)
