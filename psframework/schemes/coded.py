"""Coded model-parallel training over MPI: `sazd` (DEU), `poly` and `uncoded`.

Rank 0 runs the data pipeline, decodes every conv layer's output from the first k replies, applies
BatchNorm/ReLU/pooling, runs the FC head and decodes input gradients. Ranks 1..n hold packet j of
each conv layer's row- and column-coded weights and update them themselves (distributed encoding
and updating). Both sides follow one deterministic command plan, so a worker always knows which
command comes next: it skips a reply once the next command is already waiting (the server no
longer needs it), but applies every update, in order.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from psframework.comm import Envelope, Kind, Phase  # envelopes only: no MPI import
from psframework.codes import Code, SAZDCode, from_bits, make_code, split_blocks, to_bits
from psframework.config import Config, dump_config
from psframework.data import dataset_shape, num_batches
from psframework.metrics import Progress, RunRecorder
from psframework.models import SplitCNN, build_model
from psframework.schemes.checkpoint import load_checkpoint, save_checkpoint
from psframework.schemes.coded_core import CodedServer, CodedWorker, decode_conv_state
from psframework.schemes.coded_layers import LayerCoding, encode_layer, layer_codings
from psframework.schemes.common import (build_problem, evaluate, head_optimizer, is_eval_iteration,
                                        iteration_plan, lr_factor, make_optimizer, scale_lr, seed_everything,
                                        total_iterations)
from psframework.schemes.runtime import WorkerStats, answer_stop, finish_server, make_transports, straggle

# Command kinds of the plan (mapped onto the transport's envelope kinds).
INIT, FORWARD, BACKWARD, STATE, STOP = "init", "forward", "backward", "state", "stop"


@dataclass(frozen=True)
class Command:
    """One step of the plan both sides follow."""

    kind: str
    iteration: int
    layer: int = 0


def needs_state(cfg: Config, iteration: int, per_epoch: int, total: int) -> bool:
    """Return whether the server collects the workers' coded state after this iteration."""
    t = cfg.train
    if iteration == total:
        return True
    if t.verify_every and iteration % t.verify_every == 0:
        return True
    if t.checkpoint_every and iteration % t.checkpoint_every == 0:
        return True
    if t.eval_every:
        return iteration % t.eval_every == 0
    return iteration % per_epoch == 0


def command_plan(cfg: Config, num_layers: int, start: int, total: int, per_epoch: int,
                 stateful: bool = True) -> Iterator[Command]:
    """Yield the commands of a run from iteration `start` (completed) to `total`.

    Stateful workers (DEU) get their initial state, every layer's backward (they update) and state
    requests; stateless workers (naive scheme) only compute, so layer 0 has no backward for them.
    """
    if stateful:
        yield Command(INIT, start)
    last = 0 if stateful else 1
    for t in range(start + 1, total + 1):
        for layer in range(num_layers):
            yield Command(FORWARD, t, layer)
        for layer in range(num_layers - 1, last - 1, -1):
            yield Command(BACKWARD, t, layer)
        if stateful and needs_state(cfg, t, per_epoch, total):
            yield Command(STATE, t)
    yield Command(STOP, total)


def envelope(cmd: Command, reply: bool = False, shard: bool = False, params: bool = False):
    """Return the transport envelope of a command (or of its reply, a relayed shard, or its weights)."""
    if cmd.kind in (FORWARD, BACKWARD):
        phase = Phase.FORWARD if cmd.kind == FORWARD else Phase.BACKWARD
        kind = Kind.SHARD if shard else Kind.PARAMS if params else (Kind.REPLY if reply else Kind.COMMAND)
        return Envelope(kind, cmd.iteration, cmd.layer, phase)
    if cmd.kind == INIT:
        return Envelope(Kind.PARAMS, cmd.iteration, 0, Phase.OTHER)
    if cmd.kind == STATE:
        return Envelope(Kind.PARAMS if reply else Kind.CONTROL, cmd.iteration, 1, Phase.OTHER)
    return Envelope(Kind.CONTROL, cmd.iteration, 2, Phase.OTHER)


