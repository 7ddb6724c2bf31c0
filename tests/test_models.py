"""Built-in models, models from factories, and where each of their parts runs."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from psframework.cli import main
from psframework.errors import ConfigError
from psframework.models import FAMILIES, build_model, input_size_of, place, split_parameters
from psframework.models.cut import cut_model
from psframework.schemes.coded.plan import backward_order
from psframework.schemes.validate import load_run


def built(name, *overrides, in_channels=3):
    cfg = load_run(None, [f"model.name={name}", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg.model, in_channels, 10)
    size = input_size_of(cfg.model)
    return model, place(model, (in_channels, size, size), cfg.model.split_at, name), size


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_built_in_model_is_placed_and_cut_exactly(name):
    model, placement, size = built(name, "model.input_size=32" if name != "lenet5" else "model.input_size=28")
    model.eval()
    assert placement.output_shape == (10,)
    assert placement.coded and not placement.on_server
    # Every backward pass runs once, and the layer on the images needs no input gradient.
    assert sorted(backward_order(model, placement)) == list(range(len(placement.coded)))
    assert [c.needs_input_grad for c in placement.coded] == [False] + [True] * (len(placement.coded) - 1)
    cut = cut_model(model, placement, name)
    x = torch.randn(3, 3, size, size)
    assert torch.equal(cut.head(cut.trunk(x)), model(x))
    trunk, head = split_parameters(model, placement)
    assert {id(p) for p in cut.head.parameters()} == {id(p) for p in head}
    assert len(trunk) + len(head) == len(list(model.parameters()))


def test_resnets_have_batch_norm_residual_shortcuts_and_global_pooling():
    model, placement, _ = built("resnet20", "model.input_size=16")
    kinds = {c.kind for c in placement.calls}
    assert {"BatchNorm2d", "AdaptiveAvgPool2d", "Linear"} <= kinds
    shortcuts = [c for c in placement.coded if "shortcut" in c.name]
    assert len(shortcuts) == 2 and all(c.geometry.kernel == (1, 1) and c.geometry.stride == (2, 2) for c in shortcuts)
    assert len(placement.coded) == 21 and sum(p.numel() for p in model.parameters()) == 272_474
    free, _, _ = built("resnet20", "model.input_size=16", "model.batch_norm=false")
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in free.modules())
    _, placement18, _ = built("resnet18", "model.input_size=16")
    assert len(placement18.coded) == 20


def test_widths_are_configurable_and_checked():
    model, placement, _ = built("vgg-small", "model.channels=[8,8,16,16]", "model.fc=[64]")
    assert [c.geometry.out_channels for c in placement.coded] == [8, 8, 16, 16]
    assert model.head[-1].in_features == 64
    with pytest.raises(ConfigError, match="model.channels: got 1 values"):
        load_run(None, ["model.name=vgg-small", "model.channels=[8]"])
    with pytest.raises(ConfigError, match="too small"):
        load_run(None, ["model.name=alexnet-small", "model.input_size=6"])
    with pytest.raises(ConfigError, match="model.channels: got 2 widths"):
        load_run(None, ["model.name=resnet20", "model.channels=[8,8]"])


def test_vgg_small_keeps_most_parameters_in_the_head():
    model, placement, _ = built("vgg-small")
    head = sum(p.numel() for p in split_parameters(model, placement)[1])
    assert head / sum(p.numel() for p in model.parameters()) > 0.9


def test_split_at_moves_the_cut_and_is_checked():
    model, placement, _ = built("vgg-small", "model.split_at=head")
    assert placement.calls[placement.cut].name == "head.0"  # the Flatten now runs on rank 0
    assert cut_model(model, placement).feature_shape == (128, 4, 4)
    with pytest.raises(ConfigError, match="model.split_at: got 'nope', model vgg-small has no module"):
        built("vgg-small", "model.split_at=nope")
    model, placement, _ = built("resnet20", "model.split_at=layers.1.1.conv2", "model.input_size=8")
    with pytest.raises(ConfigError, match="values crossing the cut"):
        cut_model(model, placement)  # inside a residual block: the shortcut crosses too


FACTORY = '''
import torch
from torch import nn

class Tiny(nn.Module):
    def __init__(self, in_channels, num_classes, width=4):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))

def tiny(in_channels, num_classes, width=4):
    return Tiny(in_channels, num_classes, width)

def wrong_classes(in_channels, num_classes):
    return Tiny(in_channels, num_classes + 1)

def not_a_module():
    return 42

def no_conv(num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

class Branchy(Tiny):
    def forward(self, x):
        h = self.conv(x)
        if h.sum() > 0:
            h = h * 2
        return self.fc(h.mean(dim=(2, 3)))

def branchy(in_channels, num_classes):
    return Branchy(in_channels, num_classes)
'''


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    name = f"user_models_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_factory_model_gets_the_dataset_shape_and_its_args(factory_module):
    cfg = load_run(None, [f"model.name={factory_module}:tiny", "model.args={width: 6}"])
    model = build_model(cfg.model, 1, 10)
    assert model.conv.in_channels == 1 and model.conv.out_channels == 6 and model.fc.out_features == 10


@pytest.mark.parametrize("target,overrides,phrase", [
    ("nosuchpackage.models:net", [], "does not import: ModuleNotFoundError"),
    ("{m}:missing", [], "has no attribute 'missing'"),
    ("{m}:not_a_module", [], "returned a int, expected a torch.nn.Module"),
    ("{m}:wrong_classes", [], "returns (11,) scores per sample, expected (10,)"),
    ("{m}:no_conv", ["scheme=sazd"], "has no convolution that scheme sazd can code"),
    ("{m}:branchy", ["scheme=stanza"], "torch.fx cannot trace it"),
    ("{m}:tiny", ["scheme=stanza", "model.split_at=fcc"], "model.split_at: got 'fcc'"),
    ("{m}:tiny", ["model.channels=[4]"], "model.channels: applies to built-in models only"),
    ("lenet5", ["model.args={width: 3}"], "model.args: got {'width': 3}"),
])
def test_bad_models_are_one_line_errors(factory_module, target, overrides, phrase):
    with pytest.raises(ConfigError) as err:
        load_run(None, [f"model.name={target.format(m=factory_module)}", "code.n=3", "code.k=2", *overrides])
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_model_info_command(capsys, configs_dir):
    assert main(["model-info", f"{configs_dir}/digits_reference.yaml"]) == 0
    out = capsys.readouterr().out
    assert "conv_blocks.1.conv" in out and "16x6x5x5" in out and "total 61,706" in out
    assert "stanza cut: before 'head.1'" in out
    argv = ["model-info", f"{configs_dir}/digits_reference.yaml", "model.name=resnet20", "model.input_size=8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "layers.2.0.shortcut.0" in out and "BatchNorm2d x21" in out


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    (2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 0, 1, True), (2, 1, 0, 1, False), (3, 3, 1, 2, False)])
def test_fast_pooling_gives_torchs_values_and_gradients_bit_for_bit(kernel, stride, padding, dilation, ceil_mode):
    from torch import nn

    from psframework.models.pooling import use_fast_pooling

    torch.manual_seed(0)
    plain = nn.Sequential(nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode=ceil_mode))
    fast = use_fast_pooling(nn.Sequential(nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode=ceil_mode)))
    ties = torch.randint(0, 3, (4, 5, 12, 12)).float()  # many windows with several maxima
    nans = torch.randn(4, 5, 13, 11)
    nans[0, 0, 0, 0] = nans[1, 2, 3, 3] = nans[1, 2, 3, 4] = float("nan")
    for x in (torch.randn(4, 5, 13, 11), torch.randn(4, 5, 13, 11).relu(), ties, nans):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = plain(a), fast(b)
        assert torch.equal(ya.isnan(), yb.isnan()) and torch.equal(ya.nan_to_num(), yb.nan_to_num())
        grad = torch.randn_like(ya)
        ya.backward(grad)
        yb.backward(grad)
        assert torch.equal(a.grad.isnan(), b.grad.isnan()) and torch.equal(a.grad.nan_to_num(), b.grad.nan_to_num())
        assert yb.is_contiguous()
