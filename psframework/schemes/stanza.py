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
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from psframework.config import Config
from psframework.schemes.common import Step
from psframework.schemes.data_parallel import (DataParallelServer, DataParallelWorker, RoundResult, assign,
                                               feature_grads_envelope, features_envelope, flat, grads_envelope,
                                               params_envelope, run_data_parallel, running_stats, set_grads,
                                               weighted_sum)


class StanzaServer(DataParallelServer):
    """Rank 0 of `stanza`: hosts the FC head and is the conv stack's parameter server."""

    def round(self, step: Step) -> RoundResult:
        it = step.iteration
        conv = self.model.conv_parameters()
        features = self.transport.post_gather(self.workers, features_envelope(it))
        self.send_all(self.workers, [flat(conv)] * self.n, params_envelope(it))
        arrived = self.wait(features, self.needed)
        used = sorted(arrived.first)
        shards = self.shards(step)
        sizes = self.sizes(shards)
        labels = self.dataset.train.labels[torch.from_numpy(step.indices)]
        own = [labels[shards[r]] for r in used]

        x = torch.cat([arrived.data[r] for r in used]).requires_grad_(True)
        self.head_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model.head(x), torch.cat(own))
        loss.backward()
        self.head_opt.step()

        grads = self.transport.post_gather(used, grads_envelope(it))
        pieces = torch.split(x.grad, [sizes[r] for r in used])
        self.send_all(used, [p.contiguous() for p in pieces], feature_grads_envelope(it))
        replies = self.wait(grads, len(used))
        count = sum(p.numel() for p in conv)
        # Conv gradients add up (each is that worker's share of the mean loss); running statistics average.
        total = weighted_sum(replies.data, dict.fromkeys(used, 1.0))
        set_grads(conv, total[:count])
        self.conv_opt.step()
        samples = sum(sizes[r] for r in used)
        stats = {r: replies.data[r][count:] for r in used}
        self.keep_running_stats(weighted_sum(stats, {r: sizes[r] / samples for r in used}))
        return RoundResult(float(loss.detach()), used, [sizes[r] for r in used])


class StanzaWorker(DataParallelWorker):
    """Rank j+1 of `stanza`: the conv stack on its shard; sends features, receives their gradient."""

    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> None:
        it = step.iteration
        conv = self.model.conv_parameters()
        assign(conv, params)
        t0 = time.perf_counter()
        for p in conv:
            p.grad = None
        features = self.model.features(images)
        self.straggle(it, time.perf_counter() - t0)
        self.transport.isend(0, features.detach().contiguous(), features_envelope(it)).wait()
        # Rank 0 answers with the features' gradient, or goes on without this worker (next round or stop).
        if self.inbox.wait_any([feature_grads_envelope(it), self.next_envelope(it)]) == 1:
            self.stats.skipped()
            return
        grad = self.inbox.take(feature_grads_envelope(it))
        t0 = time.perf_counter()
        features.backward(grad)
        vector = torch.cat([flat([p.grad for p in conv]), flat(running_stats(self.model))])
        self.straggle(it, time.perf_counter() - t0)
        self.transport.isend(0, vector, grads_envelope(it)).wait()
        self.stats.sent()


def run(cfg: Config, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run `stanza` on this rank: rank 0 returns the summary, workers return None."""
    return run_data_parallel(cfg, StanzaServer, StanzaWorker, comm)


def expected_server_bytes(cfg: Config, model: Any) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends and receives per iteration: (sent, received).

    Sent: the conv parameters to each of the n workers and the feature gradients of the batch.
    Received: the features of the batch and each worker's conv gradients and running statistics.
    """
    n, batch = cfg.code.n, cfg.data.batch_size
    conv = sum(p.numel() for p in model.conv_parameters())
    features = batch * math.prod(model.feature_shape)
    stats = sum(s.numel() for s in running_stats(model))
    return 4 * (n * conv + features), 4 * (features + n * (conv + stats))
