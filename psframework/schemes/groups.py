"""Several servers: each leads a group on its part of the global batch, and together they keep one model.

The global batch is cut into G contiguous parts, part g for group g (the same cut `data.shard` makes
for workers). Each server runs its group's step on its part with the loss summed over the part and
divided by the size of the whole batch, so the parts' gradients add up to the gradient of the mean
loss over the whole batch. The servers then sum the gradients of what they update themselves (the
head, BatchNorm, whatever the workers do not hold) with the loss and the stop decision, in one sum.
BatchNorm layers use statistics of the whole batch: forward, the count, sum and sum of squares per
channel are summed over the servers; backward, the sums of dY and dY * x_hat, as synchronised
BatchNorm does. So every server steps the same model, and the run equals the single-process trainer.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from psframework.comm.timeline import TIMELINE
from psframework.data import shard, shard_bounds
from psframework.runtime.preempt import FLAG
from psframework.schemes.recipe import training_loss
from psframework.schemes.vectors import pack, set_grads


def part_size(batch_size: int, group: int, groups: int) -> int:
    """Return how many samples of a global batch group `group` of `groups` gets."""
    bounds = shard_bounds(batch_size, groups)
    return bounds[group + 1] - bounds[group]


def server_parameters(optimizers: Sequence[torch.optim.Optimizer]) -> List[torch.nn.Parameter]:
    """Return the parameters the optimizers step, in order."""
    return [p for opt in optimizers for group in opt.param_groups for p in group["params"]]


def sync_bytes(parameters: int, norms: Sequence[_BatchNorm]) -> int:
    """Return the payload bytes a server sums with the other servers per iteration (sent; as many come back).

    The gradients of the `parameters` values the servers step, with the loss and the stop flag, in
    float32; per BatchNorm layer the servers run, with C channels, 2C + 1 float64 statistics forward
    and 2C gradient sums backward.
    """
    return 4 * (parameters + 2) + sum(8 * (4 * m.num_features + 1) for m in norms)


class Group(Protocol):
    """A server's place among the servers of a run: what it computes on and what it sums with the others."""

    index: int
    count: int

    @property
    def lead(self) -> bool:
        """Return whether this is the lead server: it evaluates, checkpoints and records."""

    @property
    def stop(self) -> bool:
        """Return whether the run stops after the current iteration (a preemption signal)."""

    def part(self, indices: np.ndarray) -> np.ndarray:
        """Return this server's part of a global batch's sample indices."""

    def begin(self, batch_size: int) -> None:
        """Start an iteration on a global batch of `batch_size` samples."""

    def loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Return this server's share of the mean cross-entropy over the global batch."""

    def sum_gradients(self, optimizers: Sequence[torch.optim.Optimizer], loss: float) -> float:
        """Sum what the optimizers will step, the loss and the stop flags over the servers; return the loss."""

    def agree_stop(self) -> bool:
        """Agree with the other servers whether the run stops after this iteration; return it."""

    def any(self, flag: bool) -> bool:
        """Return whether `flag` is set on any server (an overflow seen by one skips every server's step)."""

    def batchnorm(self, model: nn.Module) -> ContextManager[None]:
        """Return a block in which the model's BatchNorm layers use statistics of the whole batch."""

    def broadcast(self, obj: Any) -> Any:
        """Return the lead's `obj` on every server."""

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Return every server's `obj` on the lead (in order), None elsewhere."""

    def fields(self) -> Dict[str, Any]:
        """Return the iteration's fields of the sums among the servers."""

    def summary(self, fields: Dict[str, Any], recorder: Any) -> Dict[str, Any]:
        """Return the summary's fields about the servers, and release what the sums held."""


class SoleServer:
    """The one server of a run: the whole batch, nothing to sum, its own preemption flag."""

    index, count, lead = 0, 1, True

    def __init__(self, smoothing: float = 0.0) -> None:
        self.smoothing = smoothing  # train.label_smoothing

    @property
    def stop(self) -> bool:
        """Return whether a preemption signal asks the run to stop."""
        return FLAG.requested()

    def part(self, indices: np.ndarray) -> np.ndarray:
        """Return the whole global batch."""
        return indices

    def begin(self, batch_size: int) -> None:
        """Start an iteration: nothing to prepare."""

    def loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy over the batch."""
        return training_loss(scores, labels, self.smoothing)

    def sum_gradients(self, optimizers: Sequence[torch.optim.Optimizer], loss: float) -> float:
        """Return the loss: the gradients are already the whole batch's."""
        return loss

    def agree_stop(self) -> bool:
        """Return whether a preemption signal asks the run to stop."""
        return self.stop

    def any(self, flag: bool) -> bool:
        """Return the flag: there is no other server."""
        return flag

    def batchnorm(self, model: nn.Module) -> ContextManager[None]:
        """Return a block that changes nothing: the batch is this server's."""
        return nullcontext()

    def broadcast(self, obj: Any) -> Any:
        """Return `obj`: there is no other server."""
        return obj

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Return `obj` as the only server's."""
        return [obj]

    def fields(self) -> Dict[str, Any]:
        """Return no fields: nothing is summed among servers."""
        return {}

    def summary(self, fields: Dict[str, Any], recorder: Any) -> Dict[str, Any]:
        """Return no fields: there are no other servers."""
        return {}


