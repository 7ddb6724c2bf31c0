"""`stanza`: layer separation. Workers train the conv stack data-parallel; the FC head lives on rank 0.

Each iteration rank 0 sends the conv parameters (it is their parameter server); worker j runs the
conv stack on its shard and sends the features; rank 0 runs the FC head on the features of the
first n - b workers as one batch, computes the loss, steps the head and sends each of those workers
the gradient of the loss with respect to its features; they backpropagate through the conv stack
and push the conv gradients, which rank 0 adds up (the feature gradients already carry the
1/samples of the mean loss) and steps. FC parameters never leave rank 0: only conv parameters,
features and feature gradients cross the network.
"""

from __future__ import annotations

import math
import time
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from psframework.comm.envelope import Phase
from psframework.comm.rounds import Msg
from psframework.models import Placement, split_parameters
from psframework.models.cut import cut_model
from psframework.schemes.common import Step, placement_of
from psframework.schemes.data_parallel import (DataParallelServer, DataParallelWorker, RoundResult, assign, flat,
                                               running_stats, set_grads, weighted_sum)
from psframework.schemes.driver import Event, Problem
from psframework.settings import Settings


# How long rank 0 waits for the conv gradients of the workers whose features it used (the longer of
# these seconds and this many times the forward round) before it computes a missing worker's share
# itself: a frozen worker must not hold the run up, and what rank 0 computes is what it would have sent.
PATIENCE_S, PATIENCE_ROUNDS = 1.0, 10.0


def features_envelope(iteration: int) -> Any:
    """Worker -> rank 0: the conv features of the worker's shard."""
    return Msg.reply(iteration, 0, Phase.FORWARD)


def feature_grads_envelope(iteration: int) -> Any:
    """Rank 0 -> worker: the gradient of the loss with respect to the worker's features."""
    return Msg.command(iteration, 0, Phase.BACKWARD)


class StanzaServer(DataParallelServer):
    """Rank 0 of `stanza`: hosts the FC head and is the conv stack's parameter server."""

    def __init__(self, settings: Settings, problem: Problem, link: Any) -> None:
        super().__init__(settings, problem, link)
        self.cut = cut_model(self.model, self.placement, settings.model.name)
        self.conv_opt, self.head_opt = self.optimizers

    def worker_part(self) -> nn.Module:
        return self.cut.trunk

    def round(self, step: Step) -> RoundResult:
        it, conv = step.iteration, self.trunk
        t0 = time.perf_counter()
        arrived = self.link.round(flat(conv), Msg.params(it), features_envelope(it), self.needed)
        forward_s = time.perf_counter() - t0
        shards = self.shards(step)
        result = self.result(step, arrived)
        labels = self.problem.dataset.train.labels_of(step.indices)
        x = torch.cat([arrived.data[j] for j in result.used]).requires_grad_(True)
        self.head_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.cut.head(x), torch.cat([labels[shards[j]] for j in result.used]))
        loss.backward()
        self.head_opt.step()
        ranks = [self.link.workers[j] for j in result.used]
        grads = self.link.expect(Msg.grads(it), ranks)
        pieces = [p.contiguous() for p in torch.split(x.grad, [result.sizes[j] for j in result.used])]
        self.link.send(pieces, feature_grads_envelope(it), ranks)
        replies = self.link.collect_within(grads, max(PATIENCE_S, PATIENCE_ROUNDS * forward_s))
        for j, piece in zip(result.used, pieces):
            if j not in replies.data:  # a worker stalled after its features were used: do its backward here
                replies.data[j] = self.conv_grads(step.indices[shards[j]], piece)
        count = sum(p.numel() for p in conv)
        # Conv gradients add up (each is that worker's share of the mean loss); running statistics average.
        set_grads(conv, weighted_sum(replies.data, dict.fromkeys(result.used, 1.0))[:count])
        self.conv_opt.step()
        self.keep_running_stats({j: v[count:] for j, v in replies.data.items()}, result)
        result.loss = float(loss.detach())
        return result

    def conv_grads(self, indices: Any, feature_grads: torch.Tensor) -> torch.Tensor:
        """Return what a worker would send for its shard: conv gradients and running statistics."""
        for p in self.trunk:
            p.grad = None
        images = self.problem.dataset.train.fetch(indices)[0]
        self.cut.trunk(images).backward(feature_grads)
        return torch.cat([flat([p.grad for p in self.trunk]), flat(running_stats(self.cut.trunk))])


class StanzaWorker(DataParallelWorker):
    """Worker j of `stanza`: the conv stack on its shard; sends features, receives their gradient."""

    def __init__(self, settings: Settings, link: Any) -> None:
        super().__init__(settings, link)
        placement = placement_of(settings, self.model)
        self.cut = cut_model(self.model, placement, settings.model.name)
        self.trunk = split_parameters(self.model, placement)[0]

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                after: Event) -> None:
        it, conv = step.iteration, self.trunk
        assign(conv, params)
        t0 = time.perf_counter()
        for p in conv:
            p.grad = None
        with self.link.busy():
            features = self.cut.trunk(images)
        self.straggle(it, t0)
        self.link.reply(features.detach().contiguous(), features_envelope(it), count=False)
        # Rank 0 answers with the features' gradient, or goes on without this worker (next round or stop).
        if self.link.first_of([feature_grads_envelope(it), self.opening(after)]) == 1:
            self.link.report.skipped()
            return
        grad = self.link.take(feature_grads_envelope(it))
        t0 = time.perf_counter()
        with self.link.busy():
            features.backward(grad)
        vector = torch.cat([flat([p.grad for p in conv]), flat(running_stats(self.cut.trunk))])
        self.straggle(it, t0)
        self.link.reply(vector, Msg.grads(it))


def expected_server_bytes(settings: Settings, model: nn.Module, placement: Placement) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends and receives per iteration: (sent, received).

    Sent: the trunk's parameters to each of the n workers and the feature gradients of the batch.
    Received: the features of the batch and each worker's trunk gradients and running statistics.
    """
    n, batch = settings.code.n, settings.data.batch_size
    cut = cut_model(model, placement, settings.model.name)
    conv = sum(p.numel() for p in split_parameters(model, placement)[0])
    features = batch * math.prod(cut.feature_shape)
    stats = sum(s.numel() for s in running_stats(cut.trunk))
    return 4 * (n * conv + features), 4 * (features + n * (conv + stats))
