"""Coded model-parallel arithmetic, in one process, against the reference trainer."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from psframework.codes import PolyCode, SAZDCode, UncodedCode
from psframework.config import load_config
from psframework.models import build_model
from psframework.schemes.coded_core import CodedServer, CodedWorker, decode_conv_state, encode_worker_weights
from psframework.schemes.coded_layers import layer_codings
from psframework.schemes.common import conv_optimizer, head_optimizer, make_optimizer
from psframework.settings import make_settings


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


def train_both(code, overrides, iterations=12):
    cfg = load_config(None, ["train.momentum=0.9", "train.weight_decay=0.001", "train.lr=0.05"] + overrides)
    torch.manual_seed(0)
    reference = build_model(cfg.model, 3, 10)
    torch.manual_seed(0)
    model = build_model(cfg.model, 3, 10)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    optim = make_settings(cfg).optim
    ref_opts = [conv_optimizer(optim, reference.conv_parameters()), head_optimizer(optim, reference.head_parameters())]

    codings = layer_codings(model, code.k, cfg.code.symbol_channels)
    t = cfg.train
    workers = [CodedWorker(j, code, codings, encode_worker_weights(model, code, codings, j),
                           t.lr, t.momentum, t.nesterov, t.weight_decay) for j in range(code.n)]
    bn = [p for b in model.conv_blocks if b.bn is not None for p in b.bn.parameters()]
    post = make_optimizer(bn, "sgd", t.lr, t.momentum, t.nesterov, t.weight_decay) if bn else None
    server = CodedServer(model, code, codings, [head_optimizer(optim, model.head_parameters()), post])
    exchange = LocalExchange(workers, code.k)
    gen = torch.Generator().manual_seed(1)
    size = model.input_size
    for _ in range(iterations):
        x = torch.randn(8, 3, size, size, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        for o in ref_opts:
            o.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        for o in ref_opts:
            o.step()
        loss = server.step(x, y, exchange)
        assert abs(loss - float(ref_loss.detach())) <= 1e-4 * max(1.0, abs(float(ref_loss.detach())))
    return reference, model, workers, codings


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


# BatchNorm on tiny random batches amplifies rounding differences after some iterations (a max-pool
# tie flips): that case runs fewer iterations.
@pytest.mark.parametrize("code,overrides,iterations", [
    (SAZDCode(4, 3), ["model.name=lenet5"], 12),
    (SAZDCode(5, 3, systematic=False), ["model.name=lenet5", "train.nesterov=true"], 12),
    (SAZDCode(5, 2), ["model.name=vgg-small", "model.channels=[6,8,10,8]", "model.fc=[32]",
                      "model.batch_norm=true", "code.symbol_channels=2"], 6),
    (PolyCode(4, 3), ["model.name=lenet5"], 12),
    (UncodedCode(3), ["model.name=lenet5"], 12),
])
def test_coded_training_matches_reference(code, overrides, iterations):
    reference, model, workers, codings = train_both(code, overrides, iterations)
    # Decode from two different k-subsets: both must give the reference's conv weights.
    for subset in (range(code.k), range(code.n - code.k, code.n)):
        layers = decode_conv_state(code, codings, {j: workers[j].state() for j in subset})
        for layer, block in zip(layers, reference.conv_blocks):
            assert rel_err(layer["weight"], block.conv.weight.detach()) < 1e-4
            assert rel_err(layer["bias"], block.conv.bias.detach()) < 1e-4
            if layer["col_weight"] is not None:
                assert rel_err(layer["col_weight"], block.conv.weight.detach()) < 1e-4
    for a, b in zip(model.head.parameters(), reference.head.parameters()):
        assert rel_err(a.detach(), b.detach()) < 1e-4
    for a, b in zip(model.conv_blocks, reference.conv_blocks):
        if a.bn is not None:
            assert rel_err(a.bn.weight.detach(), b.bn.weight.detach()) < 1e-4
            assert rel_err(a.bn.running_mean, b.bn.running_mean) < 1e-4
