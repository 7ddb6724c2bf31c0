"""Coded model-parallel arithmetic, in one process, against the reference trainer."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from psframework.codes import PolyCode, SAZDCode, UncodedCode
from psframework.models import build_model, input_size_of, place, split_parameters
from psframework.schemes.coded.core import DecodingServer, EncodingWorker
from psframework.schemes.coded.layers import layer_codings
from psframework.schemes.coded.plan import command_plan
from psframework.schemes.coded.state import conv_state_tensors, decode_conv_state
from psframework.schemes.common import conv_optimizer, head_optimizer, make_optimizer
from psframework.schemes.groups import SoleServer
from psframework.schemes.validate import load_run, make_settings
from psframework.schemes.vectors import pack


class LocalExchange:
    """Deliver tensors to in-process workers; decode from a different k-subset every round."""

    def __init__(self, workers, k):
        self.workers = workers
        self.subsets = itertools.cycle(list(itertools.combinations(range(len(workers)), k))[::-1])

    def _round(self, call, layer, tensor, want_reply=True):
        used = set(next(self.subsets))
        replies = {}
        for w in self.workers:
            out = call(w)(layer, tensor.clone(), reply=want_reply and w.j in used)
            if out is not None:
                replies[w.j] = out
        return replies

    def forward(self, layer, x):
        return self._round(lambda w: w.on_forward, layer, x)

    def backward(self, layer, dy, want_reply):
        replies = self._round(lambda w: w.on_backward, layer, dy, want_reply)
        for w in self.workers:
            if w.codings[layer].has_column_copy:
                w.update(layer, dy.clone())
            else:  # a layer without a column copy is updated from the worker's packet of dY
                w.update(layer, w.codings[layer].encode_one(w.code, dy, 1, w.j), coded=True)
        return replies


def train_both(code, overrides, iterations=12, model_fn=None, size=None, channels=3):
    """Train the reference and the coded server side by side on random batches; return both and the workers."""
    cfg = load_run(None, ["train.momentum=0.9", "train.weight_decay=0.001", "train.lr=0.05"] + overrides)
    build = model_fn or (lambda: build_model(cfg.model, 3, 10))
    torch.manual_seed(0)
    reference = build()
    torch.manual_seed(0)
    model = build()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    size = size or input_size_of(cfg.model)
    placement = place(model, (channels, size, size))
    optim = make_settings(cfg).optim
    trunk, head = split_parameters(reference, placement)
    ref_opts = [conv_optimizer(optim, trunk), head_optimizer(optim, head)]

    codings = layer_codings(placement, code.k, cfg.code.symbol_channels)
    t = cfg.train
    state = pack(conv_state_tensors(model, placement.coded_names, None))  # what rank 0 sends at the start
    workers = [EncodingWorker.from_state(j, code, codings, state, optim) for j in range(code.n)]
    coded = placement.worker_parameter_names()
    named = list(model.named_parameters())
    local = [p for key, p in named if key not in coded and key not in placement.head]
    post = make_optimizer(local, "sgd", t.lr, t.momentum, t.nesterov, t.weight_decay) if local else None
    exchange = LocalExchange(workers, code.k)
    plan = command_plan(model, placement, distributed_encoding_and_updating=True)
    server = DecodingServer(model, code, codings, plan,
                            [head_optimizer(optim, [p for key, p in named if key in placement.head]), post], exchange,
                            SoleServer())
    gen = torch.Generator().manual_seed(1)
    for _ in range(iterations):
        x = torch.randn(8, channels, size, size, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        for o in ref_opts:
            o.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        for o in ref_opts:
            o.step()
        loss = server.step(x, y)
        assert abs(loss - float(ref_loss.detach())) <= 1e-4 * max(1.0, abs(float(ref_loss.detach())))
    return reference, model, workers, codings, placement


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


class OddConvs(torch.nn.Module):
    """Convolutions of every kind: strided, dilated, without bias, 'same' padding, 1x1, grouped, reused."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.a = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.b = nn.Conv2d(6, 8, 3, padding="same", dilation=2, bias=False)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.shared = nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(8, 5, (3, 1), padding=(1, 0))
        self.fc = nn.Linear(5 * 4, 10)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        h = h + self.grouped(h)
        h = self.shared(self.shared(h))
        h = torch.nn.functional.avg_pool2d(torch.relu(self.c(h)), 2)
        return self.fc(h.flatten(1))


