"""Measure a config's pieces of work on this machine, one at a time in one process (`psf plan calibrate`).

Each piece runs the code the schemes run (the model's forward and backward, its trunk and head, a
coded worker's packet of each convolution, decoding, relay coding, an optimizer step) at a few sizes,
and the median of several repeats becomes a point of an affine fit. Nothing else runs meanwhile, so
the figures are those of one rank with a core (or `threads` cores) of its own. Link figures come from
a ping-pong between two ranks (psframework.netcluster.pingpong), or from the user.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from psframework.codes import SAZDCode
from psframework.models.cut import cut_model
from psframework.plan.profile import ConvLayer, Fit, Link, Profile
from psframework.data.registry import dataset_shape
from psframework.schemes.common import input_shape, make_optimizer, new_model, placement_of
from psframework.schemes.coded.core import EncodingWorker
from psframework.schemes.coded.dissemination import RelayDissemination
from psframework.schemes.coded.layers import layer_codings
from psframework.schemes.coded.plan import backward_order
from psframework.schemes.coded.state import conv_state_tensors
from psframework.schemes.data_parallel import running_stats
from psframework.schemes.vectors import pack
from psframework.settings import CodeSettings, Settings

KS = (1, 2, 3, 4, 6)  # codes of the coded pieces: k data packets, n = k + 1


def median_time(work: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Return the median seconds of `work` over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        work()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sample_counts(batch: int) -> List[int]:
    """Return the batch shares the per-sample pieces are timed at."""
    return sorted({max(1, batch // 8), max(1, batch // 4), max(1, batch // 2), batch})


class Calibration:
    """The pieces of one config's iteration, timed one by one."""

    def __init__(self, settings: Settings, repeats: int = 5) -> None:
        self.settings, self.repeats = settings, repeats
        self.shape = input_shape(settings)
        self.classes = dataset_shape(settings.data)[1]  # as the training builds the model: from the dataset
        self.model = new_model(settings, self.shape[0], self.classes)
        self.placement = placement_of(settings, self.model)
        self.batch = settings.data.batch_size

    def time(self, work: Callable[[], object]) -> float:
        return median_time(work, self.repeats)

    def batch_of(self, samples: int) -> Tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(samples)
        return (torch.randn(samples, *self.shape, generator=gen),
                torch.randint(0, self.classes, (samples,), generator=gen))

    def model_step(self) -> Fit:
        """Forward, loss and backward of the whole model (a data-parallel worker, DDP's process)."""
        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            self.model.zero_grad(set_to_none=True)
            F.cross_entropy(self.model(x), y).backward()
        return Fit.of([(s, self.time(lambda: step(*self.batch_of(s)))) for s in sample_counts(self.batch)])

    def cut_pieces(self) -> Tuple[Fit, Fit, Fit, int]:
        """Stanza's pieces: the trunk's forward and backward, the head's forward and backward; feature values."""
        if self.placement.cut is None:
            zero = Fit(0.0, 0.0)
            return zero, zero, zero, 0
        cut = cut_model(self.model, self.placement, self.settings.model.name)
        forward, backward, head = [], [], []
        for s in sample_counts(self.batch):
            x, y = self.batch_of(s)
            forward.append((s, self.time(lambda: cut.trunk(x))))
            features = cut.trunk(x)
            grad = torch.randn_like(features)
            backward.append((s, self.time(lambda: torch.autograd.backward(cut.trunk(x), grad))))
            loose = features.detach().requires_grad_(True)
            head.append((s, self.time(lambda: F.cross_entropy(cut.head(loose), y).backward())))
        values = int(features[0].numel())
        # The backward was timed with the forward it needs: take the forward out.
        return Fit.of(forward), _minus(Fit.of(backward), Fit.of(forward)), Fit.of(head), values

    def optimizer(self) -> Fit:
        """An SGD step (the config's momentum and weight decay) over parameter sets of several sizes."""
        optim = self.settings.optim
        points = []
        params = [p for p in self.model.parameters()]
        for part in (params[: max(1, len(params) // 4)], params[: len(params) // 2 or 1], params):
            for p in part:
                p.grad = torch.randn_like(p)
            opt = make_optimizer(part, "sgd", optim.lr, optim.momentum, optim.nesterov, optim.weight_decay)
            points.append((sum(p.numel() for p in part), self.time(opt.step)))
        return Fit.of(points)

    def add(self) -> Fit:
        """Adding one vector into another (summing workers' gradients)."""
        size = sum(p.numel() for p in self.model.parameters())
        points = []
        for values in (size // 4, size // 2, size):
            a, b = torch.zeros(values), torch.randn(values)
            points.append((values, self.time(lambda: a.add_(b))))
        return Fit.of(points)

    def coded(self) -> Tuple[List[ConvLayer], Fit]:
        """Each coded convolution's worker pieces at several codes, and decoding on rank 0."""
        settings = self.settings
        state = pack(conv_state_tensors(self.model, self.placement.coded_names, None))
        samples: Dict[int, Dict[str, List[Tuple[float, float]]]] = {}
        decode: List[Tuple[float, float]] = []
        for k in KS:
            code = SAZDCode(k + 1, k, systematic=True)
            codings = layer_codings(self.placement, k, settings.code.symbol_size)
            for j in (0, k):  # a systematic worker and the parity worker
                worker = EncodingWorker.from_state(j, code, codings, state, settings.optim)
                self._time_worker(worker, codings, code, samples)
            self._time_decode(codings, code, decode)
        layers = []
        for c, conv, name in zip(layer_codings(self.placement, 1, settings.code.symbol_size), self.placement.coded,
                                 self.placement.coded_names):
            pieces = samples[c.index]
            layers.append(ConvLayer(name, c.in_channels, c.out_channels, _prod(conv.input_shape),
                                    _prod(conv.output_shape), c.has_column_copy, Fit.of(pieces["forward"]),
                                    Fit.of(pieces["input_grad"]), Fit.of(pieces["update"]),
                                    self._uncoded(conv)))
        return layers, Fit.of(decode)

    def _time_worker(self, worker: EncodingWorker, codings: Sequence, code: SAZDCode,
                     samples: Dict[int, Dict[str, List[Tuple[float, float]]]]) -> None:
        gen = torch.Generator().manual_seed(worker.j)
        for c, conv in zip(codings, self.placement.coded):
            x = torch.randn(self.batch, *conv.input_shape, generator=gen)
            dy = torch.randn(self.batch, *conv.output_shape, generator=gen)
            out_ch = self.batch * c.packet_channels(code, c.out_channels)
            in_ch = self.batch * c.packet_channels(code, c.in_channels)
            piece = samples.setdefault(c.index, {"forward": [], "input_grad": [], "update": []})
            piece["forward"].append((out_ch, self.time(lambda: worker.on_forward(c.index, x))))
            if c.has_column_copy:
                piece["input_grad"].append((in_ch, self.time(lambda: worker.on_backward(c.index, dy))))
            else:
                piece["input_grad"].append((in_ch, 0.0))
            packet = dy if c.has_column_copy else c.encode_one(code, dy, 1, worker.j)

            def update() -> None:
                worker.inputs[c.index] = x  # applying an update lets go of the forward's input
                worker.update(c.index, packet, coded=not c.has_column_copy)
                worker.settle(c.index)
            piece["update"].append((out_ch, self.time(update)))

    def _time_decode(self, codings: Sequence, code: SAZDCode, points: List[Tuple[float, float]]) -> None:
        for c, conv in zip(codings, self.placement.coded):
            y = torch.randn(self.batch, c.out_channels, *conv.output_shape[1:])
            packets = c.encode(code, y, 1)
            used = {j: packets[j] for j in range(1, code.k + 1)}  # through the parity packet
            points.append((y.numel(), self.time(lambda: c.decode(code, used, 1, c.out_channels))))

    def _uncoded(self, conv) -> float:
        module = dict(self.model.named_modules())[conv.name]
        x = torch.randn(self.batch, *conv.input_shape, requires_grad=True)

        def both() -> None:
            module.zero_grad(set_to_none=True)
            module(x).sum().backward()
        return self.time(both)

    def relay(self) -> Tuple[Fit, Fit]:
        """Relay's coding of a tensor's bits on rank 0 and its restoring on a worker, by tensor size."""
        enc, dec = [], []
        biggest = max((self.batch * _prod(c.input_shape) for c in self.placement.coded), default=1024)
        for k in (2, 3, 6):
            relay = RelayDissemination(CodeSettings(kind="shift-add", n=k + 1, k=k))
            for values in (biggest // 4, biggest):
                x = torch.randn(values)
                enc.append((values, self.time(lambda: relay.packets(x))))
                packets = dict(enumerate(relay.packets(x)))
                used = {j: packets[j] for j in range(1, k + 1)}
                dec.append((values, self.time(lambda: relay.restore(used, x.shape, x.dtype))))
        return Fit.of(enc), Fit.of(dec)


def _minus(total: Fit, part: Fit) -> Fit:
    return Fit(total.a - part.a, total.b - part.b)


def _prod(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def calibrate(settings: Settings, config: str, links: Dict[str, Link], threads: int = 1, repeats: int = 5,
              say: Callable[[str], None] = print) -> Profile:
    """Time every piece of `settings`' iteration in this process; return the profile."""
    torch.set_num_threads(threads)
    cal = Calibration(settings, repeats)
    model = cal.model
    say(f"psf plan: calibrating {settings.model.name}, batch {cal.batch}, {threads} thread(s): the whole model")
    whole = cal.model_step()
    say("psf plan: the trunk and the head")
    trunk_forward, trunk_backward, head, feature_values = cal.cut_pieces()
    say("psf plan: optimizer steps and sums")
    optimizer, add = cal.optimizer(), cal.add()
    say(f"psf plan: coded convolutions at k = {', '.join(map(str, KS))}")
    layers, decode = cal.coded()
    relay_encode, relay_decode = cal.relay()
    uncoded = sum(layer.uncoded for layer in layers)
    rest = Fit(whole.a, whole.b - uncoded / cal.batch)  # the model but its coded convolutions
    head_names = cal.placement.head
    head_params = sum(p.numel() for name, p in model.named_parameters() if name in head_names)
    params = sum(p.numel() for p in model.parameters())
    return Profile(config=config, model=settings.model.name, batch=cal.batch, machine=machine_words(),
                   threads=threads, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   params=params, head_params=head_params, trunk_params=params - head_params,
                   running_stats=sum(s.numel() for s in running_stats(model)), feature_values=feature_values,
                   model_step=whole, trunk_forward=trunk_forward, trunk_backward=trunk_backward, head_step=head,
                   optimizer=optimizer, add=add, decode=decode, relay_encode=relay_encode,
                   relay_decode=relay_decode, server_rest=rest, layers=layers,
                   backward_order=list(backward_order(model, cal.placement, settings.model.name)), links=dict(links))


def machine_words() -> str:
    """Return the machine in a few words: processor, cores, torch."""
    import os
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
