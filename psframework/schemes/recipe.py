"""How every scheme computes a step's loss: label smoothing and mixed-precision autocast, in one place.

The reference trainer, rank 0 of every scheme and the data-parallel workers call these, so a
setting means the same computation wherever the layers run.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager, Union

import torch
import torch.nn.functional as F

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def training_loss(scores: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0,
                  reduction: str = "mean") -> torch.Tensor:
    """Return the cross-entropy the optimizers minimise, with label smoothing, computed in float32."""
    return F.cross_entropy(scores.float(), labels, reduction=reduction, label_smoothing=smoothing)


def compute_dtype(precision: str) -> torch.dtype:
    """Return the dtype layers compute in under a `train.precision`."""
    return PRECISIONS[precision]


def autocast(precision: str, device: Union[str, torch.device]) -> ContextManager[None]:
    """Return the block in which this rank's layers compute in `precision` (nothing changes for fp32)."""
    if precision == "fp32":
        return nullcontext()
    kind = torch.device(device).type
    return torch.autocast(device_type=kind, dtype=PRECISIONS[precision])