def worker_model(cfg: Config) -> SplitCNN:
    """Build the model skeleton a worker needs (layer geometry), without loading data."""
    channels, classes = dataset_shape(cfg.data)
    seed_everything(cfg.train.seed)
    return build_model(cfg.model, channels, classes)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Return the tensors concatenated into one flat float32 vector."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def unflatten(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> List[torch.Tensor]:
    """Split a flat vector back into tensors of the given shapes."""
    out, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(flat[offset:offset + size].reshape(shape))
        offset += size
    if offset != flat.numel():
        raise ValueError(f"state vector has {flat.numel()} values, expected {offset}")
    return out


def conv_state_tensors(model: SplitCNN, momentum: Optional[List[Dict[str, torch.Tensor]]]) -> List[torch.Tensor]:
    """Return [W, b, momentum W, momentum b] of every conv layer (zeros for missing momentum)."""
    out = []
    for i, block in enumerate(model.conv_blocks):
        w, b = block.conv.weight.detach(), block.conv.bias.detach()
        mw = momentum[i]["weight_momentum"] if momentum else torch.zeros_like(w)
        mb = momentum[i]["bias_momentum"] if momentum else torch.zeros_like(b)
        out += [w, b, mw, mb]
    return out


def conv_state_shapes(model: SplitCNN) -> List[torch.Size]:
    """Return the shapes of `conv_state_tensors`."""
    shapes = []
    for block in model.conv_blocks:
        shapes += [block.conv.weight.shape, block.conv.bias.shape] * 2
    return shapes


def rotating_subsets(n: int, k: int) -> Iterator[tuple]:
    """Cycle through every k-subset of n workers, those without systematic packets first."""
    subsets = sorted(itertools.combinations(range(n), k), key=lambda s: (-min(s), s))
    return itertools.cycle(subsets)


