"""`ps`: the parameter-server baseline. Every worker holds the whole model (conv stack and FC head).

Each iteration rank 0 sends every worker all parameters; worker j computes the gradient of the mean
loss on its shard of the global batch and pushes it, with its BatchNorm running statistics and its
loss; rank 0 averages the first n - b replies weighted by their samples (the gradient of the mean
loss over the samples used), steps and starts the next iteration. Parameters and gradients of the FC
layers cross the network twice per worker per iteration: the traffic Stanza removes.

With several servers (`train.servers: S`) the parameters, as one vector in the model's order, are
cut into S contiguous near-equal shards; server s holds and updates shard s. Every worker of the
job pulls each shard from its server, computes on its part of the global batch and pushes each
shard's gradient to its server, which averages the first N - b of the N workers. Running
statistics and the loss go to the lead server (shard 0), which gathers every shard when it
evaluates or checkpoints. Every server's link carries 1/S of the parameter traffic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import torch

from psframework.comm.links import ServerLink, WorkerLink
from psframework.comm.rounds import Msg
from psframework.data import shard_bounds
from psframework.schemes.common import Step, conv_optimizer, head_optimizer, scale_lr
from psframework.schemes.data_parallel import (Aggregate, DataParallelServer, DataParallelWorker, running_stats,
                                               weighted_sum)
from psframework.schemes.driver import Event, Problem, Schedule
from psframework.schemes.recipe import autocast, step_scaled, training_loss
from psframework.schemes.vectors import momentum_of, pack, set_grads, set_momentum, unpack_into
from psframework.schemes.groups import Group
from psframework.settings import Settings


@dataclass
class Region:
    """A run of one shard's values that one optimizer steps: the conv stack's or the head's."""

    start: int  # offset in the model's parameter vector
    stop: int
    value: torch.nn.Parameter
    optimizer: torch.optim.Optimizer


def shard_range(total: int, shard: int, shards: int) -> Tuple[int, int]:
    """Return the [start, stop) offsets of a shard of a parameter vector of `total` values."""
    bounds = shard_bounds(total, shards)
    return bounds[shard], bounds[shard + 1]


class PSServer(DataParallelServer):
    """Rank 0 of `ps`: averages full-model gradients and steps every layer."""

    def send_scale(self, step: Step) -> None:
        """Tell the workers the iteration's loss scale (with loss scaling): their gradients come scaled by it."""
        if self.scaler.enabled:
            self.link.send(torch.tensor([self.scaler.factor, 1.0]), Msg.scale(step.iteration))

    def aggregate(self, step: Step) -> Aggregate:
        params = list(self.model.parameters())
        vector = pack(params)
        self.send_scale(step)
        replies = self.link.round(vector, Msg.params(step.iteration), Msg.grads(step.iteration), self.needed)
        result = self.result(step, replies)
        # Gradients and losses alike: the mean over the samples used.
        mean = weighted_sum(replies.data, result.sample_weights())
        count = vector.numel()
        # Accumulation: each micro-batch's gradient counts step.share; the optimizers step after the last.
        set_grads(params, mean[:count] * step.share, add=not step.first)
        if step.last:
            step_scaled(self.scaler, self.optimizers)
        self.keep_running_stats({j: v[count:-1] for j, v in replies.data.items()}, result)
        result.loss = float(mean[-1])
        return result


