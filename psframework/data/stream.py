"""A split read from a map-style torch Dataset, its batches loaded ahead in the order of the training plan."""

from __future__ import annotations

import collections
import copy
import weakref
from typing import Any, Callable, Deque, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from psframework.errors import DatasetError

# How many announced index arrays fetch looks through for a request that skipped some (a worker that
# sat out an iteration asks for a later batch of its plan).
LOOKAHEAD = 16
# Batches each loader worker process keeps ready.
READ_AHEAD = 2

Batch = Tuple[torch.Tensor, torch.Tensor, str]


def one_line(exc: BaseException) -> str:
    """Return an exception as 'Type: message' on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def sample_image(image: Any) -> Union[torch.Tensor, str]:
    """Return an image as float32 (C, H, W), or what is wrong with it."""
    expected = "expected a tensor or array of shape (C, H, W) or (H, W)"
    if isinstance(image, np.ndarray):
        if image.dtype.kind not in "biuf":
            return f"is an array of {image.dtype}, {expected}"
        image = torch.from_numpy(np.ascontiguousarray(image))
    elif not isinstance(image, torch.Tensor):
        return f"is {type(image).__name__}, {expected}"
    if image.is_complex():
        return f"is a tensor of {image.dtype}, {expected}"
    if image.dim() == 2:
        image = image.unsqueeze(0)
    if image.dim() != 3:
        return f"has shape {tuple(image.shape)}, {expected}"
    return image.to(torch.float32)


def sample_label(value: Any, num_classes: int) -> Union[int, str]:
    """Return a label as an int, or what is wrong with it."""
    expected = f"expected an integer label 0..{num_classes - 1}"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if int(np.prod(value.shape)) != 1:
            return f"is an array of shape {tuple(value.shape)}, {expected}"
        value = value.reshape(-1)[0].item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {type(value).__name__}, {expected}"
    if isinstance(value, float):
        # A whole float (3.0) is a label; 3.5, NaN and inf are not.
        if not value.is_integer():
            return f"is {value}, {expected}"
        value = int(value)
    if not 0 <= value < num_classes:
        return f"is {value}, outside 0..{num_classes - 1}; {expected}"
    return value


class Samples(torch.utils.data.Dataset):
    """The user's dataset with each item checked: (image float32 (C, H, W), label int, problem '')."""

    def __init__(self, dataset: Any, where: str, num_classes: int, shape: Optional[Sequence[int]] = None) -> None:
        self.dataset = dataset
        self.where = where
        self.num_classes = num_classes
        self.shape = tuple(shape) if shape is not None else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Tuple[Optional[torch.Tensor], int, str]:
        # Problems travel back as text: an exception raised in a loader process reaches the caller
        # wrapped in a multi-line traceback, and the CLI prints errors as one line.
        try:
            item = self.dataset[index]
        except Exception as exc:  # the user's __getitem__ may raise anything
            return None, 0, f"{self.where}: sample {index} does not load: {one_line(exc)}"
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            return None, 0, f"{self.where}: sample {index} is {type(item).__name__}, expected an (image, label) pair"
        image = sample_image(item[0])
        if isinstance(image, str):
            return None, 0, f"{self.where}: the image of sample {index} {image}"
        if self.shape is not None and tuple(image.shape) != self.shape:
            return None, 0, (f"{self.where}: sample {index} has shape {tuple(image.shape)}, expected {self.shape} "
                             f"like sample 0")
        label = sample_label(item[1], self.num_classes)
        if isinstance(label, str):
            return None, 0, f"{self.where}: the label of sample {index} {label}"
        return image, label, ""


def collate(items: List[Tuple[Optional[torch.Tensor], int, str]]) -> Batch:
    """Stack checked samples to float32 images and int64 labels; carry the first problem instead."""
    for _, _, problem in items:
        if problem:
            return torch.empty(0), torch.empty(0, dtype=torch.int64), problem
    images = torch.stack([image for image, _, _ in items])
    labels = torch.tensor([label for _, label, _ in items], dtype=torch.int64)
    return images, labels, ""


