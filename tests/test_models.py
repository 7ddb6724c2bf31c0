"""Model families and their conv-stack / head split."""

from __future__ import annotations

import pytest
import torch

from psframework.cli import main
from psframework.config import load_config
from psframework.models import build_model, model_summary


@pytest.mark.parametrize("name,in_channels", [("lenet5", 1), ("vgg-small", 3), ("alexnet-small", 3)])
@pytest.mark.parametrize("batch_norm", [False, True])
def test_conv_stack_then_head_equals_whole_model(name, in_channels, batch_norm):
    cfg = load_config(None, [f"model.name={name}", f"model.batch_norm={str(batch_norm).lower()}"])
    torch.manual_seed(0)
    model = build_model(cfg.model, in_channels, 10).eval()
    x = torch.randn(4, in_channels, model.input_size, model.input_size)
    features = x
    for block in model.conv_blocks:
        features = block.post(block.conv(features))
    assert features.shape[1:] == model.feature_shape
    assert torch.equal(model.head(features), model(x))
    conv_ids = {id(p) for p in model.conv_parameters()}
    head_ids = {id(p) for p in model.head_parameters()}
    assert not conv_ids & head_ids
    assert len(conv_ids) + len(head_ids) == len(list(model.parameters()))


def test_widths_are_configurable_and_checked():
    cfg = load_config(None, ["model.name=vgg-small", "model.channels=[8,8,16,16]", "model.fc=[64]"])
    model = build_model(cfg.model, 3, 10)
    assert [b.conv.out_channels for b in model.conv_blocks] == [8, 8, 16, 16]
    assert model.head[-1].in_features == 64
    with pytest.raises(ValueError, match="has 4 conv layers"):
        build_model(load_config(None, ["model.name=vgg-small", "model.channels=[8]"]).model, 3, 10)
    with pytest.raises(ValueError, match="too small"):
        build_model(load_config(None, ["model.name=alexnet-small", "model.input_size=6"]).model, 3, 10)


def test_vgg_small_keeps_most_parameters_in_the_head():
    model = build_model(load_config(None, ["model.name=vgg-small"]).model, 3, 10)
    rows = model_summary(model)
    conv = sum(r["params"] for r in rows if r["part"].startswith("conv"))
    total = sum(r["params"] for r in rows)
    assert total == sum(p.numel() for p in model.parameters())
    assert conv / total < 0.1


def test_model_info_command(capsys, configs_dir):
    assert main(["model-info", f"{configs_dir}/digits_reference.yaml"]) == 0
    out = capsys.readouterr().out
    assert "conv1 5x5 +pool2" in out and "fc" in out and "total 61,706" in out