class ShardedPSServer(PSServer):
    """Server s of `ps` with several servers: holds, averages and steps shard s of the parameters."""

    def __init__(self, settings: Settings, problem: Problem, link: ServerLink, group: Group) -> None:
        super().__init__(settings, problem, link, group)
        self.regions: List[Region] = []  # this server's shard, taken out of the model at the start

    def start(self, schedule: Schedule) -> None:
        """Take this server's shard out of the model (the lead's, shared at the start)."""
        self.schedule = schedule
        self.regions = self.shard_regions()

    def batch_indices(self, step: Step) -> Any:
        return step.indices  # every server serves every worker: the workers split the whole batch

    def shard_regions(self) -> List[Region]:
        """Return this server's shard as regions of consecutive conv-stack or head values, each with its optimizer.

        SGD's step is elementwise, so stepping a region equals stepping the tensors it comes from.
        """
        params = list(self.model.parameters())
        values = pack(params)
        buffers = [momentum_of(self.optimizer_of(p), p) for p in params]
        momentum = pack([torch.zeros_like(p) if buf is None else buf for p, buf in zip(params, buffers)])
        regions = []
        for start, stop, kind in self.shard_runs(params):
            value = torch.nn.Parameter(values[start:stop].clone())
            opt = (head_optimizer if kind else conv_optimizer)(self.settings.optim, [value])
            if self.settings.optim.momentum > 0:
                set_momentum(opt, value, momentum[start:stop].clone())
            regions.append(Region(start, stop, value, opt))
        return regions

    def shard_runs(self, params: List[torch.nn.Parameter]) -> List[List[Any]]:
        """Return [start, stop, is head] of the runs of consecutive parameters of one kind in this shard."""
        head = {id(p) for p in self.head}
        lo, hi = shard_range(sum(p.numel() for p in params), self.group.index, self.group.count)
        runs: List[List[Any]] = []
        offset = 0
        for p in params:
            start, stop, kind = max(offset, lo), min(offset + p.numel(), hi), id(p) in head
            offset += p.numel()
            if start >= stop:
                continue
            if runs and runs[-1][2] == kind and runs[-1][1] == start:
                runs[-1][1] = stop
            else:
                runs.append([start, stop, kind])
        return runs

    def optimizer_of(self, param: torch.nn.Parameter) -> torch.optim.Optimizer:
        """Return the optimizer (of the conv stack or the head) that steps a parameter."""
        return next(opt for opt in self.optimizers if any(p is param for g in opt.param_groups for p in g["params"]))

    def aggregate(self, step: Step) -> Aggregate:
        """Send this shard to every worker, average the first N - b shard gradients, step the shard."""
        self.group.begin(len(step.indices))
        vector = torch.cat([r.value.detach() for r in self.regions])
        self.send_scale(step)
        replies = self.link.round(vector, Msg.params(step.iteration), Msg.grads(step.iteration), self.needed)
        result = self.result(step, replies)
        mean = weighted_sum(replies.data, result.sample_weights())
        factor = self.schedule.lr_factor(step.iteration)
        lo = self.regions[0].start
        for region in self.regions:
            set_grads([region.value], mean[region.start - lo:region.stop - lo] * step.share, add=not step.first)
            scale_lr([region.optimizer], factor)
        if step.last:
            step_scaled(self.scaler, [region.optimizer for region in self.regions], agree=self.group.any)
        size = vector.numel()
        if self.lead:  # the lead's shard carries the running statistics and the loss
            self.keep_running_stats({j: v[size:-1] for j, v in replies.data.items()}, result)
            result.loss = float(mean[-1])
        self.group.agree_stop()
        return result

    def sync(self, iteration: int, verify: bool) -> Dict[str, Any]:
        """Gather every shard (values and momentum) into the lead's model."""
        mine = [(r.value.detach().clone(), momentum_of(r.optimizer, r.value)) for r in self.regions]
        shards = self.group.gather(mine)
        if shards is None:
            return {}
        regions = [region for shard in shards for region in shard]
        params = list(self.model.parameters())
        unpack_into(params, torch.cat([value for value, _ in regions]))
        if self.settings.optim.momentum > 0:
            buffers = [torch.empty_like(p) for p in params]
            unpack_into(buffers, torch.cat([buf for _, buf in regions]))
            for p, buf in zip(params, buffers):
                set_momentum(self.optimizer_of(p), p, buf)
        return {}


class PSWorker(DataParallelWorker):
    """Worker j of `ps`: the whole model on its shard; pushes gradients, statistics and loss.

    With several servers its link joins the parameter shards it takes and splits what it replies.
    With loss scaling its gradients are those of the loss times the scale the servers send.
    """

    def __init__(self, settings: Settings, link: WorkerLink) -> None:
        super().__init__(settings, link)
        self.scaled = settings.optim.loss_scale == "dynamic"

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                after: Event) -> None:
        weights = list(self.model.parameters())
        unpack_into(weights, params)
        t0 = time.perf_counter()
        for p in weights:
            p.grad = None
        optim = self.settings.optim
        with self.link.busy():
            with autocast(optim.precision, images.device):
                loss = training_loss(self.model(images), labels, optim.label_smoothing)
            (loss * self.loss_scale).backward()
        grads = pack([p.grad for p in weights])
        extra = torch.cat([pack(running_stats(self.model)), loss.detach().reshape(1)])
        self.straggle(step.iteration, t0)
        self.link.reply(torch.cat([grads, extra]), Msg.grads(step.iteration))


def expected_server_bytes(settings: Settings, model: Any, placement: Any, group: int = 0) -> Tuple[int, int]:
    """Return the payload bytes server `group` sends and receives per iteration: (sent, received).

    Sent: all parameters (with S servers: its shard) to each of the N = S * n workers. Received:
    each worker's gradients of them and, on the lead, its BatchNorm running statistics and loss
    (late replies of backup workers are received too, then dropped).
    """
    servers = settings.run.servers
    workers = settings.code.n * servers
    lo, hi = shard_range(sum(p.numel() for p in model.parameters()), group, servers)
    extra = sum(s.numel() for s in running_stats(model)) + 1 if group == 0 else 0
    return 4 * workers * (hi - lo), 4 * workers * (hi - lo + extra)


def expected_sync_bytes(settings: Settings, model: Any, placement: Any) -> int:
    """Return the payload bytes a server sums with the others per iteration: the stop decision (one float64)."""
    return 8