class Plan:
    """The index arrays announced by prefetch: queued ones, and those handed to the loader but not yet taken."""

    def __init__(self, plan: Iterable[np.ndarray]) -> None:
        self.source = iter(plan)
        self.queued: Deque[np.ndarray] = collections.deque()
        self.loading: Deque[np.ndarray] = collections.deque()

    def __iter__(self) -> Iterator[List[int]]:
        while self.queued or self.peek(1):
            indices = self.queued.popleft()
            self.loading.append(indices)
            yield indices.tolist()

    def finished(self) -> bool:
        """Return whether every announced batch has been taken from the loader."""
        return not self.loading and not self.peek(1)

    def peek(self, count: int) -> bool:
        """Queue up to `count` index arrays from the plan; return whether any is queued."""
        while len(self.queued) < count:
            indices = next(self.source, None)
            if indices is None:
                break
            self.queued.append(np.asarray(indices))
        return bool(self.queued)


def _shutdown(iterator: Any) -> None:
    """Stop a loader's worker processes (a no-op for one that loads in the calling process)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def _find(arrays: Iterable[np.ndarray], indices: np.ndarray) -> int:
    """Return the position of the first array equal to `indices`, or -1."""
    for position, candidate in enumerate(arrays):
        if np.array_equal(candidate, indices):
            return position
    return -1


class Prefetcher:
    """A DataLoader over a plan of index arrays whose batches are handed out when they are asked for."""

    def __init__(self, samples: Samples, plan: Iterable[np.ndarray], workers: int, pin: bool) -> None:
        self.plan = Plan(plan)
        extra = {"prefetch_factor": READ_AHEAD} if workers > 0 else {}
        loader = DataLoader(samples, batch_sampler=self.plan, num_workers=workers, collate_fn=collate,
                            pin_memory=pin, **extra)
        self.iterator = iter(loader)
        # The finalizer holds the iterator, not self, so an unreferenced prefetcher is still collected;
        # it also runs at interpreter exit, before the modules the workers' shutdown needs are torn down.
        self._finalizer = weakref.finalize(self, _shutdown, self.iterator)

    def take(self, indices: np.ndarray) -> Optional[Batch]:
        """Return the planned batch of exactly these indices (skipping earlier ones), or None when none is ahead."""
        position = _find(self.plan.loading, indices)
        if position < 0:
            self.plan.peek(LOOKAHEAD)
            position = _find(self.plan.queued, indices)
            if position < 0:
                return None
            # Drop the skipped arrays before the loader asks for more, then discard what it loaded already.
            for _ in range(position):
                self.plan.queued.popleft()
            position = len(self.plan.loading)
        for _ in range(position):
            next(self.iterator)
            self.plan.loading.popleft()
        batch = next(self.iterator)
        self.plan.loading.popleft()
        if self.plan.finished():
            self.close()  # the worker processes have nothing left to load
        return batch

    def close(self) -> None:
        """Stop the loader's worker processes."""
        self._finalizer()


