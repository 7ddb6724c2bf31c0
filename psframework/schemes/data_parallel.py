"""What the data-parallel schemes share: `ps` and `stanza` differ only in what one iteration moves.

Every worker loads the dataset itself and follows the same plan as rank 0, taking its contiguous
shard of each global batch (`data.shard`), so no training images cross the network. Each iteration
starts with rank 0 sending the parameters the workers hold; it ends when rank 0 has stepped its
optimizers. With `train.backup_workers: b` rank 0 goes on with the first n - b workers of every
round (all but b of the attached workers: a detached one is left out anyway), weighting by the
samples actually used; the replies of the others arrive late and are drained. A worker whose next
parameters have already arrived when it is about to compute knows that rank 0 has moved on, and
skips the stale iteration.

BatchNorm running statistics live where the conv stack runs: workers send theirs with their
gradients and rank 0 keeps the mean over the workers it used. Batch statistics are per worker shard,
so with BatchNorm the data-parallel schemes do not reproduce the single-process trainer exactly.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from psframework.comm.links import ServerLink, WorkerLink
from psframework.comm.rounds import Msg, Replies
from psframework.comm.timeline import TIMELINE
from psframework.data import shard, shard_bounds
from psframework.models import split_parameters
from psframework.runtime.stragglers import Stragglers
from psframework.schemes.common import Step, build_problem, conv_optimizer, head_optimizer, placement_of
from psframework.schemes.groups import Group
from psframework.schemes.vectors import unpack_into
from psframework.schemes.driver import STOP, Event, Problem, Schedule, ServerSide, StepResult, WorkerSide, steps
from psframework.settings import Settings


def running_stats(module: nn.Module) -> List[torch.Tensor]:
    """Return the BatchNorm running means and variances of a module (empty without BatchNorm)."""
    return [buf for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
            for buf in (m.running_mean, m.running_var)]


def weighted_sum(vectors: Dict[int, torch.Tensor], weights: Dict[int, float]) -> torch.Tensor:
    """Return sum of weights[j] * vectors[j] over workers in ascending order (a fixed order: reproducible)."""
    order = sorted(weights)
    out = vectors[order[0]] * weights[order[0]]
    for j in order[1:]:
        out.add_(vectors[j], alpha=weights[j])
    return out


@dataclass
class Aggregate:
    """What a server made of one iteration's replies: the loss over the samples used, and who contributed them."""

    loss: float
    used: List[int]  # packet indices of the workers used, ascending
    sizes: Dict[int, int]  # samples of every worker's shard

    def sample_weights(self) -> Dict[int, float]:
        """Return each used worker's share of the samples used."""
        samples = sum(self.sizes[j] for j in self.used)
        return {j: self.sizes[j] / samples for j in self.used}


