"""Pieces every scheme shares: the problem, optimizers, the iteration plan, evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from psframework.config import DataConfig
from psframework.errors import ConfigError

from psframework.data import Dataset, Split, dataset_shape, image_shape, iterate_batches, load_dataset, num_batches
from psframework.models import Placement, build_model, input_size_of, place
from psframework.models.pooling import use_fast_pooling
from psframework.settings import OptimSettings, Settings


def resolve_device(name: str) -> torch.device:
    """Map the `device` setting to a torch device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def new_model(settings: Settings, in_channels: int, classes: int) -> nn.Module:
    """Build the model initialised from `train.seed` (every rank builds the same one)."""
    torch.manual_seed(settings.optim.seed)
    return build_model(settings.model, in_channels, classes)


def input_shape(settings: Any) -> Tuple[int, int, int]:
    """Return the (channels, height, width) of the images the model is given (resized to model.input_size)."""
    size = input_size_of(settings.model)
    channels, height, width = image_shape(settings.data)
    return (channels, height, width) if size is None else (channels, size, size)


def build_problem(settings: Settings) -> Tuple[Dataset, nn.Module]:
    """Load the dataset and build the model, both on this rank's device."""
    dataset = load_dataset(settings.data, input_size_of(settings.model))
    model = use_fast_pooling(new_model(settings, dataset.image_shape[0], dataset.num_classes))
    device = resolve_device(settings.device)
    return dataset.to(device), model.to(device)


def meta_model(settings: Any) -> nn.Module:
    """Build the model on torch's meta device: its structure and shapes without memory or data."""
    shape = dataset_shape(settings.data)  # a dataset factory is called outside the meta device
    with torch.device("meta"):
        return build_model(settings.model, *shape)


def placement_of(settings: Any, model: Optional[nn.Module] = None) -> Placement:
    """Return where the parts of the configured model run (built on the meta device unless given)."""
    model = meta_model(settings) if model is None else model
    return place(model, input_shape(settings), settings.model.split_at, settings.model.name)


def check_model(settings: Any) -> Placement:
    """Build the model on the meta device and check that the scheme can place it; ConfigError otherwise.

    `settings` is anything with `model`, `data` and `scheme` or `run.scheme` (a Config or Settings).
    """
    from psframework.schemes.registry import get_scheme

    scheme = get_scheme(getattr(settings, "scheme", None) or settings.run.scheme)
    model = meta_model(settings)
    placement = placement_of(settings, model)
    classes = dataset_shape(settings.data)[1]
    name = settings.model.name
    if placement.output_shape != (classes,):
        raise ConfigError(f"model.name: model {name} returns {placement.output_shape} scores per sample, expected "
                          f"({classes},) for the {classes} classes of data.dataset {settings.data.dataset}")
    if scheme.coded and not placement.coded:
        why = "; ".join(f"{n}: {r}" for n, r in placement.on_server.items()) or "it has no nn.Conv2d"
        raise ConfigError(f"model.name: model {name} has no convolution that scheme {scheme.name} can code ({why})")
    if scheme.cuts_model:
        from psframework.models.cut import cut_model

        cut_model(model, placement, name)
    return placement


def analytic_server_bytes(settings: Settings) -> Optional[Tuple[int, int]]:
    """Return the scheme's analytic (sent, received) payload bytes of rank 0 per iteration (None: no byte model)."""
    from psframework.schemes.registry import get_scheme

    model = meta_model(settings)
    return get_scheme(settings.run.scheme).expected_server_bytes(settings, model, placement_of(settings, model))


def make_optimizer(params: Sequence[torch.nn.Parameter], kind: str, lr: float, momentum: float,
                   nesterov: bool, weight_decay: float) -> torch.optim.Optimizer:
    """Return an SGD (with momentum, Nesterov, weight decay) or Adam optimizer."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer: got {kind!r}, expected sgd or adam")


def conv_optimizer(optim: OptimSettings, params: Sequence[torch.nn.Parameter],
                   kind: Optional[str] = None) -> torch.optim.Optimizer:
    """Return the optimizer of conv parameters (`kind` overrides train.optimizer)."""
    o = optim
    return make_optimizer(params, kind or o.optimizer, o.lr, o.momentum, o.nesterov, o.weight_decay)


def head_optimizer(optim: OptimSettings, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Return the optimizer of the FC head (train.head_* override train.*)."""
    o = optim
    lr = o.head_lr if o.head_lr is not None else o.lr
    return make_optimizer(params, o.head_optimizer or o.optimizer, lr, o.momentum, o.nesterov, o.weight_decay)


def scale_lr(optimizers: Sequence[Optional[torch.optim.Optimizer]], factor: float) -> None:
    """Set every parameter group's learning rate to its initial value times `factor`."""
    for opt in optimizers:
        if opt is None:
            continue
        for group in opt.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor


@dataclass(frozen=True)
class Step:
    """One training iteration: its global number (1-based), epoch, batch and sample indices.

    With gradient accumulation (`train.accumulate` m) an iteration is one micro-batch: the
    optimizers step after the last of every m (`last`), and each micro-batch's loss counts 1/m (`share`).
    """

    iteration: int
    epoch: int
    batch: int
    indices: np.ndarray
    accumulate: int = 1

    @property
    def micro(self) -> int:
        """Return this micro-batch's place (0-based) in its optimizer step."""
        return (self.iteration - 1) % self.accumulate

    @property
    def first(self) -> bool:
        """Return whether this iteration starts an optimizer step (gradients start from zero)."""
        return self.micro == 0

    @property
    def last(self) -> bool:
        """Return whether the optimizers step after this iteration."""
        return self.micro == self.accumulate - 1

    @property
    def share(self) -> float:
        """Return the weight of this micro-batch's loss in its optimizer step's loss."""
        return 1.0 / self.accumulate


def iterations_per_epoch(data: DataConfig, num_samples: int, accumulate: int = 1) -> int:
    """Return an epoch's iterations: its micro-batches, the last ones that fill no optimizer step dropped."""
    return num_batches(num_samples, data.batch_size, data.drop_last) // accumulate * accumulate


def iteration_plan(data: DataConfig, num_samples: int, start: int, total: int,
                   accumulate: int = 1) -> Iterator[Step]:
    """Yield iterations start+1..total: each global batch, in the order fixed by `data.seed`."""
    per_epoch = iterations_per_epoch(data, num_samples, accumulate)
    iteration = start
    epoch, batch = divmod(start, per_epoch)
    while iteration < total:
        for indices in iterate_batches(num_samples, data.batch_size, data.seed, epoch, start=batch,
                                       drop_last=data.drop_last):
            if iteration >= total:
                return
            if batch >= per_epoch:
                break
            iteration += 1
            yield Step(iteration, epoch, batch, indices, accumulate)
            batch += 1
        epoch, batch = epoch + 1, 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, split: Split, batch_size: int) -> Tuple[float, float]:
    """Return (accuracy, mean cross-entropy) of `model` in eval mode over a split."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for x, y in split.batches(batch_size):
        out = model(x)
        loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(dim=1) == y).sum())
    model.train(was_training)
    n = max(len(split), 1)
    return correct / n, loss_sum / n