# BatchNorm on tiny random batches amplifies rounding differences after some iterations (a max-pool
# tie flips): that case runs fewer iterations.
@pytest.mark.parametrize("code,overrides,iterations", [
    (SAZDCode(4, 3), ["model.name=lenet5"], 12),
    (SAZDCode(5, 3, systematic=False), ["model.name=lenet5", "train.nesterov=true"], 12),
    (SAZDCode(5, 2), ["model.name=vgg-small", "model.channels=[6,8,10,8]", "model.fc=[32]",
                      "model.batch_norm=true", "code.symbol_channels=2"], 6),
    (PolyCode(4, 3), ["model.name=lenet5"], 12),
    (UncodedCode(3), ["model.name=lenet5"], 12),
    (SAZDCode(4, 2), ["model.name=resnet20", "model.channels=[4,6,8]", "model.input_size=8"], 4),
])
def test_coded_training_matches_reference(code, overrides, iterations):
    check_against_reference(code, *train_both(code, overrides, iterations))


def test_every_kind_of_convolution_is_coded_or_runs_on_rank_0():
    code = SAZDCode(4, 2)
    result = train_both(code, [], 8, model_fn=OddConvs, size=8)
    placement = result[-1]
    assert placement.coded_names == ("a", "b", "c")
    assert set(placement.on_server) == {"grouped", "shared"}
    assert "groups=2" in placement.on_server["grouped"] and "2 times" in placement.on_server["shared"]
    check_against_reference(code, *result)


def check_against_reference(code, reference, model, workers, codings, placement):
    """Decode the workers' weights from two k-subsets and compare everything with the reference."""
    modules = dict(reference.named_modules())
    for subset in (range(code.k), range(code.n - code.k, code.n)):
        layers = decode_conv_state(code, codings, {j: workers[j].state() for j in subset})
        for layer, name in zip(layers, placement.coded_names):
            conv = modules[name]
            assert rel_err(layer["weight"], conv.weight.detach()) < 1e-4
            if conv.bias is not None:
                assert rel_err(layer["bias"], conv.bias.detach()) < 1e-4
            if layer["col_weight"] is not None:
                assert rel_err(layer["col_weight"], conv.weight.detach()) < 1e-4
    coded = placement.worker_parameter_names()
    ours = dict(model.named_parameters())
    for key, b in reference.named_parameters():
        if key not in coded:
            assert rel_err(ours[key].detach(), b.detach()) < 1e-4, key
    buffers = dict(model.named_buffers())
    for key, b in reference.named_buffers():
        if b.is_floating_point():
            assert rel_err(buffers[key], b) < 1e-4, key


def test_an_update_waits_until_the_worker_has_time_and_is_then_exact():
    import copy

    *_, workers, codings, placement = train_both(SAZDCode(4, 3), ["model.name=lenet5"], 2)
    layer = 1  # a layer with a column copy: two pieces of work, then the step
    eager, lazy, half = (copy.deepcopy(workers[2]) for _ in range(3))
    x = torch.randn(8, codings[layer].in_channels, 12, 12, generator=torch.Generator().manual_seed(3))
    for w in (eager, lazy, half):
        w.on_forward(layer, x)
    dy = torch.randn(8, codings[layer].out_channels, 8, 8, generator=torch.Generator().manual_seed(4))
    before = [t.clone() for t in lazy.weights[layer].tensors()]
    eager.update(layer, dy)
    eager.settle(layer)
    lazy.update(layer, dy)
    assert lazy.has_update(layer) and all(torch.equal(a, b) for a, b in zip(before, lazy.weights[layer].tensors()))
    assert lazy.work(layer) is True  # the row copy's gradients: the column copy's are left
    assert all(torch.equal(a, b) for a, b in zip(before, lazy.weights[layer].tensors()))
    assert lazy.work(layer) is False and not lazy.has_update(layer)
    assert all(torch.equal(a, b) for a, b in zip(eager.weights[layer].tensors(), lazy.weights[layer].tensors()))
    # The iteration's learning-rate factor goes with the update: half the rate, half the step.
    half.update(layer, dy, lr_factor=0.5)
    half.settle()
    for b, e, h in zip(before, eager.weights[layer].tensors(), half.weights[layer].tensors()):
        assert torch.allclose(b - h, 0.5 * (b - e), rtol=1e-3, atol=1e-8)
