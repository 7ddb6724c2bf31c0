"""Datasets from a user's factory: tensors in memory, a torch Dataset streamed, and one-line errors."""

from __future__ import annotations

import collections
import textwrap
import uuid

import numpy as np
import pytest
import torch

from psframework.config import DataConfig
from psframework.errors import ConfigError
from psframework.data import (DatasetError, Split, StreamedSplit, TensorPair, dataset_shape, iterate_batches,
                              load_dataset, shard)
from psframework.data.custom import custom_image_shape

# Written at the top of every factory module: a dataset whose pixels hold the sample index and whose
# reads can be counted across loader processes (each __getitem__ appends its index to a file).
PRELUDE = '''
import numpy as np
import torch

CALLS = []


class Counted(torch.utils.data.Dataset):
    def __init__(self, n, log=None, shape=(3, 8, 8), classes=True, targets=False):
        self.n, self.log, self.shape = n, log, tuple(shape)
        if classes:
            self.classes = [f"c{k}" for k in range(5)]
        if targets:
            self.targets = [i % 5 for i in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if self.log:
            with open(self.log, "a") as fh:
                fh.write(f"{index}\\n")
        return self.image(index), self.label(index)

    def image(self, index):
        return torch.full(self.shape, float(index))

    def label(self, index):
        return index % 5
'''


