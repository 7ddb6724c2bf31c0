"""torchvision's ResNet-18 without BatchNorm: data-parallel BatchNorm sees shards, so only this variant's
data-parallel runs can equal the single-process trainer (tests/test_vision.py)."""

from __future__ import annotations

from typing import Any

from torch import nn


def resnet18(**kwargs: Any) -> nn.Module:
    """Return torchvision.models.resnet18 with every BatchNorm an identity (nn.Identity takes any arguments)."""
    from torchvision.models import resnet18 as torchvision_resnet18

    return torchvision_resnet18(norm_layer=nn.Identity, **kwargs)
