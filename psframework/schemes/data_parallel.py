"""The data-parallel schemes' shared run loop: `ps` and `stanza` differ only in what one round moves.

Every worker loads the dataset itself and follows the same iteration plan as rank 0, taking its
contiguous shard of each global batch (`data.shard`), so no training images cross the network.
Each iteration starts with rank 0 sending the parameters the workers hold; it ends when rank 0 has
stepped its optimizers. With `train.backup_workers: b` rank 0 goes on with the first n - b workers
of every round (nonblocking receives), weighting by the samples actually used; the replies of the
others arrive late and are drained. A worker whose next parameters have already arrived when it is
about to compute knows that rank 0 has moved on, and skips the stale round.

BatchNorm running statistics live where the conv stack runs: workers send theirs with their
gradients and rank 0 keeps the mean over the workers it used. Batch statistics are per worker shard,
so with BatchNorm the data-parallel schemes do not reproduce the single-process trainer exactly.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from psframework.comm import Envelope, Kind, Phase  # envelopes only: no MPI import
from psframework.config import Config, dump_config
from psframework.data import load_dataset, num_batches, shard, shard_bounds
from psframework.metrics import Progress, RunRecorder
from psframework.models import SplitCNN, build_model
from psframework.models.split import input_size_of
from psframework.schemes.checkpoint import load_checkpoint, save_checkpoint
from psframework.schemes.common import (Step, build_problem, conv_optimizer, evaluate, head_optimizer,
                                        is_eval_iteration, iteration_plan, lr_factor, scale_lr, seed_everything,
                                        total_iterations)
from psframework.schemes.runtime import (WorkerStats, answer_stop, finish_server, make_transports, stop_envelope,
                                         straggle)


def params_envelope(iteration: int) -> Envelope:
    """Rank 0 -> worker: the parameters to use in an iteration."""
    return Envelope(Kind.PARAMS, iteration, 0, Phase.OTHER)


def grads_envelope(iteration: int) -> Envelope:
    """Worker -> rank 0: gradients (and BatchNorm statistics, and the loss) of an iteration."""
    return Envelope(Kind.GRADS, iteration, 0, Phase.BACKWARD)


def features_envelope(iteration: int) -> Envelope:
    """Worker -> rank 0 (stanza): the conv features of the worker's shard."""
    return Envelope(Kind.REPLY, iteration, 0, Phase.FORWARD)


def feature_grads_envelope(iteration: int) -> Envelope:
    """Rank 0 -> worker (stanza): the gradient of the loss with respect to the worker's features."""
    return Envelope(Kind.COMMAND, iteration, 0, Phase.BACKWARD)


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return the tensors, detached, as one contiguous float32 vector."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])