class DataParallelServer(ServerSide):
    """Rank 0 of a data-parallel scheme: the parameter server; `aggregate` is the scheme's own part."""

    fetches_batches = False  # the workers load their shards; rank 0 needs labels at most

    def __init__(self, settings: Settings, problem: Problem, link: Optional[ServerLink] = None,
                 group: Optional[Group] = None) -> None:
        super().__init__(settings, problem, link, group)
        link.require(1)
        self.placement = placement_of(settings, self.model)
        self.trunk, self.head = split_parameters(self.model, self.placement)
        self.optimizers = ([conv_optimizer(settings.optim, self.trunk)] if self.trunk else []) + \
            ([head_optimizer(settings.optim, self.head)] if self.head else [])

    @property
    def needed(self) -> int:
        """Return how many replies a round waits for: all but `backup_workers` of the attached workers.

        A detached worker is already left out, so the backups still shield the run from slow live ones.
        """
        return max(1, len(self.link.live) - self.settings.run.backup_workers)

    def describe(self) -> str:
        return f", {self.link.n} workers (rank 0 goes on with the first {self.needed})"

    def shards(self, step: Step) -> Dict[int, slice]:
        """Return each worker's part of this server's batch (as `data.shard` cuts it): slices of batch_indices."""
        bounds = shard_bounds(len(self.batch_indices(step)), self.link.n)
        return {j: slice(bounds[j], bounds[j + 1]) for j in range(self.link.n)}

    def result(self, step: Step, replies: Replies) -> Aggregate:
        """Return the aggregate so far: the workers whose replies are used and every shard's size (loss 0)."""
        sizes = {j: part.stop - part.start for j, part in self.shards(step).items()}
        return Aggregate(0.0, sorted(replies.indices), sizes)

    def keep_running_stats(self, stats: Dict[int, torch.Tensor], result: Aggregate) -> None:
        """Set the BatchNorm running statistics the workers keep to their mean, weighted by samples."""
        unpack_into(running_stats(self.worker_part()), weighted_sum(stats, result.sample_weights()))

    def worker_part(self) -> nn.Module:
        """Return the part of the model the workers run (the whole model by default)."""
        return self.model

    @abstractmethod
    def aggregate(self, step: Step) -> Aggregate:
        """Run one iteration's communication and update (the scheme's part)."""

    def step(self, step: Step) -> StepResult:
        self.link.begin_iteration()
        result = self.aggregate(step)
        fields = {**self.link.iteration_fields(), **self.group.fields()}
        fields.update(used=[self.link.job_rank(j) for j in result.used], samples=[result.sizes[j] for j in result.used])
        return StepResult(result.loss, dict(self.link.clock.timings), fields)

    def finish(self) -> Dict[str, Any]:
        return {"backup_workers": self.settings.run.backup_workers}


class DataParallelWorker(WorkerSide):
    """Worker j of a data-parallel scheme: trains on its shard; `compute` is the scheme's own part."""

    def __init__(self, settings: Settings, link: WorkerLink) -> None:
        super().__init__(settings, link)
        self.dataset, self.model = build_problem(settings)  # rank 0's parameters overwrite the model
        self.model.train()
        self.j, self.n = link.index, len(link.workers)
        self.group, self.groups = link.roles.group, link.roles.groups
        self.stragglers = Stragglers(settings.stragglers, link.job_workers)
        self.scaled = False  # whether the server sends a loss scale with the parameters (ps with loss scaling)
        self.loss_scale = 1.0

    def my_shard(self, indices: Any) -> Any:
        """Return this worker's samples of a global batch: its shard of its group's part."""
        return shard(shard(indices, self.group, self.groups), self.j, self.n)

    def start(self, schedule: Schedule) -> None:
        """Announce this worker's shard of every remaining batch, so that a streamed dataset reads ahead."""
        plan = steps(self.settings, len(self.dataset.train), schedule)
        self.dataset.train.prefetch(self.my_shard(step.indices) for step in plan)

    def close(self) -> None:
        self.dataset.close()

    @staticmethod
    def opening(event: Event) -> Any:
        """Return the envelope of the message that opens a plan event."""
        return Msg.stop(event.iteration) if event.kind == STOP else Msg.params(event.iteration)

    @abstractmethod
    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                after: Event) -> None:
        """Run one iteration on this worker's shard from the parameters rank 0 sent (the scheme's part)."""

    def step(self, step: Step, after: Event) -> None:
        if self.scaled:  # the iteration's loss scale (every server sends it); before the parameters, whose
            self.loss_scale = float(self.link.take(Msg.scale(step.iteration))[0])  # shards the reply follows
        params = self.link.take(Msg.params(step.iteration))
        if self.link.has(self.opening(after)):
            self.link.report.skipped()  # rank 0 has finished this iteration without this worker
            return
        images, labels = self.dataset.train_batch(self.my_shard(step.indices), step.epoch)
        self.compute(step, params, images, labels, after)

    def straggle(self, iteration: int, started: float) -> None:
        """Add the compute time since `started` and an injected straggler's delay to the report."""
        from psframework.runtime.node import straggle

        compute_s = time.perf_counter() - started
        TIMELINE.add("compute", "compute", started, compute_s)
        self.link.report.add("compute_s", compute_s)
        self.link.report.add("delay_s", straggle(self.stragglers, self.link.rank, iteration, compute_s,
                                                 [self.link.progress]))
