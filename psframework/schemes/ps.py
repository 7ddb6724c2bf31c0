"""`ps`: the parameter-server baseline. Every worker holds the whole model (conv stack and FC head).

Each iteration rank 0 sends every worker all parameters; worker j computes the gradient of the mean
loss on its shard of the global batch and pushes it, with its BatchNorm running statistics and its
loss; rank 0 averages the first n - b replies weighted by their samples (the gradient of the mean
loss over the samples used), steps and starts the next round. Parameters and gradients of the FC
layers cross the network twice per worker per iteration: the traffic Stanza removes.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from psframework.config import Config
from psframework.schemes.common import Step
from psframework.schemes.data_parallel import (DataParallelServer, DataParallelWorker, RoundResult, assign, flat,
                                               grads_envelope, params_envelope, run_data_parallel, running_stats,
                                               set_grads, weighted_sum)


class PSServer(DataParallelServer):
    """Rank 0 of `ps`: averages full-model gradients and steps every layer."""

    def round(self, step: Step) -> RoundResult:
        it = step.iteration
        params = list(self.model.parameters())
        gather = self.transport.post_gather(self.workers, grads_envelope(it))
        vector = flat(params)
        self.send_all(self.workers, [vector] * self.n, params_envelope(it))
        result = self.wait(gather, self.needed)
        used = sorted(result.first)
        sizes = self.sizes(self.shards(step))
        samples = sum(sizes[r] for r in used)
        # Gradients, running statistics and losses alike: the mean over the samples used.
        mean = weighted_sum(result.data, {r: sizes[r] / samples for r in used})
        count = vector.numel()
        set_grads(params, mean[:count])
        self.conv_opt.step()
        self.head_opt.step()
        self.keep_running_stats(mean[count:-1])
        return RoundResult(float(mean[-1]), used, [sizes[r] for r in used])


class PSWorker(DataParallelWorker):
    """Rank j+1 of `ps`: the whole model on its shard; pushes gradients, statistics and loss."""

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> None:
        weights = list(self.model.parameters())
        assign(weights, params)
        t0 = time.perf_counter()
        for p in weights:
            p.grad = None
        loss = F.cross_entropy(self.model(images), labels)
        loss.backward()
        vector = torch.cat([flat([p.grad for p in weights]), flat(running_stats(self.model)), loss.detach().reshape(1)])
        self.straggle(step.iteration, time.perf_counter() - t0)
        self.transport.isend(0, vector, grads_envelope(step.iteration)).wait()
        self.stats.sent()


def run(cfg: Config, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run `ps` on this rank: rank 0 returns the summary, workers return None."""
    return run_data_parallel(cfg, PSServer, PSWorker, comm)


def expected_server_bytes(cfg: Config, model: Any) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends and receives per iteration: (sent, received).

    Sent: all parameters to each of the n workers. Received: each worker's gradients, BatchNorm
    running statistics and loss (late replies of backup workers are received too, then dropped).
    """
    n = cfg.code.n
    params = sum(p.numel() for p in model.parameters())
    return 4 * n * params, 4 * n * (params + sum(s.numel() for s in running_stats(model)) + 1)
