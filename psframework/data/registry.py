"""Load a configured dataset, built-in or from a factory, resized to the model's input."""

from __future__ import annotations

import gzip
import importlib.util
import os
from typing import Optional, Tuple

import numpy as np

from psframework.data.base import Dataset, resize, to_tensor_pair
from psframework.data.cifar import load_cifar10
from psframework.data.custom import custom_image_shape, custom_shape, load_custom
from psframework.data.folder import NAME as IMAGE_FOLDER, folder_image_shape, folder_shape, load_image_folder
from psframework.data.idx import load_mnist_like
from psframework.data.synthetic import make_synthetic
from psframework.data.transforms import augmentation, normalize
from psframework.errors import DatasetError
from psframework.imports import is_import_path

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 20231


def digits_file() -> Optional[str]:
    """Return the path of scikit-learn's digits.csv.gz, found without importing scikit-learn (None if absent)."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            return path
    return None


def read_digits() -> Tuple[np.ndarray, np.ndarray]:
    """Return the digits' 8x8 images and labels as scikit-learn's load_digits gives them.

    The file is read directly where it is found: importing scikit-learn costs about a second in
    every process that loads the data, and MPI jobs start many.
    """
    path = digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        table = np.loadtxt(fh, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def load_digits_arrays() -> tuple:
    """Return scikit-learn's bundled 8x8 digits as a fixed 80/20 train/test split."""
    raw_images, raw_labels = read_digits()
    images = raw_images.astype(np.float32)[:, None] / 16.0
    labels = raw_labels.astype(np.int64)
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = int(round(DIGITS_TEST_FRACTION * len(labels)))
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def load_dataset(data_cfg, input_size: Optional[int] = None) -> Dataset:
    """Return the dataset of a `data` config section, images resized to input_size."""
    name = data_cfg.dataset
    if is_import_path(name):
        return load_custom(data_cfg, input_size)
    if name == IMAGE_FOLDER:
        return load_image_folder(data_cfg, input_size)
    if name == "digits":
        arrays = load_digits_arrays()
        classes = 10
    elif name in ("mnist", "fashion-mnist"):
        arrays = load_mnist_like(data_cfg.root)
        classes = 10
    elif name == "cifar10":
        arrays = load_cifar10(data_cfg.root)
        classes = 10
    elif name == "synthetic":
        s = data_cfg.synthetic
        arrays = make_synthetic(s.channels, s.height, s.width, s.classes, s.train_size, s.test_size,
                                seed=data_cfg.seed, noise=s.noise)
        classes = s.classes
    else:
        raise DatasetError(f"data.dataset: unknown dataset {name!r}")
    train = to_tensor_pair(arrays[0], arrays[1])
    test = to_tensor_pair(arrays[2], arrays[3])
    if input_size is not None:
        train, test = resize(train, input_size), resize(test, input_size)
    normalize(train, test, data_cfg.normalize or "auto", data_cfg)
    return Dataset(name=name, train=train, test=test, num_classes=classes, augment=augmentation(data_cfg))


def dataset_shape(data_cfg) -> tuple:
    """Return (input channels, classes) of the configured dataset without loading it (a factory is called once)."""
    if is_import_path(data_cfg.dataset):
        return custom_shape(data_cfg)
    if data_cfg.dataset == IMAGE_FOLDER:
        return folder_shape(data_cfg)
    if data_cfg.dataset == "synthetic":
        return data_cfg.synthetic.channels, data_cfg.synthetic.classes
    if data_cfg.dataset == "cifar10":
        return 3, 10
    return 1, 10


NATIVE_SIZES = {"digits": 8, "mnist": 28, "fashion-mnist": 28, "cifar10": 32}


def image_shape(data_cfg) -> tuple:
    """Return (channels, height, width) of the dataset's images as stored, before any resize."""
    if is_import_path(data_cfg.dataset):
        return tuple(custom_image_shape(data_cfg))
    if data_cfg.dataset == IMAGE_FOLDER:
        return folder_image_shape(data_cfg)
    channels = dataset_shape(data_cfg)[0]
    if data_cfg.dataset == "synthetic":
        return channels, data_cfg.synthetic.height, data_cfg.synthetic.width
    return channels, NATIVE_SIZES[data_cfg.dataset], NATIVE_SIZES[data_cfg.dataset]