class StreamedSplit:
    """A train or test split read sample by sample from a map-style torch Dataset.

    `where` starts every error message (data.dataset and the split), `workers` is data.loader_workers
    and `input_size`, when given, is the height and width every image must have.
    """

    def __init__(self, dataset: Any, where: str, num_classes: int, workers: int = 0, device: Any = None,
                 input_size: Optional[int] = None) -> None:
        self.dataset = dataset
        self.where = where
        self.num_classes = num_classes
        self.workers = workers
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.input_size = input_size
        self._size = len(dataset)
        self._samples = Samples(dataset, where, num_classes, self._first_shape())
        self._ahead: Optional[Prefetcher] = None
        self._targets: Optional[torch.Tensor] = None
        self.normalize: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # applied to every batch delivered

    def _first_shape(self) -> Tuple[int, ...]:
        """Load sample 0 and return its image shape; reject one unlike the model's input size."""
        if self._size == 0:
            raise DatasetError(f"{self.where} is empty, expected at least one sample")
        image, _, problem = Samples(self.dataset, self.where, self.num_classes)[0]
        if problem:
            raise DatasetError(problem)
        size = self.input_size
        if size is not None and tuple(image.shape[1:]) != (size, size):
            raise DatasetError(f"{self.where}: sample 0 has shape {tuple(image.shape)}, expected {size} x {size} "
                               f"images (the model's input size); resize them in the dataset")
        return tuple(image.shape)

    def __len__(self) -> int:
        return self._size

    @property
    def image_shape(self) -> Tuple[int, ...]:
        """Return (channels, height, width) of one image."""
        return tuple(self._samples.shape)

    def to(self, device: Any) -> "StreamedSplit":
        """Return the same split delivering its batches on `device` (itself when it does already)."""
        device = torch.device(device)
        if device == self.device:
            return self
        # A copy shares the checked first sample and targets; it starts without a plan of its own.
        moved = copy.copy(self)
        moved.device, moved._ahead = device, None
        return moved

    def prefetch(self, plan: Iterable[np.ndarray]) -> None:
        """Start loading the batches of `plan`, the index arrays fetch will be called with, in order."""
        self.close()
        self._ahead = Prefetcher(self._samples, plan, self.workers, self.device.type == "cuda")

    def fetch(self, indices: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return the images and labels of these samples, in this order, on the split's device."""
        indices = self._checked(indices)
        batch = self._ahead.take(indices) if self._ahead is not None else None
        if batch is None:
            batch = self._load(indices)
        return self._deliver(batch)

    def labels_of(self, indices: np.ndarray) -> torch.Tensor:
        """Return the labels of these samples, from the dataset's `targets` when it has them."""
        indices = self._checked(indices)
        targets = self._checked_targets()
        if targets is None:
            # Loaded apart from the plan, so a batch fetch will ask for later is not used up here.
            return self._deliver(self._load(indices))[1]
        return targets[torch.from_numpy(indices)].to(self.device)

    def batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Yield the whole split in order, batch_size samples at a time (loaded ahead like a plan)."""
        plan = [np.arange(start, min(start + batch_size, self._size)) for start in range(0, self._size, batch_size)]
        ahead = Prefetcher(self._samples, plan, self.workers, self.device.type == "cuda")
        try:
            for indices in plan:
                yield self._deliver(ahead.take(indices))
        finally:
            ahead.close()

    def close(self) -> None:
        """Stop the loader processes of the current plan."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _checked(self, indices: np.ndarray) -> np.ndarray:
        """Return sample indices as int64; an index outside the split is an IndexError, as in memory."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        bad = (indices < 0) | (indices >= self._size)
        if bad.any():
            raise IndexError(f"{self.where}: sample index {indices[np.argmax(bad)]} is outside "
                             f"0..{self._size - 1}")
        return indices

    def _load(self, indices: np.ndarray) -> Batch:
        """Load these samples in the calling process."""
        return collate([self._samples[int(index)] for index in indices])

    def _deliver(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        """Raise a sample's problem, or move the batch to the split's device."""
        images, labels, problem = batch
        if problem:
            raise DatasetError(problem)
        if self.normalize is not None:
            images = self.normalize(images)
        if self.device.type == "cpu":
            return images, labels
        # Loader batches are pinned for a CUDA device, so their copy overlaps the caller's work.
        asynchronous = self.device.type == "cuda"
        return images.to(self.device, non_blocking=asynchronous), labels.to(self.device, non_blocking=asynchronous)

    def _checked_targets(self) -> Optional[torch.Tensor]:
        """Return the dataset's `targets` as checked int64 labels, or None when it has none."""
        if self._targets is None and getattr(self.dataset, "targets", None) is not None:
            self._targets = check_labels(self.dataset.targets, self.num_classes, self._size,
                                         f"{self.where}: its targets")
        return self._targets


def label_array(labels: Any) -> np.ndarray:
    """Return labels (a tensor, an array or a list) as a NumPy array."""
    return labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)


def check_labels(labels: Any, num_classes: int, count: int, what: str) -> torch.Tensor:
    """Return labels as int64 after checking they are `count` integers 0..num_classes-1; `what` names them."""
    array = label_array(labels)
    problem = labels_problem(array, num_classes, count)
    if problem:
        raise DatasetError(f"{what} {problem}; expected {count} integer labels 0..{num_classes - 1}")
    return torch.from_numpy(array.astype(np.int64))


def labels_problem(array: np.ndarray, num_classes: int, count: int) -> str:
    """Return what is wrong with an array of labels, or '' when it holds `count` integers 0..num_classes-1."""
    if array.dtype.kind not in "iuf" or array.ndim != 1:
        return f"are {array.dtype} of shape {array.shape}"
    if len(array) != count:
        return f"are {len(array)} labels for {count} samples"
    problem = label_values_problem(array, num_classes)
    return f"hold {problem}" if problem else ""


def label_values_problem(array: np.ndarray, num_classes: int) -> str:
    """Return which labels are not whole numbers 0..num_classes-1 (1.0 is one, 1.7 and NaN are not), or ''."""
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            first = int(np.argmax(bad))
            return f"{int(bad.sum())} non-integer labels (first {array[first]!s} at index {first})"
    bad = (array < 0) | (array >= num_classes)
    if bad.any():
        first = int(np.argmax(bad))
        return f"{int(bad.sum())} labels outside 0..{num_classes - 1} (first {array[first]!s} at index {first})"
    return ""
