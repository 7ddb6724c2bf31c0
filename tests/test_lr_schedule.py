"""The closed-form learning-rate schedule against torch's schedulers, step for step, and its fit checks."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path
from typing import List

import pytest
import torch
from torch.optim import lr_scheduler as sched

from psframework.errors import ConfigError
from psframework.schemes import lr_schedule
from psframework.schemes.lr_schedule import check_schedule, lr_factor
from psframework.settings import ScheduleSettings

BASE_LR = 0.1
TOTAL, PER_EPOCH = 97, 9

# Settings of the main schedule (kind, overrides); each runs with every warm-up below.
MAINS = [
    ("constant", {}),
    ("cosine", {}),
    ("multistep", {"milestones": (2, 5, 8), "gamma": 0.1}),
    ("multistep", {"milestones": (2, 5, 8), "gamma": 0.5}),
    ("step", {"step_epochs": 3, "gamma": 0.1}),
    ("step", {"step_epochs": 3, "gamma": 0.5}),
    ("onecycle", {"pct_start": 0.25, "div_factor": 25.0, "final_div_factor": 1e4}),
    ("onecycle", {"pct_start": 0.3, "div_factor": 25.0, "final_div_factor": 1e4}),
]

# (warmup, unit, start factor, accumulate); 9 iterations at accumulate 2 floor to 4 optimizer steps.
WARMUPS = [
    (0, "epochs", 0.1, 1),
    (2, "epochs", 0.1, 1),
    (2, "epochs", 0.25, 2),
    (30, "iterations", 0.1, 1),
    (30, "iterations", 0.25, 2),
    (9, "iterations", 0.1, 2),
]


def _main_scheduler(spec: ScheduleSettings, opt: torch.optim.Optimizer, total: int, per_epoch: int):
    """Return torch's scheduler of the main schedule, or None for constant."""
    if spec.kind == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=total, eta_min=0.0)
    if spec.kind == "multistep":
        return sched.MultiStepLR(opt, milestones=[e * per_epoch for e in spec.milestones], gamma=spec.gamma)
    if spec.kind == "step":
        return sched.StepLR(opt, step_size=spec.step_epochs * per_epoch, gamma=spec.gamma)
    if spec.kind == "onecycle":
        return sched.OneCycleLR(opt, max_lr=BASE_LR, total_steps=total, pct_start=spec.pct_start,
                                anneal_strategy="cos", div_factor=spec.div_factor,
                                final_div_factor=spec.final_div_factor, three_phase=False, cycle_momentum=False)
    return None


def torch_factors(spec: ScheduleSettings, total: int, per_epoch: int, warmup_steps: int) -> List[float]:
    """Return torch's lr / base lr at steps 1..total, its scheduler stepped once per optimizer step."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    parts = []
    if warmup_steps:
        parts.append(sched.LinearLR(opt, start_factor=spec.warmup_start_factor, end_factor=1.0,
                                    total_iters=warmup_steps))
    main = _main_scheduler(spec, opt, total, per_epoch)
    if main is not None:
        parts.append(main)
    scheduler = sched.ChainedScheduler(parts) if parts else None
    factors = []
    for _ in range(total):
        factors.append((scheduler.get_last_lr()[0] if scheduler else opt.param_groups[0]["lr"]) / BASE_LR)
        opt.step()  # before scheduler.step(), as torch expects
        if scheduler:
            scheduler.step()
    return factors


def assert_matches(spec: ScheduleSettings, total: int, per_epoch: int, accumulate: int, warmup_steps: int) -> None:
    """Assert lr_factor equals torch's factor at every step to 1e-9 relative."""
    expected = torch_factors(spec, total, per_epoch, warmup_steps)
    for step, want in enumerate(expected, start=1):
        got = lr_factor(spec, step, total, per_epoch, accumulate)
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0), (spec, step, got, want)


# onecycle never has a warm-up (the config refuses it).
CASES = [(kind, over, *warm) for kind, over in MAINS for warm in WARMUPS if not (kind == "onecycle" and warm[0])]


@pytest.mark.parametrize("kind, overrides, warmup, unit, start, accumulate", CASES)
def test_matches_torch(kind, overrides, warmup, unit, start, accumulate):
    spec = ScheduleSettings(kind=kind, warmup=warmup, warmup_unit=unit, warmup_start_factor=start, **overrides)
    length = warmup * PER_EPOCH if unit == "epochs" else warmup // accumulate
    assert length == lr_schedule.warmup_steps(spec, PER_EPOCH, accumulate)
    assert_matches(spec, TOTAL, PER_EPOCH, accumulate, length)


