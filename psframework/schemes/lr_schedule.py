"""The learning-rate schedule: the factor of train.lr at every optimizer step, in closed form.

Each kind equals, step for step, the torch.optim.lr_scheduler that is stepped once per optimizer step
(constant, CosineAnnealingLR, MultiStepLR, StepLR, OneCycleLR), and a warm-up multiplies it by LinearLR as
ChainedScheduler([LinearLR, main]) does. Steps are 1-based: step s is the lr after s - 1 scheduler steps,
so torch's `last_epoch` is `step - 1` throughout. Closed forms keep the factor of any step cheap and free of
torch, so every rank computes the same value without holding a scheduler's state.
"""

from __future__ import annotations

import math
from typing import Callable, Dict

from psframework.errors import ConfigError
from psframework.settings import ScheduleSettings

KINDS = ("constant", "cosine", "multistep", "step", "onecycle")


def warmup_steps(spec: ScheduleSettings, steps_per_epoch: int, accumulate: int = 1) -> int:
    """Return the warm-up's length in optimizer steps (LinearLR's total_iters)."""
    if spec.warmup_unit == "epochs":
        return spec.warmup * steps_per_epoch
    # An optimizer step spans `accumulate` iterations.
    return spec.warmup // accumulate


def _constant(spec: ScheduleSettings, t: int, total_steps: int, steps_per_epoch: int) -> float:
    """Return the constant schedule's factor: 1."""
    return 1.0


def _cosine(spec: ScheduleSettings, t: int, total_steps: int, steps_per_epoch: int) -> float:
    """Return CosineAnnealingLR's factor (eta_min 0) after `t` scheduler steps."""
    return 0.5 * (1.0 + math.cos(math.pi * t / total_steps))


def _multistep(spec: ScheduleSettings, t: int, total_steps: int, steps_per_epoch: int) -> float:
    """Return MultiStepLR's factor after `t` scheduler steps, its milestones in epochs."""
    # MultiStepLR decays once per milestone passed, a repeated one once per occurrence.
    passed = sum(1 for e in spec.milestones if e * steps_per_epoch <= t)
    return spec.gamma ** passed


def _step(spec: ScheduleSettings, t: int, total_steps: int, steps_per_epoch: int) -> float:
    """Return StepLR's factor after `t` scheduler steps, its period in epochs."""
    return spec.gamma ** (t // (spec.step_epochs * steps_per_epoch))


def _anneal_cos(start: float, end: float, pct: float) -> float:
    """Return OneCycleLR's cosine interpolation from `start` to `end` at fraction `pct`."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _onecycle(spec: ScheduleSettings, t: int, total_steps: int, steps_per_epoch: int) -> float:
    """Return two-phase cosine OneCycleLR's factor of max_lr after `t` scheduler steps."""
    # Factors of max_lr (= train.lr); the phase ends are torch's, a float one included, for exact agreement.
    initial = 1.0 / spec.div_factor
    final = initial / spec.final_div_factor
    rise_end = float(spec.pct_start * total_steps) - 1
    fall_end = total_steps - 1
    if t <= rise_end:
        return _anneal_cos(initial, 1.0, t / rise_end)
    return _anneal_cos(1.0, final, (t - rise_end) / (fall_end - rise_end))


_MAIN: Dict[str, Callable[[ScheduleSettings, int, int, int], float]] = {
    "constant": _constant, "cosine": _cosine, "multistep": _multistep, "step": _step, "onecycle": _onecycle,
}


def _warmup_factor(spec: ScheduleSettings, t: int, length: int) -> float:
    """Return LinearLR's factor after `t` scheduler steps of a warm-up `length` steps long."""
    # A warm-up shorter than one optimizer step is none (torch's LinearLR(total_iters=0) would stay at start).
    if length <= 0:
        return 1.0
    start = spec.warmup_start_factor
    return start + (1.0 - start) * min(t, length) / length


def lr_factor(spec: ScheduleSettings, step: int, total_steps: int, steps_per_epoch: int,
              accumulate: int = 1) -> float:
    """Return the multiplier of train.lr at optimizer step `step` (1-based, 1..total_steps)."""
    main = _MAIN.get(spec.kind)
    if main is None:
        raise ConfigError(f"train.lr_schedule: got {spec.kind!r}, expected one of {', '.join(KINDS)}")
    t = step - 1
    factor = main(spec, t, total_steps, steps_per_epoch)
    if spec.warmup > 0:
        factor *= _warmup_factor(spec, t, warmup_steps(spec, steps_per_epoch, accumulate))
    return factor


def _check_warmup(spec: ScheduleSettings, total_steps: int, steps_per_epoch: int, accumulate: int) -> None:
    """Refuse a warm-up longer than the run."""
    length = warmup_steps(spec, steps_per_epoch, accumulate)
    if spec.warmup <= 0 or length <= total_steps:
        return
    if spec.warmup_unit == "epochs":
        got = f"{spec.warmup} epochs ({length} optimizer steps)"
    else:
        got = f"{spec.warmup} iterations ({length} optimizer steps of {accumulate} iterations)"
    raise ConfigError(f"train.warmup: got {got}, longer than the run's {total_steps} optimizer steps "
                      f"({total_steps * accumulate} iterations); expected a warm-up within the run")


def _check_milestones(spec: ScheduleSettings, total_steps: int, steps_per_epoch: int) -> None:
    """Refuse a multistep milestone at or beyond the run's last step."""
    if spec.kind != "multistep":
        return
    for epoch in spec.milestones:
        at = epoch * steps_per_epoch
        if at >= total_steps:
            where = "beyond" if at > total_steps else "at"
            raise ConfigError(f"train.lr_milestones: got {list(spec.milestones)}, epoch {epoch} is at optimizer "
                              f"step {at}, {where} the run's {total_steps} steps; expected milestones within the run")


def check_schedule(spec: ScheduleSettings, total_steps: int, steps_per_epoch: int, accumulate: int = 1) -> None:
    """Raise ConfigError when the schedule does not fit a run of `total_steps` optimizer steps."""
    if spec.kind not in KINDS:
        raise ConfigError(f"train.lr_schedule: got {spec.kind!r}, expected one of {', '.join(KINDS)}")
    _check_warmup(spec, total_steps, steps_per_epoch, accumulate)
    _check_milestones(spec, total_steps, steps_per_epoch)
