"""How every scheme computes a step's loss: label smoothing and mixed-precision autocast, in one place.

The reference trainer, rank 0 of every scheme and the data-parallel workers call these, so a
setting means the same computation wherever the layers run.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterable, Optional, Sequence, Union

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


def finite(tensors: Iterable[Optional[torch.Tensor]]) -> bool:
    """Return whether every value of the tensors (None: absent) is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t is not None)


def unscale(tensors: Iterable[Optional[torch.Tensor]], scale: float) -> None:
    """Divide gradients (None: absent) in place by the loss scale they were computed with."""
    if scale == 1.0:
        return
    for t in tensors:
        if t is not None:
            t.mul_(1.0 / scale)


@dataclass
class LossScaler:
    """A dynamic loss scale, kept the same on every rank that needs it.

    The loss is multiplied by `scale` before the backward pass so that small fp16 gradients do not
    vanish; an optimizer step whose gradients hold an inf or a NaN is skipped and the scale halved,
    and after `window` steps in a row without one the scale doubles (torch's GradScaler does the
    same). Scales are powers of two, so scaling and unscaling change no bit of a finite gradient.
    Disabled, the scale is 1 and every step is taken.
    """

    enabled: bool = False
    scale: float = 2.0 ** 16
    window: int = 2000
    good: int = 0  # steps taken since the scale last changed

    @classmethod
    def of(cls, optim: Any) -> "LossScaler":
        """Return the scaler of an OptimSettings (`loss_scale`, `loss_scale_power`, `loss_scale_window`)."""
        return cls(optim.loss_scale == "dynamic", 2.0 ** optim.loss_scale_power, optim.loss_scale_window)

    @property
    def factor(self) -> float:
        """Return what the loss is multiplied by (1 when disabled)."""
        return self.scale if self.enabled else 1.0

    def update(self, found_inf: bool) -> bool:
        """Record an optimizer step's outcome; return whether the step is taken."""
        if not self.enabled:
            return True
        if found_inf:
            self.scale, self.good = self.scale / 2, 0
            return False
        self.good += 1
        if self.good == self.window:
            self.scale, self.good = self.scale * 2, 0
        return True

    def unscale(self, tensors: Iterable[Optional[torch.Tensor]], scale: Optional[float] = None) -> None:
        """Divide gradients in place by the scale they were computed with (the current one by default)."""
        unscale(tensors, self.factor if scale is None else scale)

    def state_dict(self) -> Dict[str, float]:
        """Return the scale and the steps since it last changed (for a checkpoint)."""
        return {"scale": self.scale, "good": self.good}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        """Restore the scale from a checkpoint."""
        self.scale, self.good = float(state["scale"]), int(state["good"])


def step_scaled(scaler: LossScaler, optimizers: Sequence[torch.optim.Optimizer], found_inf: bool = False,
                agree: Callable[[bool], bool] = bool) -> bool:
    """End an optimizer step: skip it if any gradient the optimizers hold (or, `found_inf`, elsewhere) is not
    finite, else unscale the gradients and step; return whether the step was taken.

    `agree` turns this rank's finding into every server's (Group.any), so all of them decide alike.
    """
    grads = [p.grad for opt in optimizers for group in opt.param_groups for p in group["params"]]
    used = scaler.factor
    if scaler.enabled:
        found_inf = agree(found_inf or not finite(grads))
    if not scaler.update(found_inf):
        return False
    scaler.unscale(grads, used)
    for opt in optimizers:
        opt.step()
    return True
