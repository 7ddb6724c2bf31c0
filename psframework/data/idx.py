"""MNIST-style IDX files (raw or gzip): MNIST and Fashion-MNIST."""

from __future__ import annotations

import gzip
import os
import struct
from typing import Optional

import numpy as np

from psframework.errors import DatasetError
from psframework.data.stream import label_values_problem

_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str, ndim: Optional[int] = None) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed); check its header against its size."""
    expected = "an IDX file (magic 0x0000TTDD, big-endian dimensions, then the data)"
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise DatasetError(f"missing file {path}: expected {expected}") from None
    except (OSError, EOFError) as exc:
        raise DatasetError(f"corrupt file {path}: cannot read it ({exc}); expected {expected}") from None
    if len(raw) < 4:
        raise DatasetError(f"corrupt file {path}: {len(raw)} bytes, too short for {expected}")
    zero, type_code, dims = struct.unpack(">HBB", raw[:4])
    if zero != 0 or type_code not in _IDX_TYPES or dims == 0:
        raise DatasetError(f"corrupt file {path}: bad magic number 0x{raw[:4].hex()}; expected {expected}")
    if ndim is not None and dims != ndim:
        raise DatasetError(f"corrupt file {path}: {dims} dimensions, expected {ndim}")
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DatasetError(f"corrupt file {path}: truncated header; expected {expected}")
    shape = struct.unpack(">" + "I" * dims, raw[4:header])
    dtype = np.dtype(_IDX_TYPES[type_code])
    need = int(np.prod(shape)) * dtype.itemsize
    have = len(raw) - header
    if have != need:
        state = "truncated" if have < need else "has trailing bytes"
        raise DatasetError(f"corrupt file {path}: {state}: header says shape {shape} ({need} data bytes), "
                           f"file holds {have}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def find_file(root: str, stem: str) -> str:
    """Return root/stem or root/stem.gz, whichever exists, else a clear error."""
    for candidate in (stem, stem + ".gz"):
        path = os.path.join(root, candidate)
        if os.path.isfile(path):
            return path
    raise DatasetError(f"missing file {os.path.join(root, stem)}[.gz]: expected the IDX file {stem} "
                       f"(raw or gzip) in data.root={root}")


def check_pixels(path: str, images: np.ndarray) -> None:
    """Reject float images that hold NaN or infinite pixels."""
    if images.dtype.kind != "f":
        return
    bad = ~np.isfinite(images)
    count = int(bad.sum())
    if count:
        image, row, col = np.unravel_index(int(np.argmax(bad)), images.shape)
        value = images[image, row, col]
        raise DatasetError(f"corrupt file {path}: {count} non-finite pixel values (first {value!s} at image {image}, "
                           f"row {row}, column {col}); expected finite pixel values")


def check_labels(path: str, labels: np.ndarray) -> np.ndarray:
    """Return the labels as integers; reject non-integral values and values outside 0..9."""
    problem = label_values_problem(labels, 10)
    if problem:
        raise DatasetError(f"corrupt file {path}: {problem}; expected integer labels 0..9")
    return labels.astype(np.int64) if labels.dtype.kind == "f" else labels


def load_mnist_like(root: str) -> tuple:
    """Return (train_x, train_y, test_x, test_y) as uint8 (N, 1, 28, 28) and labels."""
    arrays = {}
    for key, stem in MNIST_FILES.items():
        path = find_file(root, stem)
        if key.endswith("images"):
            arrays[key] = read_idx(path, ndim=3)
            check_pixels(path, arrays[key])
        else:
            arrays[key] = check_labels(path, read_idx(path, ndim=1))
    for split in ("train", "test"):
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if x.shape[0] != y.shape[0]:
            raise DatasetError(f"{split} split in {root}: {x.shape[0]} images but {y.shape[0]} labels")
    return (arrays["train_images"][:, None], arrays["train_labels"],
            arrays["test_images"][:, None], arrays["test_labels"])
