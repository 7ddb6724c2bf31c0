"""A scheme added from outside the package: data-parallel gradient averaging in a few lines.

It uses only the public pieces: the driver's ServerSide/WorkerSide, the links they are given (ServerLink,
WorkerLink) with the message vocabulary (Msg), and the registry. Run it like `psf`:
    mpiexec -n 3 python -m mpi4py tests/mpi/toy_scheme.py train CONFIG scheme=toy-average ...
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from psframework.cli import main
from psframework.comm.rounds import Msg
from psframework.data import shard, shard_bounds
from psframework.schemes import Scheme, register
from psframework.schemes.common import build_problem, conv_optimizer
from psframework.schemes.driver import ServerSide, StepResult, WorkerSide
from psframework.schemes.vectors import pack, set_grads, unpack_into


class AverageServer(ServerSide):
    """Rank 0: send the parameters, average the workers' gradients weighted by their shard sizes, step."""

    def __init__(self, settings, problem, link, group):
        super().__init__(settings, problem, link, group)
        self.optimizers = [conv_optimizer(settings.optim, list(self.model.parameters()))]

    def step(self, step):
        params = list(self.model.parameters())
        replies = self.link.round(pack(params), Msg.params(step.iteration), Msg.grads(step.iteration),
                                  need=self.link.n)
        bounds = shard_bounds(len(step.indices), self.link.n)
        total = sum(replies.data[j] * ((bounds[j + 1] - bounds[j]) / len(step.indices)) for j in sorted(replies.data))
        set_grads(params, total[:-1])
        self.optimizers[0].step()
        return StepResult(float(total[-1]))


class AverageWorker(WorkerSide):
    """Worker j: load the parameters, compute the gradient of the mean loss on its shard, reply."""

    def __init__(self, settings, link):
        super().__init__(settings, link)
        self.dataset, self.model = build_problem(settings)

    def step(self, step, after):
        params = list(self.model.parameters())
        unpack_into(params, self.link.take(Msg.params(step.iteration)))
        index = torch.from_numpy(shard(step.indices, self.link.index, len(self.link.workers)))
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self.dataset.train.images[index]), self.dataset.train.labels[index])
        loss.backward()
        self.link.reply(pack([p.grad for p in params] + [loss.reshape(1)]), Msg.grads(step.iteration))


register(Scheme("toy-average", "data-parallel gradient averaging", __name__,
                "AverageServer", "AverageWorker", shards_batch=True))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