class ServerGroup:
    """This server's place among the G servers: its part of every global batch and the sums across servers.

    `peers` sums float arrays over the servers (comm.collective.Peers, or any object with `sum`,
    `broadcast`, `gather` and `stats`); rank g among them leads group g, rank 0 is the lead server.
    """

    def __init__(self, peers: Any, index: int, count: int, smoothing: float = 0.0) -> None:
        self.peers, self.index, self.count = peers, index, count
        self.smoothing = smoothing  # train.label_smoothing
        self.scale = 1.0  # 1 / the global batch's size: each part's loss is its share of the mean
        self.stop = False  # whether any server asked to stop after the current iteration
        self._bytes0 = 0

    def broadcast(self, obj: Any) -> Any:
        """Return the lead's `obj` on every server."""
        return self.peers.broadcast(obj)

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Return every server's `obj` on the lead (in order), None elsewhere."""
        return self.peers.gather(obj)

    @property
    def lead(self) -> bool:
        """Return whether this is the lead server (rank 0 of the job)."""
        return self.index == 0

    def part(self, indices: np.ndarray) -> np.ndarray:
        """Return this group's contiguous part of a global batch's sample indices."""
        return shard(indices, self.index, self.count)

    def begin(self, batch_size: int) -> None:
        """Start an iteration on a global batch of `batch_size` samples."""
        self.scale = 1.0 / batch_size
        self._bytes0 = self.peers.stats.sent_bytes

    def loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Return this part's share of the mean cross-entropy over the global batch."""
        return training_loss(scores, labels, self.smoothing, reduction="sum") * self.scale

    def sum_gradients(self, optimizers: Sequence[torch.optim.Optimizer], loss: float) -> float:
        """Sum the gradients the optimizers will step, the loss and the stop flags over the servers; return the loss.

        A preemption signal on any server stops every server after this iteration (`stop`).
        """
        stop = FLAG.requested()
        params = server_parameters(optimizers)
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        vector = torch.cat([pack(grads).cpu(), torch.tensor([loss, float(stop)], dtype=torch.float32)])
        total = _summed(self.peers, vector, "the servers' gradient sum")
        set_grads(params, total[:-2].to(params[0].device) if params else total[:0])
        self.stop = bool(total[-1] > 0)
        return float(total[-2])

    def agree_stop(self) -> bool:
        """Return (and keep) whether any server asked to stop after this iteration (servers that sum nothing else)."""
        self.stop = bool(self.peers.sum(np.array([1.0 if FLAG.requested() else 0.0]), "the stop decision")[0] > 0)
        return self.stop

    def any(self, flag: bool) -> bool:
        """Return whether `flag` is set on any server."""
        return bool(self.peers.sum(np.array([1.0 if flag else 0.0]), "the overflow decision")[0] > 0)

    def fields(self) -> Dict[str, Any]:
        """Return the iteration's bytes summed with the other servers (each sent and received once)."""
        return {"server_sync_bytes": self.peers.stats.sent_bytes - self._bytes0}

    def summary(self, fields: Dict[str, Any], recorder: Any) -> Dict[str, Any]:
        """Return every server's figures (on the lead) and the job's processor time; free the servers' sums."""
        servers = self.gather_servers(fields, recorder)
        self.peers.free()
        if not servers:
            return {"servers": servers}
        groups = [s["cpu_s_per_iteration"] for s in servers]  # the job's processor time: every group's
        return {"servers": servers, "cpu_s_per_iteration": {key: sum(g[key] for g in groups) for key in groups[0]}}

    def gather_servers(self, fields: Dict[str, Any], recorder: Any) -> Optional[List[Dict[str, Any]]]:
        """Return every server's bytes on the lead (None elsewhere): with its workers, and summed with the servers."""
        mine = {"rank": self.peers.names[self.index], "group": self.index,
                "bytes_sent": fields.get("server_bytes_sent"), "bytes_received": fields.get("server_bytes_received"),
                "bytes_sent_per_iteration": recorder.mean("bytes_sent", skip=1),
                "bytes_received_per_iteration": recorder.mean("bytes_received", skip=1),
                "sync_bytes_per_iteration": recorder.mean("server_sync_bytes", skip=1),
                "sync_bytes": self.peers.stats.sent_bytes, "sync_wait_s": self.peers.stats.wait_s,
                "cpu_s_per_iteration": fields.get("cpu_s_per_iteration")}
        return self.peers.gather(mine)

    @contextmanager
    def batchnorm(self, model: nn.Module) -> Iterator[None]:
        """Run the model's BatchNorm layers on statistics of the whole batch while inside the block."""
        layers = [m for m in model.modules() if isinstance(m, _BatchNorm)]
        try:
            for layer in layers:
                layer.forward = _synced_forward(layer, self.peers)
            yield
        finally:
            for layer in layers:
                del layer.forward


