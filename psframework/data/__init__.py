"""Datasets held in memory, with deterministic shuffling and sharding."""

from psframework.data.base import Dataset, DatasetError, TensorPair
from psframework.data.loader import batch_indices, epoch_order, iterate_batches, num_batches, shard, shard_bounds
from psframework.data.registry import dataset_shape, load_dataset

__all__ = [
    "Dataset", "DatasetError", "TensorPair", "batch_indices", "epoch_order", "iterate_batches",
    "num_batches", "shard", "shard_bounds", "dataset_shape", "load_dataset",
]