@pytest.mark.parametrize("total, per_epoch", [(40, 7), (10, 1), (1000, 64)])
@pytest.mark.parametrize("kind, overrides", [
    ("cosine", {}),
    ("multistep", {"milestones": (1, 3), "gamma": 0.2}),
    ("step", {"step_epochs": 2, "gamma": 0.7}),
    ("onecycle", {"pct_start": 0.35, "div_factor": 10.0, "final_div_factor": 100.0}),
])
def test_matches_torch_other_lengths(kind, overrides, total, per_epoch):
    spec = ScheduleSettings(kind=kind, **overrides)
    assert_matches(spec, total, per_epoch, 1, 0)
    if kind != "onecycle":
        warm = replace(spec, warmup=1)
        assert_matches(warm, total, per_epoch, 1, per_epoch)


def test_landmarks():
    cosine = ScheduleSettings(kind="cosine")
    assert lr_factor(cosine, 1, 10, 5) == 1.0
    assert lr_factor(cosine, 6, 10, 5) == pytest.approx(0.5)
    onecycle = ScheduleSettings(kind="onecycle", pct_start=0.3, div_factor=25.0, final_div_factor=1e4)
    assert lr_factor(onecycle, 1, 100, 10) == pytest.approx(1 / 25)
    assert lr_factor(onecycle, 30, 100, 10) == pytest.approx(1.0)
    assert lr_factor(onecycle, 100, 100, 10) == pytest.approx(1 / 25 / 1e4)
    warm = ScheduleSettings(kind="constant", warmup=4, warmup_unit="iterations", warmup_start_factor=0.2)
    assert [lr_factor(warm, s, 10, 5, accumulate=2) for s in (1, 2, 3, 4)] == pytest.approx([0.2, 0.6, 1.0, 1.0])


def test_unknown_kind_is_refused():
    spec = ScheduleSettings(kind="linear")
    with pytest.raises(ConfigError, match="train.lr_schedule"):
        lr_factor(spec, 1, 10, 5)
    with pytest.raises(ConfigError, match="train.lr_schedule"):
        check_schedule(spec, 10, 5)


@pytest.mark.parametrize("spec, total, per_epoch, accumulate, words", [
    (ScheduleSettings(warmup=5), 40, 9, 1, ["train.warmup", "5 epochs", "45 optimizer steps", "40 optimizer steps"]),
    (ScheduleSettings(kind="cosine", warmup=100, warmup_unit="iterations"), 40, 9, 2,
     ["train.warmup", "100 iterations", "50 optimizer steps", "80 iterations"]),
])
def test_check_refuses_long_warmup(spec, total, per_epoch, accumulate, words):
    with pytest.raises(ConfigError) as err:
        check_schedule(spec, total, per_epoch, accumulate)
    message = str(err.value)
    assert "\n" not in message and "expected" in message
    for word in words:
        assert word in message


def test_check_refuses_milestone_beyond_the_run():
    spec = ScheduleSettings(kind="multistep", milestones=(3, 9))
    with pytest.raises(ConfigError) as err:
        check_schedule(spec, 40, 7)
    assert str(err.value) == ("train.lr_milestones: got [3, 9], epoch 9 is at optimizer step 63, beyond the run's "
                              "40 steps; expected milestones within the run")
    with pytest.raises(ConfigError, match=r"train\.lr_milestones: .*epoch 5 is at optimizer step 35, at the run's"):
        check_schedule(ScheduleSettings(kind="multistep", milestones=(2, 5)), 35, 7)


@pytest.mark.parametrize("spec, total, per_epoch, accumulate", [
    (ScheduleSettings(kind="multistep", milestones=(2, 5, 8), warmup=2), TOTAL, PER_EPOCH, 1),
    (ScheduleSettings(kind="cosine", warmup=40, warmup_unit="iterations"), 20, 9, 2),  # the warm-up fills the run
    (ScheduleSettings(kind="onecycle"), TOTAL, PER_EPOCH, 1),
    (ScheduleSettings(kind="step", milestones=(50,)), 40, 7, 1),  # milestones only matter to multistep
    (ScheduleSettings(), 1, 1, 1),
])
def test_check_accepts_a_fitting_schedule(spec, total, per_epoch, accumulate):
    check_schedule(spec, total, per_epoch, accumulate)


def test_imports_no_torch():
    tree = ast.parse(Path(lr_schedule.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert modules <= {"__future__", "math", "typing", "dataclasses", "psframework.errors", "psframework.settings"}