@pytest.fixture
def factory(tmp_path, monkeypatch):
    """Return a function that writes a factory module and returns its import path."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str, name: str = "make") -> str:
        module = f"factory_{uuid.uuid4().hex}"  # a fresh name, so no earlier import is reused
        (tmp_path / f"{module}.py").write_text(PRELUDE + textwrap.dedent(body))
        return f"{module}:{name}"

    return write


def data_config(path: str, workers: int = 0, **args):
    """Return the data section naming a factory, its arguments and loader workers."""
    return DataConfig(dataset=path, args=dict(args), loader_workers=workers)


def expected(indices) -> tuple:
    """Return the images and labels Counted holds at these indices."""
    images = torch.stack([torch.full((3, 8, 8), float(i)) for i in indices])
    return images, torch.tensor([i % 5 for i in indices], dtype=torch.int64)


def assert_batch(batch, indices) -> None:
    """Check a fetched batch against the samples at these indices."""
    images, labels = expected(indices)
    assert batch[0].dtype == torch.float32 and batch[1].dtype == torch.int64
    torch.testing.assert_close(batch[0], images)
    torch.testing.assert_close(batch[1], labels)


def reads(log) -> collections.Counter:
    """Return how often each sample was read, from a Counted log."""
    return collections.Counter(int(line) for line in log.read_text().split()) if log.exists() else collections.Counter()


def two_epochs(num_samples: int, batch_size: int) -> list:
    """Return the global batches of epochs 0 and 1 of seed 3."""
    return [b for epoch in (0, 1) for b in iterate_batches(num_samples, batch_size, 3, epoch)]


# ------------------------------------------------------------------ in memory

def test_tensors_are_held_in_memory_unstandardised(factory):
    path = factory('''
        def make():
            train = (torch.arange(20 * 64, dtype=torch.uint8).reshape(20, 8, 8), torch.arange(20) % 4)
            test = (np.ones((6, 1, 8, 8)), np.array([0, 1, 2, 3, 0, 1]))
            return train, test
    ''')
    with torch.device("meta"):  # where a model is built to check its shapes: the data must still be real
        assert dataset_shape(data_config(path)) == (1, 4)
    data = load_dataset(data_config(path))
    assert data.name == path and data.num_classes == 4
    assert isinstance(data.train, TensorPair) and data.image_shape == (1, 8, 8)
    assert data.train.images.dtype == torch.float32 and data.test.labels.dtype == torch.int64
    torch.testing.assert_close(data.train.images[3, 0], torch.arange(192, 256, dtype=torch.float32).reshape(8, 8))
    assert float(data.test.images.mean()) == 1.0  # the factory owns normalisation
    assert load_dataset(data_config(path), input_size=16).image_shape == (1, 16, 16)
    assert custom_image_shape(data_config(path)) == (1, 8, 8)  # as stored, before the resize


def test_in_memory_split_serves_the_interface(factory):
    path = factory('''
        def make(classes):
            rng = np.random.default_rng(0)
            train = (rng.standard_normal((30, 2, 5, 5)), rng.integers(0, 3, 30))
            return train, (rng.standard_normal((7, 2, 5, 5)), rng.integers(0, 3, 7)), classes
    ''')
    data = load_dataset(data_config(path, classes=6))
    assert data.num_classes == 6
    split = data.train
    assert isinstance(split, Split)
    split.prefetch(iter([np.arange(4)]))  # nothing to do in memory
    indices = np.array([7, 2, 29, 2])
    images, labels = split.fetch(indices)
    torch.testing.assert_close(images, split.images[torch.from_numpy(indices)])
    torch.testing.assert_close(labels, split.labels[torch.from_numpy(indices)])
    torch.testing.assert_close(split.labels_of(indices[1:3]), split.labels[[2, 29]])
    batches = list(data.test.batches(3))
    assert [len(labels) for _, labels in batches] == [3, 3, 1]
    torch.testing.assert_close(torch.cat([images for images, _ in batches]), data.test.images)
    assert split.to("cpu").image_shape == (2, 5, 5)


# ------------------------------------------------------------------ streamed

@pytest.mark.parametrize("workers", [0, 2])
def test_streamed_fetch_follows_the_plan(factory, workers):
    path = factory('''
        def make():
            return Counted(40), Counted(11)
    ''')
    data = load_dataset(data_config(path, workers), input_size=8)
    assert data.name == path and data.num_classes == 5 and data.image_shape == (3, 8, 8)
    split = data.train
    assert isinstance(split, StreamedSplit) and isinstance(split, Split) and len(split) == 40
    plan = two_epochs(40, 8)
    split.prefetch(iter(plan))
    try:
        for number, indices in enumerate(plan):
            if number == 3:
                continue  # a worker that sits out an iteration asks for the next batch
            if number == 6:
                assert_batch(split.fetch(np.array([39, 0, 5])), [39, 0, 5])  # outside the plan
            assert_batch(split.fetch(indices), indices)
    finally:
        data.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_worker_reads_only_its_shard(factory, tmp_path, workers):
    log = tmp_path / "reads.txt"
    path = factory('''
        def make(log):
            return Counted(60, log=log), Counted(5)
    ''')
    split = load_dataset(data_config(path, workers, log=str(log))).train
    log.unlink()  # loading read sample 0 for its shape
    shards = [shard(indices, 1, 3) for indices in iterate_batches(60, 9, 3, 0)]
    split.prefetch(iter(shards))
    for number, indices in enumerate(shards):
        if number != 2:
            assert_batch(split.fetch(indices), indices)
    split.close()
    counts = reads(log)
    fetched = [int(i) for number, indices in enumerate(shards) if number != 2 for i in indices]
    skipped = set(shards[2].tolist())
    assert all(counts[i] == 1 for i in fetched), counts
    assert set(counts) <= set(fetched) | skipped  # a skipped batch may have been loaded ahead, nothing else
    if workers == 0:
        assert not set(counts) & skipped  # loading in this process, a skipped batch is never read


def test_random_access_without_and_beside_a_plan(factory):
    path = factory('''
        def make():
            return Counted(30), Counted(5)
    ''')
    split = load_dataset(data_config(path)).train
    assert_batch(split.fetch(np.array([4, 4, 29])), [4, 4, 29])  # no plan announced
    batches = list(iterate_batches(30, 6, 0, 0))
    split.prefetch(shard(b, 0, 2) for b in batches)
    for indices in batches:
        other = shard(indices, 1, 2)  # rank 0 recomputing another worker's shard
        assert_batch(split.fetch(other), other)
        assert_batch(split.fetch(shard(indices, 0, 2)), shard(indices, 0, 2))
    split.close()


@pytest.mark.parametrize("targets", [True, False])
def test_labels_of(factory, tmp_path, targets):
    log = tmp_path / "reads.txt"
    path = factory('''
        def make(log, targets):
            return Counted(25, log=log, targets=targets), Counted(5)
    ''')
    split = load_dataset(data_config(path, log=str(log), targets=targets)).train
    log.unlink()
    indices = np.array([24, 3, 3, 10])
    labels = split.labels_of(indices)
    assert labels.dtype == torch.int64 and labels.tolist() == [4, 3, 3, 0]
    assert sorted(reads(log).elements()) == ([] if targets else [3, 3, 10, 24])


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_cover_the_split_in_order(factory, workers):
    path = factory('''
        def make():
            return Counted(12), Counted(11)
    ''')
    test = load_dataset(data_config(path, workers)).test
    batches = list(test.batches(4))
    assert [len(labels) for _, labels in batches] == [4, 4, 3]
    images, labels = expected(range(11))
    torch.testing.assert_close(torch.cat([b[0] for b in batches]), images)
    torch.testing.assert_close(torch.cat([b[1] for b in batches]), labels)


def test_dataset_shape_calls_the_factory_once(factory):
    path = factory('''
        def make(channels=3):
            CALLS.append(channels)
            return Counted(10, shape=(channels, 4, 4), classes=False), Counted(3), 7
    ''')
    module = __import__(path.partition(":")[0])
    assert dataset_shape(data_config(path)) == (3, 7)
    assert dataset_shape(data_config(path)) == (3, 7)
    assert dataset_shape(data_config(path, channels=2)) == (2, 7)
    assert custom_image_shape(data_config(path, channels=2)) == (2, 4, 4)
    assert module.CALLS == [3, 2]


# ------------------------------------------------------------------ bad inputs

LOAD_ERRORS = [
    ("[Counted(4), Counted(4)]", ConfigError,
     "returned a list of 2 items, expected a tuple (train, test) or (train, test, num_classes)"),
    ("Counted(4), Counted(4), 5, 6", ConfigError,
     "returned a tuple of 4 items, expected a tuple (train, test) or (train, test, num_classes)"),
    ("'train.npz', Counted(4)", ConfigError, "returned a str as train, expected a map-style "
     "torch.utils.data.Dataset or an (images, labels) pair of tensors or arrays"),
    ("Counted(4), (torch.zeros(3, 8, 8),)", ConfigError, "returned a tuple of 1 item as test, expected"),
    ("Counted(4), Counted(4), 'ten'", ConfigError, "returned num_classes='ten', expected a positive integer"),
    ("Counted(4, classes=False), Counted(4)", ConfigError,
     "returned a train Dataset without a .classes attribute, expected the factory to return (train, test, "
     "num_classes)"),
    ("(torch.zeros(10, 8, 8), torch.zeros(9)), Counted(4)", DatasetError,
     "train split: 10 images but labels of shape (9,); expected one label per image"),
    ("(torch.zeros(4, 8, 8), torch.tensor([0.0, 1.5, 2.0, 1.0])), Counted(4)", DatasetError,
     "train split: its labels hold 1 non-integer labels (first 1.5 at index 1); expected 4 integer labels 0..2"),
    ("(torch.zeros(4, 8, 8), torch.arange(4)), (torch.zeros(2, 8, 8), torch.tensor([1, 7])), 5", DatasetError,
     "test split: its labels hold 1 labels outside 0..4 (first 7 at index 1); expected 2 integer labels 0..4"),
    ("(torch.zeros(0, 8, 8), torch.zeros(0)), Counted(4), 3", DatasetError,
     "train split is empty, expected at least one sample"),
    ("Counted(4), Counted(0)", DatasetError, "test split is empty, expected at least one sample"),
    ("(torch.zeros(4), torch.arange(4)), Counted(4)", DatasetError,
     "train split: images are torch.float32 of shape (4,); expected numeric images of shape (N, C, H, W) or "
     "(N, H, W)"),
    ("Stringy(4), Counted(4)", DatasetError, "train split: the image of sample 0 is str, expected a tensor "
     "or array of shape (C, H, W) or (H, W)"),
    ("Bare(4), Counted(4)", DatasetError, "train split: sample 0 is int, expected an (image, label) pair"),
    ("Counted(4, shape=(3, 6, 6)), Counted(4)", DatasetError,
     "train split: sample 0 has shape (3, 6, 6), expected 8 x 8 images"),
]
BAD_DATASETS = '''
class Stringy(Counted):
    def image(self, index):
        return "pixels"


class Bare(Counted):
    def __getitem__(self, index):
        return index


class Labelled(Counted):
    def label(self, index):
        return {3: 9, 5: 1.5}.get(index, 0)


class Broken(Counted):
    def image(self, index):
        if index == 7:
            raise ValueError(f"bad record {index}\\n(details)")
        return super().image(index)


class Shapely(Counted):
    def image(self, index):
        return torch.zeros(3, 8, 8 if index < 6 else 7)


def make(body):
    return eval(body)
'''


def assert_one_line(info, path: str, error: type, phrase: str) -> None:
    """Check a raised error: its type, one line, data.dataset and the path, and the phrase."""
    message = str(info.value)
    assert type(info.value) is error, message
    assert "\n" not in message, message
    assert message.startswith(f"data.dataset: {path}"), message
    assert phrase in message, message


@pytest.mark.parametrize("returns, error, phrase", LOAD_ERRORS)
def test_bad_factory_results_are_one_line_errors(factory, returns, error, phrase):
    path = factory(BAD_DATASETS)
    cfg = data_config(path, body=returns)
    with pytest.raises((ConfigError, DatasetError)) as info:
        load_dataset(cfg, input_size=8)
    assert_one_line(info, path, error, phrase)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset, indices, phrase", [
    ("Labelled", [2, 3], "train split: the label of sample 3 is 9, outside 0..4; expected an integer label 0..4"),
    ("Labelled", [5], "train split: the label of sample 5 is 1.5, expected an integer label 0..4"),
    ("Shapely", [1, 7], "train split: sample 7 has shape (3, 8, 7), expected (3, 8, 8) like sample 0"),
    ("Broken", [2, 7], "train split: sample 7 does not load: ValueError: bad record 7"),
])
def test_bad_samples_fail_when_fetched(factory, workers, dataset, indices, phrase):
    path = factory(BAD_DATASETS)
    split = load_dataset(data_config(path, workers, body=f"{dataset}(10), Counted(4)")).train
    for plan in ([], [np.array(indices)]):
        split.prefetch(iter(plan))
        with pytest.raises(DatasetError) as info:
            split.fetch(np.array(indices))
        assert_one_line(info, path, DatasetError, phrase)
    split.close()


def test_bad_targets_are_one_line_errors(factory):
    path = factory('''
        class Targeted(Counted):
            targets = [0, 1, 2, 11]

        def make():
            return Targeted(4), Counted(4)
    ''')
    split = load_dataset(data_config(path)).train
    with pytest.raises(DatasetError) as info:
        split.labels_of(np.array([0]))
    assert_one_line(info, path, DatasetError, "train split: its targets hold 1 labels outside 0..4 (first 11 at "
                    "index 3); expected 4 integer labels 0..4")


def test_indices_out_of_range_are_index_errors(factory):
    path = factory('''
        def make():
            return Counted(10), Counted(4)
    ''')
    split = load_dataset(data_config(path)).train
    for call in (split.fetch, split.labels_of):
        with pytest.raises(IndexError, match="sample index 10 is outside 0..9"):
            call(np.array([3, 10]))


def test_plans_can_be_replaced_and_closed_twice(factory):
    path = factory('''
        def make():
            return Counted(16), Counted(4)
    ''')
    split = load_dataset(data_config(path, 2)).train
    for epoch in range(2):
        plan = list(iterate_batches(16, 4, 1, epoch))
        split.prefetch(iter(plan))
        assert_batch(split.fetch(plan[0]), plan[0])
    split.close()
    split.close()
    assert_batch(split.fetch(plan[1]), plan[1])
