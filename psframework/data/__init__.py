"""Datasets held in memory or streamed from a torch Dataset, with deterministic shuffling and sharding."""

from psframework.data.base import Dataset, Split, TensorPair
from psframework.data.loader import batch_indices, epoch_order, iterate_batches, num_batches, shard, shard_bounds
from psframework.data.registry import dataset_shape, image_shape, load_dataset
from psframework.data.stream import StreamedSplit
from psframework.errors import DatasetError

__all__ = [
    "Dataset", "DatasetError", "Split", "StreamedSplit", "TensorPair", "batch_indices", "epoch_order",
    "iterate_batches", "num_batches", "shard", "shard_bounds", "dataset_shape", "image_shape", "load_dataset",
]