class Dissemination:
    """Deliver a tensor from the server to every worker: direct, or relayed as SA-coded packets."""

    def __init__(self, mode: str, n: int, k: int):
        self.code = SAZDCode(n, k) if mode == "relay" else None
        self.n, self.k = n, k

    def packets(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Return what the server sends to each worker (the tensor, or packet j of its bits)."""
        x = x.detach().contiguous()
        if self.code is None:
            return [x] * self.n
        bits = to_bits(x).reshape(-1)
        return [p.contiguous() for p in self.code.encode(split_blocks(bits, self.k), axis=0)]

    def restore(self, packets: Dict[int, torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Decode the tensor bit-exactly from k packets."""
        numel = int(np.prod(shape))
        bits = self.code.decode_joined(packets, axis=0, length=numel)
        return from_bits(bits.contiguous(), dtype).reshape(shape)


def run(cfg: Config, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run a coded scheme on this rank: the server returns the summary, workers return None."""
    return run_ranks(cfg, CodedServerRank, CodedWorkerRank, comm)


def run_ranks(cfg: Config, server_cls: type, worker_cls: type, comm: Any = None) -> Optional[Dict[str, Any]]:
    """Run the server or a worker side of a coded scheme, as this rank's role says."""
    roles, transport, peers = make_transports(cfg, comm, peers=cfg.comm.dissemination == "relay")
    code = make_code(cfg)
    if roles.is_server:
        return server_cls(cfg, code, roles, transport).run()
    worker_cls(cfg, code, roles, transport, peers).run()
    return None


class MPIExchange:
    """The server's side of delivering layer tensors and collecting the first k replies."""

    def __init__(self, rank: "CodedServerRank"):
        self.rank = rank
        self.iteration = 0

    def forward(self, layer: int, x: torch.Tensor) -> Dict[int, torch.Tensor]:
        return self.rank.round(Command(FORWARD, self.iteration, layer), x, want_reply=True)

    def backward(self, layer: int, dy: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        return self.rank.round(Command(BACKWARD, self.iteration, layer), dy, want_reply)


class CodedServerRank:
    """Rank 0 of a coded scheme (DEU: the workers hold and update the coded weights)."""

    stateful = True

    def __init__(self, cfg: Config, code: Code, roles: Any, transport: Any):
        from psframework.comm import Stragglers, StragglerSpec

        self.cfg, self.code, self.roles, self.transport = cfg, code, roles, transport
        self.workers = list(roles.workers)
        self.n, self.k = code.n, code.k
        self.dissemination = Dissemination(cfg.comm.dissemination, self.n, self.k)
        self.stragglers = Stragglers(StragglerSpec.from_config(cfg.stragglers), self.workers)
        self.subsets = rotating_subsets(self.n, self.k) if cfg.code.subsets == "rotate" else None
        self.timings: Dict[str, float] = {}
        self.used: List[List[int]] = []

    # -- one round: deliver a tensor, take the first k replies --------------------------------
    def round(self, cmd: Command, x: torch.Tensor, want_reply: bool) -> Dict[int, torch.Tensor]:
        t0 = time.perf_counter()
        extra = self.round_extra(cmd, x)
        if not (want_reply or self.stateful):
            return {}  # stateless workers have no command for the first layer's backward (see command_plan)
        t1 = time.perf_counter()
        gather = self.transport.post_gather(self.workers, envelope(cmd, reply=True)) if want_reply else None
        t2 = time.perf_counter()
        if cmd.kind == BACKWARD and self.stateful and not self.codings[cmd.layer].has_column_copy:
            # Worker j only needs SA_j(dY) to update a layer without a column copy: send just that.
            packets = [p.contiguous() for p in self.codings[cmd.layer].encode(self.code, x, 1)]
        else:
            packets = self.dissemination.packets(x)
        t3 = time.perf_counter()
        for j, rank in enumerate(self.workers):
            self.transport.isend(rank, packets[j], envelope(cmd))
            if extra is not None:
                self.transport.isend(rank, extra[j], envelope(cmd, params=True))
        t4 = time.perf_counter()
        self.timings["encode_s"] += (t1 - t0) + (t3 - t2)
        self.timings["comm_s"] += (t2 - t1) + (t4 - t3)
        t3 = t4
        if gather is None:
            return {}
        if self.subsets is None:
            result = gather.wait(self.k)
            chosen = result.first
        else:
            chosen = [self.workers[i] for i in next(self.subsets)]
            result = gather.wait(self.n)
        self.timings["wait_s"] += result.wait_s
        self.timings["comm_s"] += max(0.0, time.perf_counter() - t3 - result.wait_s)
        self.used.append(sorted(chosen))
        return {rank - 1: result.data[rank] for rank in chosen}

    def round_extra(self, cmd: Command, x: torch.Tensor) -> Optional[List[torch.Tensor]]:
        """Return a second tensor per worker to send with a command: none, DEU workers hold their weights."""
        return None

    def collect_state(self, iteration: int, replies: int) -> Dict[int, torch.Tensor]:
        """Ask every worker for its coded state; return the first `replies` {worker index: state}."""
        cmd = Command(STATE, iteration)
        gather = self.transport.post_gather(self.workers, envelope(cmd, reply=True))
        for rank in self.workers:
            self.transport.isend(rank, torch.zeros(1), envelope(cmd))
        result = gather.wait(replies)
        return {rank - 1: result.data[rank] for rank in result.arrived[:replies]}

    # -- the run ------------------------------------------------------------------------------
    def start_workers(self, model: SplitCNN, momentum: Optional[List[Dict[str, torch.Tensor]]], start: int) -> None:
        """Send every worker the uncoded conv state; each encodes its own packets (DEU)."""
        flat = flatten(conv_state_tensors(model, momentum))
        for rank in self.workers:
            self.transport.isend(rank, flat, envelope(Command(INIT, start)))

    def sync_state(self, iteration: int, verify: bool) -> List[Dict[str, torch.Tensor]]:
        """Bring the server's conv weights up to date; return the conv momentum for checkpoints."""
        states = self.collect_state(iteration, self.k + 1 if verify else self.k)
        return self.install_state(self.model, self.codings, states, verify)

    def run(self) -> Dict[str, Any]:
        cfg = self.cfg
        t = cfg.train
        dataset, model = build_problem(cfg)
        codings = layer_codings(model, self.k, cfg.code.symbol_channels)
        self.model, self.codings = model, codings
        bn = [p for b in model.conv_blocks if b.bn is not None for p in b.bn.parameters()]
        post_opt = make_optimizer(bn, "sgd", t.lr, t.momentum, t.nesterov, t.weight_decay) if bn else None
        head_opt = head_optimizer(cfg, model.head_parameters())
        start, momentum = 0, None
        if t.resume:
            start, momentum = load_checkpoint(t.resume, model, head_opt, post_opt)
        server = CodedServer(model, self.code, codings, [head_opt, post_opt] + self.conv_optimizers(model, momentum))
        num_train = len(dataset.train)
        total = total_iterations(cfg, num_train)
        per_epoch = num_batches(num_train, cfg.data.batch_size, cfg.data.drop_last)
        # The server owns the data; it tells the workers where the run starts and ends.
        self.roles.comm.bcast((start, total, per_epoch), root=0)
        if self.stateful:
            self.start_workers(model, momentum, start)

        recorder = RunRecorder(cfg.run_dir, dump_config(cfg))
        progress = Progress(total - start, cfg.output.progress)
        progress.message(f"psf: scheme {cfg.scheme}, {self.code!r}, model {model.name}, dataset {dataset.name}, "
                         f"dissemination {cfg.comm.dissemination}, iterations {start + 1}..{total}")
        exchange = MPIExchange(self)
        self.exchange = exchange
        accuracy = test_loss = None
        verify_max = 0.0
        stats = self.transport.stats
        for step in iteration_plan(cfg, num_train, start_iteration=start):
            sent0, recv0 = stats.sent_bytes, stats.received_bytes
            self.timings = dict.fromkeys(("wait_s", "encode_s", "comm_s"), 0.0)
            self.used = []
            exchange.iteration = step.iteration
            t0 = time.perf_counter()
            index = torch.from_numpy(step.indices)
            scale_lr(server.optimizers, lr_factor(cfg, step.iteration, total))
            server.decode_s = 0.0
            loss = server.step(dataset.train.images[index], dataset.train.labels[index], exchange)
            iteration_s = time.perf_counter() - t0
            row = {"iteration": step.iteration, "epoch": step.epoch, "batch": step.batch, "loss": loss,
                   "iteration_s": iteration_s, "wall_s": recorder.elapsed(), **self.timings,
                   "decode_s": server.decode_s,
                   "compute_s": max(0.0, iteration_s - sum(self.timings.values()) - server.decode_s),
                   "bytes_sent": stats.sent_bytes - sent0, "bytes_received": stats.received_bytes - recv0,
                   "used": self.used,
                   "straggler_delays": {str(r): f for r, f in self.stragglers.factors(step.iteration).items() if f}}
            recorder.log(row)
            extra = ""
            if needs_state(cfg, step.iteration, per_epoch, total):
                verify = bool(t.verify_every and step.iteration % t.verify_every == 0 and self.n > self.k)
                momentum = self.sync_state(step.iteration, verify)
                if verify and self.stateful:
                    verify_max = max(verify_max, self.last_verify)
                    recorder.update_last(verify_max_rel_diff=self.last_verify)
                    extra += f"verify {self.last_verify:.1e} "
                if is_eval_iteration(cfg, step, per_epoch, total):
                    accuracy, test_loss = evaluate(model, dataset.test.images, dataset.test.labels,
                                                   cfg.data.test_batch_size)
                    recorder.update_last(test_accuracy=accuracy, test_loss=test_loss)
                    extra += f"test acc {accuracy:.4f}"
                if step.iteration == total or (t.checkpoint_every and step.iteration % t.checkpoint_every == 0):
                    save_checkpoint(f"{cfg.run_dir}/checkpoint.pt", step.iteration, model, momentum,
                                    head_opt, post_opt, cfg)
            progress.update(step.iteration - start, step.epoch, loss, extra.strip())

        return finish_server(cfg, self.transport, self.workers, recorder, progress, {
            "model": model.name, "dataset": dataset.name, "n": self.n, "k": self.k, "code": repr(self.code),
            "dissemination": cfg.comm.dissemination, "iterations": total, "start_iteration": start,
            "final_test_accuracy": accuracy, "final_test_loss": test_loss,
            "verify_max_rel_diff": verify_max if (t.verify_every and self.stateful) else None})

    def conv_optimizers(self, model: SplitCNN, momentum: Optional[List[Dict[str, torch.Tensor]]]
                        ) -> List[torch.optim.Optimizer]:
        """Return rank 0's optimizers of the conv layers: none, DEU workers update them."""
        return []

    def install_state(self, model: SplitCNN, codings: List[LayerCoding], states: Dict[int, torch.Tensor],
                      verify: bool) -> List[Dict[str, torch.Tensor]]:
        """Decode conv weights (and momentum) from k workers into the server's model."""
        shapes = worker_state_shapes(codings, self.code)
        per_worker = {j: unflatten(s, shapes) for j, s in states.items()}
        chosen = dict(itertools.islice(per_worker.items(), self.k))
        layers = decode_conv_state(self.code, codings, chosen)
        if verify:
            other = dict(itertools.islice(per_worker.items(), 1, self.k + 1))
            again = decode_conv_state(self.code, codings, other)
            diffs = [rel_diff(a[key], b[key]) for a, b in zip(layers, again) for key in ("weight", "bias")]
            diffs += [rel_diff(a["col_weight"], a["weight"]) for a in layers if a["col_weight"] is not None]
            self.last_verify = max(diffs)
        with torch.no_grad():
            for block, layer in zip(model.conv_blocks, layers):
                block.conv.weight.copy_(layer["weight"])
                block.conv.bias.copy_(layer["bias"])
        return layers

def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Return max |a - b| relative to max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def worker_state_shapes(codings: List[LayerCoding], code: Code) -> List[torch.Size]:
    """Return the shapes of a worker's `CodedWorker.state()` tensors (each tensor, then its momentum)."""
    shapes = []
    for c in codings:
        row = torch.Size(c.row_shape(code))
        shapes += [row, row, torch.Size(row[:1]), torch.Size(row[:1])]
        if c.has_column_copy:
            shapes += [torch.Size(c.col_shape(code))] * 2
    return shapes


class CodedWorkerRank:
    """Rank j+1 of a coded scheme: worker j (DEU: holds and updates its coded weights)."""

    stateful = True

    def __init__(self, cfg: Config, code: Code, roles: Any, transport: Any, peers: Any):
        from psframework.comm import Stragglers, StragglerSpec

        self.cfg, self.code, self.roles, self.transport, self.peers = cfg, code, roles, transport, peers
        self.j = roles.worker_index
        self.n, self.k = code.n, code.k
        self.dissemination = Dissemination(cfg.comm.dissemination, self.n, self.k)
        self.stragglers = Stragglers(StragglerSpec.from_config(cfg.stragglers), list(roles.workers))
        self.stats = WorkerStats()

    def run(self) -> None:
        cfg = self.cfg
        model = worker_model(cfg)
        codings = layer_codings(model, self.k, cfg.code.symbol_channels)
        shapes = activation_shapes(model, cfg.data.batch_size)
        self.shapes = shapes
        # The server owns the data; it tells the workers where the run starts and ends.
        start, total, per_epoch = self.roles.comm.bcast(None, root=0)
        self.total = total
        plan = list(command_plan(cfg, len(codings), start, total, per_epoch, stateful=self.stateful))
        self.model, self.codings = model, codings
        from psframework.comm import Mailbox

        # Every message from the server is taken off the wire as it comes, even while this worker
        # lags behind: the server's queues never fill up, and a waiting command marks stale work.
        self.inbox = Mailbox(self.transport, 0)
        self.worker: Optional[CodedWorker] = None
        for i, cmd in enumerate(plan):
            nxt = plan[i + 1] if i + 1 < len(plan) else None
            if self.peers is not None:
                self.peers.progress()  # let peers' late packets drain and this worker's sends finish
            if cmd.kind == INIT:
                flat = self.inbox.take(envelope(cmd))
                self.worker = self.init_worker(model, codings, flat)
            elif cmd.kind in (FORWARD, BACKWARD):
                x = self.receive(cmd, shapes[(cmd.kind, cmd.layer)])
                want = cmd.kind == FORWARD or codings[cmd.layer].has_column_copy
                stale = want and nxt is not None and self.inbox.has(self.command_envelopes(nxt)[0])
                t0 = time.perf_counter()
                out = self.compute(cmd, x, reply=not stale)
                compute_s = time.perf_counter() - t0
                if out is not None:
                    self.stats.values["delay_s"] += self.delay(cmd.iteration, compute_s)
                    # Let the reply leave before computing on: a large message needs this rank's progress.
                    self.transport.isend(0, out.contiguous(), envelope(cmd, reply=True)).wait()
                    self.stats.sent()
                elif want:
                    self.stats.skipped()
                t1 = time.perf_counter()
                self.after_reply(cmd, x)  # updates come after the reply: off the server's critical path
                update_s = time.perf_counter() - t1
                # A straggler is slow at everything it computes, its updates included.
                self.stats.values["delay_s"] += self.delay(cmd.iteration, update_s)
                self.stats.values["compute_s"] += compute_s + update_s
            elif cmd.kind == STATE:
                self.inbox.take(envelope(cmd))
                self.transport.isend(0, flatten(self.worker.state()), envelope(cmd, reply=True))
            else:  # STOP
                answer_stop(self.inbox, self.transport, cmd.iteration, self.stats)
        self.inbox.close()
        if self.peers is not None:
            self.peers.close(timeout_s=1.0)
        self.transport.close(timeout_s=1.0)

    def delay(self, iteration: int, compute_s: float) -> float:
        """Sleep as an injected straggler would; keep messages moving meanwhile (only compute is slow)."""
        moving = [self.inbox.progress, self.transport.progress] + ([self.peers.progress] if self.peers else [])
        return straggle(self.stragglers, self.roles.rank, iteration, compute_s, moving)

    def compute(self, cmd: Command, x: torch.Tensor, reply: bool) -> Optional[torch.Tensor]:
        """Return the reply to a forward or backward command (None when skipped); apply updates."""
        if cmd.kind == FORWARD:
            return self.worker.on_forward(cmd.layer, x, reply=reply)
        return self.worker.on_backward(cmd.layer, x, reply=reply)

    def after_reply(self, cmd: Command, x: torch.Tensor) -> None:
        """Apply a backward command's update (every one, in order, even when the reply was skipped).

        Stateless workers (naive scheme) have nothing to update: rank 0 owns the weights.
        """
        if self.stateful and cmd.kind == BACKWARD:
            coded = not self.codings[cmd.layer].has_column_copy
            scale_lr([self.worker.optimizers[cmd.layer]], lr_factor(self.cfg, cmd.iteration, self.total))
            self.worker.update(cmd.layer, x, coded=coded)
            self.stats.values["updates"] += 1

    def command_envelopes(self, cmd: Command) -> list:
        """Return the envelopes of the messages the server sends for a command."""
        return [envelope(cmd)]

    def coded_packet(self, cmd: Command) -> bool:
        """Return whether the server sends this worker its own coded packet (not the whole tensor)."""
        return self.stateful and cmd.kind == BACKWARD and not self.codings[cmd.layer].has_column_copy

    def init_worker(self, model: SplitCNN, codings: List[LayerCoding], flat: torch.Tensor) -> CodedWorker:
        """Encode this worker's packets of the uncoded conv state the server sent (weights, momentum)."""
        state = unflatten(flat, conv_state_shapes(model))
        t = self.cfg.train
        weights, buffers = [], []
        for layer, coding in enumerate(codings):
            w, b, mw, mb = state[4 * layer:4 * layer + 4]
            weights.append(encode_layer(coding, self.code, w, b, self.j)[0])
            buffers.append(encode_layer(coding, self.code, mw, mb, self.j)[0])
        worker = CodedWorker(self.j, self.code, codings, weights, t.lr, t.momentum, t.nesterov, t.weight_decay)
        if t.momentum > 0:
            for opt, w, m in zip(worker.optimizers, weights, buffers):
                for tensor, buf in zip(w.tensors(), m.tensors()):
                    opt.state[tensor]["momentum_buffer"] = buf.clone()
        return worker

    def receive(self, cmd: Command, shape: Sequence[int]) -> torch.Tensor:
        """Receive a layer's input (forward) or output gradient (backward), directly or relayed."""
        from psframework.comm import exchange_shards

        data = self.inbox.take(envelope(cmd))
        if self.peers is None or self.coded_packet(cmd):
            return data
        out = {peer: torch.empty_like(data) for peer in range(self.n) if peer != self.j}
        shards = exchange_shards(self.peers, data, envelope(cmd, shard=True), out, self.k)
        packets = {j: shards.received.data[j] for j in shards.received.arrived[:self.k]}
        # The packets sent to peers stay alive in their send handles: no need to wait for them here.
        return self.dissemination.restore(packets, shape, torch.float32)


def expected_server_bytes(cfg: Config, model: SplitCNN) -> Tuple[int, int]:
    """Return the payload bytes rank 0 sends and receives per iteration of sazd, poly or uncoded: (sent, received).

    Per conv layer: the input to every worker (a whole tensor, or with relay one packet of its bits)
    and every worker's row-coded output; backward, the output gradient to every worker (the first
    layer: worker j's own packet of it) and every worker's column-coded input gradient. Every reply
    is counted, also those that come after the first k (they are received, then dropped).
    """
    code = make_code(cfg)
    n, batch = code.n, cfg.data.batch_size
    codings = layer_codings(model, code.k, cfg.code.symbol_channels)
    shapes = activation_shapes(model, batch)

    def delivered(shape: Sequence[int]) -> int:
        numel = math.prod(shape)
        if cfg.comm.dissemination == "relay":
            return code.packet_length(-(-numel // code.k), 1)
        return numel

    sent = received = 0
    for layer, c in enumerate(codings):
        x, y = shapes[(FORWARD, layer)], shapes[(BACKWARD, layer)]
        rows = batch * c.packet_channels(code, c.out_channels) * y[2] * y[3]
        sent += n * delivered(x)
        received += n * rows
        if c.has_column_copy:
            sent += n * delivered(y)
            received += n * batch * c.packet_channels(code, c.in_channels) * x[2] * x[3]
        else:
            sent += n * rows
    return 4 * sent, 4 * received


def activation_shapes(model: SplitCNN, batch: int) -> Dict[tuple, tuple]:
    """Return the shape of each conv layer's input (forward) and output gradient (backward)."""
    shapes = {}
    x = torch.zeros(batch, model.in_channels, model.input_size, model.input_size)
    with torch.no_grad():
        for layer, block in enumerate(model.conv_blocks):
            shapes[(FORWARD, layer)] = tuple(x.shape)
            y = block.conv(x)
            shapes[(BACKWARD, layer)] = tuple(y.shape)
            x = block.post(y)
    return shapes