def assign(tensors: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy consecutive pieces of `vector` into `tensors` (in order, each reshaped to fit)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            size = t.numel()
            t.copy_(vector[offset:offset + size].view_as(t))
            offset += size
    if offset != vector.numel():
        raise ValueError(f"vector of {vector.numel()} values, expected {offset}")


def running_stats(model: SplitCNN) -> List[torch.Tensor]:
    """Return the conv stack's BatchNorm running means and variances (empty without BatchNorm)."""
    return [buf for block in model.conv_blocks if block.bn is not None
            for buf in (block.bn.running_mean, block.bn.running_var)]


def set_grads(params: Sequence[torch.nn.Parameter], vector: torch.Tensor) -> None:
    """Set every parameter's .grad from consecutive pieces of `vector`."""
    offset = 0
    for p in params:
        size = p.numel()
        p.grad = vector[offset:offset + size].view_as(p).clone()
        offset += size


@dataclass
class RoundResult:
    """What one server round produced: the loss over the samples used, and who contributed them."""

    loss: float
    used: List[int]  # worker ranks, ascending
    samples: List[int]  # samples of each used worker


class DataParallelServer(ABC):
    """Rank 0 of a data-parallel scheme: the parameter server; `round` is the scheme's own part."""

    def __init__(self, cfg: Config, roles: Any, transport: Any):
        self.cfg, self.roles, self.transport = cfg, roles, transport
        self.workers = list(roles.workers)
        self.n = len(self.workers)
        self.needed = self.n - cfg.train.backup_workers
        self.timings: Dict[str, float] = {}

    # -- helpers for the rounds ---------------------------------------------------------------
    def send_all(self, ranks: Sequence[int], tensors: Sequence[torch.Tensor], env: Envelope) -> None:
        """Start sending tensors[i] to ranks[i] (one tensor may go to all)."""
        t0 = time.perf_counter()
        for rank, tensor in zip(ranks, tensors):
            self.transport.isend(rank, tensor, env)
        self.timings["comm_s"] += time.perf_counter() - t0

    def wait(self, gather: Any, k: int) -> Any:
        """Wait for the first k replies of a gather; account the wait."""
        result = gather.wait(k)
        self.timings["wait_s"] += result.wait_s
        return result

    def shards(self, step: Step) -> Dict[int, slice]:
        """Return each worker rank's part of this iteration's global batch (as `data.shard` cuts it)."""
        bounds = shard_bounds(len(step.indices), self.n)
        return {rank: slice(bounds[i], bounds[i + 1]) for i, rank in enumerate(self.workers)}

    @staticmethod
    def sizes(shards: Dict[int, slice]) -> Dict[int, int]:
        """Return the number of samples of each worker rank's part."""
        return {rank: part.stop - part.start for rank, part in shards.items()}

    def keep_running_stats(self, mean: torch.Tensor) -> None:
        """Set the model's BatchNorm running statistics to the used workers' mean, `mean`."""
        assign(running_stats(self.model), mean)

    @abstractmethod
    def round(self, step: Step) -> RoundResult:
        """Run one iteration's communication and update (the scheme's part)."""

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        dataset, model = build_problem(cfg)
        self.dataset, self.model = dataset, model
        self.conv_opt = conv_optimizer(cfg, model.conv_parameters())
        self.head_opt = head_optimizer(cfg, model.head_parameters())
        start = 0
        if t.resume:  # the conv optimizer's state rides in the checkpoint's second optimizer slot
            start, _ = load_checkpoint(t.resume, model, self.head_opt, self.conv_opt)
        num_train = len(dataset.train)
        total = total_iterations(cfg, num_train)
        per_epoch = num_batches(num_train, cfg.data.batch_size, cfg.data.drop_last)
        self.roles.comm.bcast((start, total), root=0)

        recorder = RunRecorder(cfg.run_dir, dump_config(cfg))
        progress = Progress(total - start, cfg.output.progress)
        progress.message(f"psf: scheme {cfg.scheme}, {self.n} workers (rank 0 goes on with the first {self.needed}), "
                         f"model {model.name}, dataset {dataset.name}, iterations {start + 1}..{total}")
        accuracy = test_loss = None
        stats = self.transport.stats
        model.train()
        for step in iteration_plan(cfg, num_train, start_iteration=start):
            sent0, recv0 = stats.sent_bytes, stats.received_bytes
            self.timings = {"wait_s": 0.0, "comm_s": 0.0}
            t0 = time.perf_counter()
            scale_lr([self.conv_opt, self.head_opt], lr_factor(cfg, step.iteration, total))
            result = self.round(step)
            iteration_s = time.perf_counter() - t0
            recorder.log({"iteration": step.iteration, "epoch": step.epoch, "batch": step.batch,
                          "loss": result.loss, "iteration_s": iteration_s, "wall_s": recorder.elapsed(),
                          **self.timings, "compute_s": max(0.0, iteration_s - sum(self.timings.values())),
                          "bytes_sent": stats.sent_bytes - sent0, "bytes_received": stats.received_bytes - recv0,
                          "used": result.used, "samples": result.samples})
            extra = ""
            if is_eval_iteration(cfg, step, per_epoch, total):
                accuracy, test_loss = evaluate(model, dataset.test.images, dataset.test.labels,
                                               cfg.data.test_batch_size)
                recorder.update_last(test_accuracy=accuracy, test_loss=test_loss)
                extra = f"test acc {accuracy:.4f}"
            if step.iteration == total or (t.checkpoint_every and step.iteration % t.checkpoint_every == 0):
                save_checkpoint(f"{cfg.run_dir}/checkpoint.pt", step.iteration, model, None, self.head_opt,
                                self.conv_opt, cfg)
            progress.update(step.iteration - start, step.epoch, result.loss, extra)

        return finish_server(cfg, self.transport, self.workers, recorder, progress, {
            "model": model.name, "dataset": dataset.name, "n": self.n, "k": None,
            "backup_workers": t.backup_workers, "iterations": total, "start_iteration": start,
            "final_test_accuracy": accuracy, "final_test_loss": test_loss})


class DataParallelWorker(ABC):
    """Rank j+1 of a data-parallel scheme: trains on its shard; `compute` is the scheme's own part."""

    def __init__(self, cfg: Config, roles: Any, transport: Any):
        from psframework.comm import Mailbox, Stragglers, StragglerSpec

        self.cfg, self.roles, self.transport = cfg, roles, transport
        self.j, self.n = roles.worker_index, roles.n_workers
        self.stragglers = Stragglers(StragglerSpec.from_config(cfg.stragglers), list(roles.workers))
        self.stats = WorkerStats()
        # Every message from rank 0 is taken off the wire as it comes, even while this worker lags.
        self.inbox = Mailbox(transport, 0)

    def next_envelope(self, iteration: int) -> Envelope:
        """Return the envelope of the message that opens the round after `iteration`."""
        return params_envelope(iteration + 1) if iteration < self.total else self.stop

    @abstractmethod
    def compute(self, step: Step, params: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Run one iteration on this worker's shard from the parameters rank 0 sent (the scheme's part)."""

    def straggle(self, iteration: int, compute_s: float) -> None:
        """Add compute time and an injected straggler's delay to the report."""
        self.stats.values["compute_s"] += compute_s
        self.stats.values["delay_s"] += straggle(self.stragglers, self.roles.rank, iteration, compute_s,
                                                 [self.inbox.progress, self.transport.progress])

    def run(self) -> None:
        cfg = self.cfg
        dataset = load_dataset(cfg.data, input_size_of(cfg.model))
        seed_everything(cfg.train.seed)  # the same initial model as rank 0 (overwritten by its parameters)
        self.model = build_model(cfg.model, dataset.image_shape[0], dataset.num_classes)
        self.model.train()
        start, total = self.roles.comm.bcast(None, root=0)
        self.total, self.stop = total, stop_envelope(total)
        images, labels = dataset.train.images, dataset.train.labels
        for step in iteration_plan(cfg, len(dataset.train), start_iteration=start):
            params = self.inbox.take(params_envelope(step.iteration))
            if self.inbox.has(self.next_envelope(step.iteration)):
                self.stats.skipped()  # rank 0 has finished this round without this worker
                continue
            index = torch.from_numpy(shard(step.indices, self.j, self.n))
            self.compute(step, params, images[index], labels[index])
        answer_stop(self.inbox, self.transport, total, self.stats)
        self.inbox.close()
        self.transport.close(timeout_s=1.0)


def run_data_parallel(cfg: Config, server_cls: type, worker_cls: type, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run the server or a worker side of a data-parallel scheme, as this rank's role says."""
    roles, transport, _ = make_transports(cfg, comm)
    if roles.is_server:
        return server_cls(cfg, roles, transport).run()
    worker_cls(cfg, roles, transport).run()
    return None


def weighted_sum(vectors: Dict[int, torch.Tensor], weights: Dict[int, float]) -> torch.Tensor:
    """Return sum of weights[r] * vectors[r] over ranks in ascending order (a fixed order: reproducible)."""
    ranks = sorted(weights)
    out = vectors[ranks[0]] * weights[ranks[0]]
    for r in ranks[1:]:
        out.add_(vectors[r], alpha=weights[r])
    return out

