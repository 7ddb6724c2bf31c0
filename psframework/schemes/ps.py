"""`ps`: the parameter-server baseline. Every worker holds the whole model (conv stack and FC head).

Each iteration rank 0 sends every worker all parameters; worker j computes the gradient of the mean
loss on its shard of the global batch and pushes it, with its BatchNorm running statistics and its
loss; rank 0 averages the first n - b replies weighted by their samples (the gradient of the mean
loss over the samples used), steps and starts the next round. Parameters and gradients of the FC
layers cross the network twice per worker per iteration: the traffic Stanza removes.
"""

from __future__ import annotations

import time
from typing import Any, Tuple

import torch
import torch.nn.functional as F

from psframework.comm.rounds import Msg
from psframework.schemes.common import Step
from psframework.schemes.data_parallel import (DataParallelServer, DataParallelWorker, RoundResult, assign, flat,
                                               running_stats, set_grads, weighted_sum)
from psframework.schemes.driver import Event
from psframework.settings import Settings


class PSServer(DataParallelServer):
    """Rank 0 of `ps`: averages full-model gradients and steps every layer."""

    def round(self, step: Step) -> RoundResult:
        params = list(self.model.parameters())
        vector = flat(params)
        replies = self.link.round(vector, Msg.params(step.iteration), Msg.grads(step.iteration), self.needed)
        result = self.result(step, replies)
        # Gradients and losses alike: the mean over the samples used.
        mean = weighted_sum(replies.data, result.sample_weights())
        count = vector.numel()
        set_grads(params, mean[:count])
        for opt in self.optimizers:
            opt.step()
        self.keep_running_stats({j: v[count:-1] for j, v in replies.data.items()}, result)
        result.loss = float(mean[-1])
        return result


class PSWorker(DataParallelWorker):
    """Worker j of `ps`: the whole model on its shard; pushes gradients, statistics and loss."""

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor,
                after: Event) -> None:
        weights = list(self.model.parameters())
        assign(weights, params)
        t0 = time.perf_counter()
        for p in weights:
            p.grad = None
        with self.link.busy():
            loss = F.cross_entropy(self.model(images), labels)
            loss.backward()
        vector = torch.cat([flat([p.grad for p in weights]), flat(running_stats(self.model)), loss.detach().reshape(1)])
        self.straggle(step.iteration, t0)
        self.link.reply(vector, Msg.grads(step.iteration))


def expected_server_bytes(settings: Settings, model: Any, placement: Any) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends and receives per iteration: (sent, received).

    Sent: all parameters to each of the n workers. Received: each worker's gradients, BatchNorm
    running statistics and loss (late replies of backup workers are received too, then dropped).
    """
    n = settings.code.n
    params = sum(p.numel() for p in model.parameters())
    return 4 * n * params, 4 * n * (params + sum(s.numel() for s in running_stats(model)) + 1)
