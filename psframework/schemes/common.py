"""Pieces every scheme shares: seeding, optimizers, the iteration plan, evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from psframework.config import Config, ConfigError
from psframework.data import Dataset, iterate_batches, load_dataset, num_batches
from psframework.models import SplitCNN, build_model
from psframework.models.split import input_size_of


def resolve_device(name: str) -> torch.device:
    """Map the `device` config value to a torch device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_everything(seed: int) -> None:
    """Seed torch's global generator (model initialisation, dropout)."""
    torch.manual_seed(seed)


def build_problem(cfg: Config) -> Tuple[Dataset, SplitCNN]:
    """Load the dataset and build the model initialised from `train.seed`."""
    dataset = load_dataset(cfg.data, input_size_of(cfg.model))
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model, dataset.image_shape[0], dataset.num_classes)
    return dataset, model


def make_optimizer(params: Sequence[torch.nn.Parameter], kind: str, lr: float, momentum: float,
                   nesterov: bool, weight_decay: float) -> torch.optim.Optimizer:
    """Return an SGD (with momentum, Nesterov, weight decay) or Adam optimizer."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer: got {kind!r}, expected sgd or adam")


def conv_optimizer(cfg: Config, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Return the optimizer of the conv stack."""
    t = cfg.train
    return make_optimizer(params, t.optimizer, t.lr, t.momentum, t.nesterov, t.weight_decay)


def head_optimizer(cfg: Config, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Return the optimizer of the FC head (train.head_* override train.*)."""
    t = cfg.train
    kind = t.head_optimizer or t.optimizer
    lr = t.head_lr if t.head_lr is not None else t.lr
    return make_optimizer(params, kind, lr, t.momentum, t.nesterov, t.weight_decay)


def lr_factor(cfg: Config, iteration: int, total: int) -> float:
    """Return the learning-rate multiplier of an iteration (1-based) under `train.lr_schedule`."""
    if cfg.train.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * (iteration - 1) / max(total, 1)))
    return 1.0


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
    """One training iteration: its global number (1-based), epoch, batch and sample indices."""

    iteration: int
    epoch: int
    batch: int
    indices: np.ndarray


def total_iterations(cfg: Config, num_samples: int) -> int:
    """Return how many iterations the run will do."""
    per_epoch = num_batches(num_samples, cfg.data.batch_size, cfg.data.drop_last)
    if per_epoch == 0:
        raise ConfigError(f"data.batch_size: got {cfg.data.batch_size}, larger than the "
                         f"{num_samples} training samples")
    total = per_epoch * cfg.train.epochs
    return min(total, cfg.train.max_iterations) if cfg.train.max_iterations else total


def iteration_plan(cfg: Config, num_samples: int, start_iteration: int = 0) -> Iterator[Step]:
    """Yield every iteration's global batch, in the order fixed by `data.seed`."""
    per_epoch = num_batches(num_samples, cfg.data.batch_size, cfg.data.drop_last)
    total = total_iterations(cfg, num_samples)
    iteration = start_iteration
    epoch, batch = divmod(start_iteration, per_epoch)
    while iteration < total:
        for indices in iterate_batches(num_samples, cfg.data.batch_size, cfg.data.seed, epoch, start=batch,
                                       drop_last=cfg.data.drop_last):
            if iteration >= total:
                return
            iteration += 1
            yield Step(iteration, epoch, batch, indices)
            batch += 1
        epoch, batch = epoch + 1, 0


def is_eval_iteration(cfg: Config, step: Step, per_epoch: int, total: int) -> bool:
    """Return whether the model is evaluated after this iteration."""
    if step.iteration == total:
        return True
    if cfg.train.eval_every > 0:
        return step.iteration % cfg.train.eval_every == 0
    return step.batch == per_epoch - 1


@torch.no_grad()
def evaluate(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int) -> Tuple[float, float]:
    """Return (accuracy, mean cross-entropy) of `model` in eval mode."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, labels.shape[0], batch_size):
        x, y = images[start:start + batch_size], labels[start:start + batch_size]
        out = model(x)
        loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(dim=1) == y).sum())
    model.train(was_training)
    n = max(int(labels.shape[0]), 1)
    return correct / n, loss_sum / n
