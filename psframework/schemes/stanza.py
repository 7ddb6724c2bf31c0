"""`stanza`: layer separation. Workers train the conv stack data-parallel; the FC head lives on rank 0.

Each iteration rank 0 sends the conv parameters (it is their parameter server); worker j runs the
conv stack on its shard and sends the features; rank 0 runs the FC head on the features of the
first n - b workers as one batch, computes the loss, steps the head and sends each of those workers
the gradient of the loss with respect to its features; they backpropagate through the conv stack
and push the conv gradients, which rank 0 adds up (the feature gradients already carry the
1/samples of the mean loss) and steps. FC parameters never leave rank 0: only conv parameters,
features and feature gradients cross the network.

With several servers (`train.servers: G`) every server hosts the head for its group's part of the
batch, sends the feature gradients and then sums the head's gradients with the other servers while
the workers backpropagate; the workers hold the conv stack and its optimizer themselves and sum
their conv gradients (and BatchNorm running statistics, weighted by samples) over every worker of
every group once per iteration, so that only features and feature gradients cross a server's link.
Every worker is needed each iteration (no backup workers).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from psframework.comm.links import ServerLink, WorkerLink
from psframework.comm.rounds import Msg
from psframework.models import Placement, split_parameters
from psframework.models.cut import cut_model
from psframework.schemes.common import Step, conv_optimizer, placement_of, scale_lr
from psframework.schemes.data_parallel import (Aggregate, DataParallelServer, DataParallelWorker, running_stats,
                                               weighted_sum)
from psframework.schemes.driver import Event, Problem, Schedule
from psframework.schemes.vectors import momentum_of, pack, set_grads, set_momentum, unpack_into
from psframework.schemes.groups import Group, part_size, start_sum, sync_bytes
from psframework.schemes.recipe import autocast, finite, step_scaled, unscale
from psframework.settings import Settings


# How long rank 0 waits for the conv gradients of the workers whose features it used (the longer of
# these seconds and this many times the forward round) before it computes a missing worker's share
# itself: a frozen worker must not hold the run up, and what rank 0 computes is what it would have sent.
PATIENCE_S, PATIENCE_ROUNDS = 1.0, 10.0


def features_envelope(iteration: int) -> Any:
    """Worker -> rank 0: the conv features of the worker's shard."""
    return Msg.features(iteration)


def feature_grads_envelope(iteration: int) -> Any:
    """Rank 0 -> worker: the gradient of the loss with respect to the worker's features."""
    return Msg.feature_grads(iteration)