def _synced_forward(layer: _BatchNorm, peers: Any) -> Any:
    original = type(layer).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not layer.training:
            return original(layer, x)
        layer._check_input_dim(x)
        return SyncedBatchNorm.apply(x, layer.weight, layer.bias, layer, peers)
    return forward


class SyncedBatchNorm(torch.autograd.Function):
    """BatchNorm in training mode over the union of every server's part (sums in float64)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                layer: _BatchNorm, peers: Any) -> torch.Tensor:
        dims = [0] + list(range(2, x.dim()))
        wide = x.detach().double()
        local = torch.cat([torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64, device=x.device),
                           wide.sum(dims), (wide * wide).sum(dims)])
        total = _summed(peers, local, "the BatchNorm statistics")
        channels = x.shape[1]
        count, mean = total[0], total[1:1 + channels] / total[0]
        var = (total[1 + channels:] / count - mean * mean).clamp_min(0.0)
        _update_running(layer, mean, var, float(count))
        shape = [1, channels] + [1] * (x.dim() - 2)
        invstd = (var + layer.eps).rsqrt()
        x_hat = ((wide - mean.view(shape)) * invstd.view(shape)).to(x.dtype)
        ctx.save_for_backward(x_hat, invstd.to(x.dtype), weight)
        ctx.peers, ctx.count, ctx.shape, ctx.has_bias = peers, float(count), shape, bias is not None
        out = x_hat if weight is None else x_hat * weight.view(shape)
        return out if bias is None else out + bias.view(shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x_hat, invstd, weight = ctx.saved_tensors
        dims = [0] + list(range(2, dy.dim()))
        shape = ctx.shape
        local = torch.cat([dy.double().sum(dims), (dy.double() * x_hat.double()).sum(dims)])
        channels = dy.shape[1]
        grad_weight = None if weight is None else local[channels:].to(dy.dtype)
        grad_bias = local[:channels].to(dy.dtype) if ctx.has_bias else None
        total = _summed(ctx.peers, local.clone(), "the BatchNorm gradient sums") / ctx.count
        mean_dy, mean_dy_xhat = total[:channels], total[channels:]
        scale = invstd if weight is None else invstd * weight
        centred = dy.double() - mean_dy.view(shape) - x_hat.double() * mean_dy_xhat.view(shape)
        dx = centred * scale.double().view(shape)
        return dx.to(dy.dtype), grad_weight, grad_bias, None, None


def start_sum(peers: Any, values: torch.Tensor, what: str, serve: Optional[Callable[[], Any]] = None
              ) -> Callable[[], torch.Tensor]:
    """Start summing a tensor over the peers (through host memory, in its dtype); return what waits for the sum."""
    host = values.detach().to("cpu").contiguous().numpy()
    handle = peers.start_sum(host, what)

    def wait() -> torch.Tensor:
        with TIMELINE.span("sum", what):
            return torch.from_numpy(handle.wait(serve)).to(values.device)
    return wait


def _summed(peers: Any, values: torch.Tensor, what: str) -> torch.Tensor:
    """Return the sum over the servers of a tensor."""
    return start_sum(peers, values, what)()


@torch.no_grad()
def _update_running(layer: _BatchNorm, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
    """Update the running statistics as torch's BatchNorm does (unbiased variance)."""
    if not layer.track_running_stats or layer.running_mean is None:
        return
    layer.num_batches_tracked.add_(1)
    factor = 1.0 / float(layer.num_batches_tracked) if layer.momentum is None else layer.momentum
    unbiased = var * (count / max(count - 1.0, 1.0))
    layer.running_mean.mul_(1.0 - factor).add_(mean.to(layer.running_mean.dtype), alpha=factor)
    layer.running_var.mul_(1.0 - factor).add_(unbiased.to(layer.running_var.dtype), alpha=factor)