class StanzaServer(DataParallelServer):
    """Rank 0 of `stanza`: hosts the FC head and is the conv stack's parameter server."""

    def __init__(self, settings: Settings, problem: Problem, link: Optional[ServerLink] = None,
                 group: Optional[Group] = None) -> None:
        super().__init__(settings, problem, link, group)
        self.cut = cut_model(self.model, self.placement, settings.model.name)
        self.conv_opt, self.head_opt = self.optimizers

    def worker_part(self) -> nn.Module:
        return self.cut.trunk

    def aggregate(self, step: Step) -> Aggregate:
        it, conv = step.iteration, self.trunk
        t0 = time.perf_counter()
        arrived = self.link.round(pack(conv), Msg.params(it), features_envelope(it), self.needed)
        forward_s = time.perf_counter() - t0
        shards = self.shards(step)
        result = self.result(step, arrived)
        labels = self.problem.dataset.train.labels_of(step.indices)
        x = torch.cat([arrived.data[j] for j in result.used]).float().requires_grad_(True)
        loss = self.head_loss(step, x, torch.cat([labels[shards[j]] for j in result.used]))
        ranks = [self.link.workers[j] for j in result.used]
        grads = self.link.expect(Msg.grads(it), ranks)
        pieces = [p.contiguous() for p in torch.split(x.grad, [result.sizes[j] for j in result.used])]
        self.link.send(pieces, feature_grads_envelope(it), ranks)
        replies = self.link.collect_within(grads, max(PATIENCE_S, PATIENCE_ROUNDS * forward_s))
        for j, piece in zip(result.used, pieces):
            if j not in replies.data:  # a worker stalled after its features were used: do its backward here
                replies.data[j] = self.conv_grads(step, step.indices[shards[j]], piece)
        count = sum(p.numel() for p in conv)
        # Conv gradients add up (each is that worker's share of the mean loss); running statistics average.
        set_grads(conv, weighted_sum(replies.data, dict.fromkeys(result.used, 1.0))[:count], add=not step.first)
        if step.last:  # the head and the conv stack: both stepped, or (an overflow) both skipped
            step_scaled(self.scaler, [self.head_opt, self.conv_opt])
        self.keep_running_stats({j: v[count:] for j, v in replies.data.items()}, result)
        result.loss = float(loss.detach())
        return result

    def head_loss(self, step: Step, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Run the head on the features, backpropagate this micro-batch's share of the loss; return the loss.

        The head's gradients accumulate over the micro-batches of an optimizer step.
        """
        optim = self.settings.optim
        if step.first:
            self.head_opt.zero_grad(set_to_none=True)
        with self.group.batchnorm(self.cut.head), autocast(optim.precision, x.device):
            loss = self.group.loss(self.cut.head(x), labels)
        (loss * (step.share * self.scaler.factor)).backward()
        return loss

    def conv_grads(self, step: Step, indices: Any, feature_grads: torch.Tensor) -> torch.Tensor:
        """Return what a worker would send for its shard: conv gradients and running statistics."""
        grads = [p.grad for p in self.trunk]  # this iteration's sum so far, kept aside
        for p in self.trunk:
            p.grad = None
        images = self.problem.dataset.train_batch(indices, step.epoch)[0]
        with autocast(self.settings.optim.precision, images.device):
            features = self.cut.trunk(images)
        features.float().backward(feature_grads)
        vector = torch.cat([pack([p.grad for p in self.trunk]), pack(running_stats(self.cut.trunk))])
        for p, g in zip(self.trunk, grads):
            p.grad = g
        return vector


class GroupStanzaServer(StanzaServer):
    """Server g of `stanza` with several servers: the head on its group's part; the workers step the conv stack.

    With loss scaling an optimizer step is skipped when the head's gradients (which the servers see)
    or the conv stack's (which the workers see) overflow: the servers tell the workers theirs (Msg.scale),
    the workers answer with theirs (Msg.scale_reply), and the head steps once the answer is in (at the
    next iteration's start, or at a synchronisation), with its own iteration's learning rate.
    """

    def start(self, schedule: Schedule) -> None:
        """Send the workers the conv stack's state: they step it themselves."""
        self.schedule = schedule
        self.held: Optional[Tuple[int, float, bool, Any]] = None  # a head step waiting for the workers' finding
        self.link.send(trunk_state(self.trunk, self.conv_opt, self.cut.trunk), Msg.params(schedule.start))

    def step_head(self, iteration: int) -> None:
        """Step the head after an optimizer step's last iteration (with loss scaling: hold it for the workers)."""
        if not self.scaler.enabled:
            self.head_opt.step()
            return
        head_inf = not finite(p.grad for g in self.head_opt.param_groups for p in g["params"])
        self.link.send(torch.tensor([self.scaler.factor, float(head_inf)]), Msg.scale(iteration))
        self.held = (iteration, self.scaler.factor, head_inf, self.link.expect(Msg.scale_reply(iteration)))

    def release_head(self) -> None:
        """Take the workers' finding of the held step and step the head, or skip it as every rank does."""
        if self.held is None:
            return
        iteration, used, head_inf, replies = self.held
        self.held = None
        conv_inf = any(float(r[0]) > 0 for r in self.link.collect(replies, self.link.n, rotate=False).data.values())
        if not self.scaler.update(head_inf or conv_inf):
            return
        grads = [p.grad for g in self.head_opt.param_groups for p in g["params"]]
        self.scaler.unscale(grads, used)
        now = [g["lr"] for g in self.head_opt.param_groups]
        scale_lr([self.head_opt], self.schedule.lr_factor(iteration))  # the step's own rate
        self.head_opt.step()
        for group, lr in zip(self.head_opt.param_groups, now):
            group["lr"] = lr

    def aggregate(self, step: Step) -> Aggregate:
        """Run the head on the features of every worker of this group; send them their features' gradients."""
        it = step.iteration
        self.release_head()
        self.group.begin(len(step.indices))
        arrived = self.link.collect(self.link.expect(features_envelope(it)), self.link.n, rotate=False)
        result = self.result(step, arrived)
        labels = self.problem.dataset.train.labels_of(self.batch_indices(step))
        x = torch.cat([arrived.data[j] for j in result.used]).float().requires_grad_(True)
        loss = self.head_loss(step, x, labels)
        # The workers backpropagate while the servers sum the head's gradients: the sum is off their path.
        pieces = [p.contiguous() for p in torch.split(x.grad, [result.sizes[j] for j in result.used])]
        self.link.send(pieces, feature_grads_envelope(it), [self.link.workers[j] for j in result.used])
        # The head's gradients are summed once per optimizer step; the loss of every micro-batch.
        result.loss = self.group.sum_gradients([self.head_opt] if step.last else [], float(loss.detach()))
        if step.last:
            self.step_head(it)
        return result

    def sync(self, iteration: int, verify: bool) -> Dict[str, Any]:
        """Take the conv stack's state from a worker (every worker holds the same); step a held head."""
        state = self.link.round(torch.zeros(1), Msg.state(iteration), Msg.state_reply(iteration), 1, rotate=False)
        load_trunk_state(next(iter(state.data.values())), self.trunk, self.conv_opt, self.cut.trunk)
        self.release_head()  # the workers answered its finding before their state
        return {}


class StanzaWorker(DataParallelWorker):
    """Worker j of `stanza`: the conv stack on its shard; sends features, receives their gradient."""

    def __init__(self, settings: Settings, link: WorkerLink) -> None:
        super().__init__(settings, link)
        placement = placement_of(settings, self.model)
        self.cut = cut_model(self.model, placement, settings.model.name)
        self.trunk = split_parameters(self.model, placement)[0]

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                after: Event) -> None:
        it = step.iteration
        unpack_into(self.trunk, params)
        features = self.forward(it, images, fresh=True)
        # Rank 0 answers with the features' gradient, or goes on without this worker (next iteration or stop).
        if self.link.first_of([feature_grads_envelope(it), self.opening(after)]) == 1:
            self.link.report.skipped()
            return
        self.link.reply(self.backward(it, features, 1.0), Msg.grads(it))

    def forward(self, iteration: int, images: torch.Tensor, fresh: bool) -> torch.Tensor:
        """Run the conv stack on this worker's shard and send the features to the server; return them.

        `fresh`: the conv gradients start from zero (otherwise they accumulate over an optimizer step).
        """
        t0 = time.perf_counter()
        if fresh:
            for p in self.trunk:
                p.grad = None
        with self.link.busy(), autocast(self.settings.optim.precision, images.device):
            features = self.cut.trunk(images)
        self.straggle(iteration, t0)
        # Features travel in float32 whatever train.precision: the head's input, as the byte model counts it.
        self.link.reply(features.detach().float().contiguous(), features_envelope(iteration), count=False)
        return features

    def backward(self, iteration: int, features: torch.Tensor, share: float) -> torch.Tensor:
        """Backpropagate the features' gradient from the server; return the conv gradients and the running
        statistics (times `share`) as one vector."""
        grad = self.link.take(feature_grads_envelope(iteration))
        t0 = time.perf_counter()
        with self.link.busy():
            features.backward(grad.to(features.dtype))
        vector = torch.cat([pack([p.grad for p in self.trunk]), pack(running_stats(self.cut.trunk)) * share])
        self.straggle(iteration, t0)
        return vector


class GroupStanzaWorker(StanzaWorker):
    """Worker j of `stanza` with several servers: steps the conv stack with the sum of every worker's gradients."""

    with_syncs = True  # the servers take the conv stack's state from the workers

    def __init__(self, settings: Settings, link: WorkerLink) -> None:
        super().__init__(settings, link)
        self.conv_opt = conv_optimizer(settings.optim, self.trunk)
        self.pending: Optional[Callable[[], torch.Tensor]] = None  # the conv gradient sum in flight
        self.pending_iteration = 0
        self.scaled = settings.optim.loss_scale == "dynamic"
        self.schedule: Optional[Schedule] = None

    def start(self, schedule: Schedule) -> None:
        super().start(schedule)
        self.schedule = schedule
        load_trunk_state(self.link.take(Msg.params(schedule.start)), self.trunk, self.conv_opt, self.cut.trunk)

    def step(self, step: Step, after: Event) -> None:
        self.settle()
        it = step.iteration
        images = self.dataset.train_batch(self.my_shard(step.indices), step.epoch)[0]
        features = self.forward(it, images, fresh=step.first)
        share = len(images) / len(step.indices)  # running statistics: the mean over all workers, by samples
        vector = self.backward(it, features, share)
        if not step.last:  # the conv gradients accumulate until the optimizer step's last micro-batch
            return
        scale_lr([self.conv_opt], self.schedule.lr_factor(it))
        self.pending = start_sum(self.link.all_workers, vector, "the conv gradient sum of every worker",
                                 self.link.progress)
        self.pending_iteration = it
        self.link.report.sent()

    def settle(self) -> None:
        """Step the conv stack with the summed gradients of the last iteration, if their sum is in flight."""
        if self.pending is None:
            return
        total, self.pending = self.pending(), None
        count = sum(p.numel() for p in self.trunk)
        set_grads(self.trunk, total[:count])
        unpack_into(running_stats(self.cut.trunk), total[count:])
        if not self.scaled:
            self.conv_opt.step()
            return
        # Loss scaling: the servers' finding of the head, this one of the conv stack (every worker's alike).
        scale, head_inf = self.link.take(Msg.scale(self.pending_iteration)).tolist()
        conv_inf = not finite([total[:count]])
        self.link.send(torch.tensor([float(conv_inf)]), Msg.scale_reply(self.pending_iteration))
        if head_inf or conv_inf:
            return  # skipped by every rank
        unscale([p.grad for p in self.trunk], scale)
        self.conv_opt.step()

    def sync(self, iteration: int) -> None:
        """Send the server the conv stack's state (several servers: this worker steps it)."""
        self.link.take(Msg.state(iteration))
        self.settle()
        self.link.send(trunk_state(self.trunk, self.conv_opt, self.cut.trunk), Msg.state_reply(iteration))

    def close(self) -> None:
        self.settle()
        super().close()


def trunk_state(trunk: Sequence[nn.Parameter], opt: torch.optim.Optimizer, module: nn.Module) -> torch.Tensor:
    """Return the conv stack's parameters, momentum buffers (zeros without) and running statistics, flat."""
    momentum = [momentum_of(opt, p) for p in trunk]
    buffers = [torch.zeros_like(p) if m is None else m for p, m in zip(trunk, momentum)]
    return torch.cat([pack(trunk), pack(buffers), pack(running_stats(module))])


def load_trunk_state(state: torch.Tensor, trunk: Sequence[nn.Parameter], opt: torch.optim.Optimizer,
                     module: nn.Module) -> None:
    """Set the conv stack's parameters, momentum buffers and running statistics from `trunk_state`."""
    count = sum(p.numel() for p in trunk)
    unpack_into(trunk, state[:count])
    if opt.defaults.get("momentum", 0.0) > 0:
        buffers = [torch.empty_like(p) for p in trunk]
        unpack_into(buffers, state[count:2 * count])
        for p, buf in zip(trunk, buffers):
            set_momentum(opt, p, buf)
    unpack_into(running_stats(module), state[2 * count:])


def expected_server_bytes(settings: Settings, model: nn.Module, placement: Placement,
                          group: int = 0) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends to and receives from its workers per iteration: (sent, received).

    Sent: the trunk's parameters to each of the n workers and the feature gradients of the batch.
    Received: the features, and each worker's trunk gradients and running statistics.
    """
    n, features = settings.code.n, _feature_values(settings, model, placement, group)
    cut = cut_model(model, placement, settings.model.name)
    conv = sum(p.numel() for p in split_parameters(model, placement)[0])
    stats = sum(s.numel() for s in running_stats(cut.trunk))
    return 4 * (n * conv + features), 4 * (features + n * (conv + stats))


def expected_group_server_bytes(settings: Settings, model: nn.Module, placement: Placement,
                                group: int = 0) -> Tuple[int, int]:
    """Return the payload bytes server `group` of several sends and receives per iteration: the feature
    gradients of its group's part out, the features in (the workers step the trunk themselves)."""
    features = _feature_values(settings, model, placement, group)
    return 4 * features, 4 * features


def _feature_values(settings: Settings, model: nn.Module, placement: Placement, group: int) -> int:
    """Return how many feature values the trunk makes of a group's part of the global batch."""
    batch = part_size(settings.data.batch_size, group, settings.run.servers)
    return batch * math.prod(cut_model(model, placement, settings.model.name).feature_shape)


def expected_sync_bytes(settings: Settings, model: nn.Module, placement: Placement) -> int:
    """Return the payload bytes a server sums with the others per iteration: the head's gradients and its
    BatchNorm sums (groups.sync_bytes)."""
    cut = cut_model(model, placement, settings.model.name)
    head = sum(p.numel() for p in split_parameters(model, placement)[1])
    return sync_bytes(head, [m for m in cut.head.modules() if isinstance(m, _BatchNorm)])
