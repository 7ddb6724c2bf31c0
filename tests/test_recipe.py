"""The training recipe (schedules, augmentation, label smoothing, accumulation, precision) under every scheme."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from test_any_model import assert_same_run
from test_any_model import run as run_any
from psframework.cli import main
from psframework.data import load_dataset
from psframework.data.augment import CropFlip
from psframework.schemes.common import iteration_plan
from psframework.schemes.driver import make_schedule
from psframework.schemes.validate import load_run, make_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_sazd.yaml")
COMMON = ["output.progress=off", "train.momentum=0.9", "train.lr=0.05", "train.weight_decay=0.0005",
          "train.nesterov=true"]
# resnet20 without BatchNorm on synthetic 8x8 images: every feature of the recipe at once, over 30
# iterations (15 optimizer steps of 2 micro-batches; 4 steps an epoch, so the milestones fall inside).
RECIPE = ["model.name=resnet20", "model.input_size=8", "model.batch_norm=false", "data.dataset=synthetic",
          "data.synthetic.height=8", "data.synthetic.width=8", "data.synthetic.channels=1",
          "data.synthetic.train_size=256", "data.batch_size=32", "train.max_iterations=30",
          "data.augment=crop-flip", "data.augment_padding=2", "train.lr_schedule=multistep",
          "train.lr_milestones=[1, 2]", "train.lr_gamma=0.5", "train.warmup=4", "train.warmup_unit=iterations",
          "train.warmup_start_factor=0.2", "train.label_smoothing=0.1", "train.accumulate=2", "train.precision=fp32"]
SCHEMES = {  # ranks and settings; "rotate" decodes every round from another k-subset: erasures are forced
    "sazd": (5, ["scheme=sazd", "code.subsets=rotate", "comm.dissemination=relay"]),
    "poly": (4, ["scheme=poly", "code.n=3", "code.k=2", "code.subsets=rotate"]),
    "uncoded": (4, ["scheme=uncoded", "code.n=3", "code.k=3"]),
    "sazd-naive": (5, ["scheme=sazd-naive", "code.subsets=rotate"]),
    "ps": (5, ["scheme=ps"]),
    "stanza": (5, ["scheme=stanza"]),
    "sazd 2 servers": (8, ["scheme=sazd", "train.servers=2", "code.n=3", "code.k=2", "code.subsets=rotate"]),
}


def run(tmp_path, ranks, overrides, name="run"):
    """Train under mpiexec (or in this process for one rank); return the run directory."""
    return run_any(tmp_path, CONFIG, ranks, [*COMMON, *overrides], name)


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def recipe_reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("ref"), 1, ["scheme=reference", *RECIPE], "ref")


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_the_whole_recipe_matches_the_reference_under_every_scheme(tmp_path, recipe_reference, scheme):
    ranks, overrides = SCHEMES[scheme]
    run_dir = run(tmp_path, ranks, [*RECIPE, *overrides])
    assert_same_run(run_dir, recipe_reference)
    assert len(rows(run_dir)) == 30


def test_the_reference_steps_once_per_accumulated_step_with_the_scheduled_rate(tmp_path):
    """The reference itself: 30 iterations are 15 optimizer steps whose rates follow the schedule."""
    ref = run(tmp_path, 1, ["scheme=reference", *RECIPE, "train.checkpoint_every=2"])
    saved = [torch.load(ref / f"checkpoint-{i}.pt", weights_only=True)["model"] for i in (2, 4)]
    assert any(not torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
    settings = make_settings(load_run(CONFIG, ["scheme=reference", *RECIPE]))
    schedule = make_schedule(settings, 256)
    factors = [schedule.lr_factor(i) for i in range(1, 31)]
    assert factors[0] == factors[1] == pytest.approx(0.2)  # one step: its two micro-batches share a rate
    assert factors[4] == 1.0 and factors[8] == 0.5 and factors[16] == 0.25  # warm-up 2 steps, milestones 4, 8


# A cap stops a run, not its schedule: the capped run's rates are the planned run's first ones.
RECIPE_CONFIG = os.path.join(ROOT, "configs", "cifar10_resnet20_recipe.yaml")
QUICK_CHECK = ["scheme=reference", "data.dataset=synthetic", "train.max_iterations=20"]


def planned_rates(config: str, overrides: list, iterations: int, num_train: int) -> list:
    """Return the learning rate of iterations 1..`iterations` of the run planned without a cap."""
    cfg = load_run(config, [*overrides, "train.max_iterations=null"])
    schedule = make_schedule(make_settings(cfg), num_train)
    return [cfg.train.lr * schedule.lr_factor(i) for i in range(1, iterations + 1)]


def test_a_capped_recipe_run_keeps_the_schedule_planned_over_its_epochs(tmp_path, capfd):
    """The smoke test users run first: 20 iterations of the recipe, warm-up and milestones far beyond."""
    assert main(["train", RECIPE_CONFIG, *QUICK_CHECK, f"output.dir={tmp_path}", "name=run"]) == 0
    out = capfd.readouterr()
    assert "stops the run at iteration 20 of the 5760 its schedule plans over train.epochs=180" in out.out + out.err
    got = [r["lr"] for r in rows(tmp_path / "run")]
    assert got == pytest.approx(planned_rates(RECIPE_CONFIG, QUICK_CHECK, 20, 2048), rel=1e-12)
    assert got[-1] > got[0]  # still warming up: the planned 5 epochs of warm-up, not 20 iterations'


def test_a_run_resumed_with_a_larger_cap_continues_the_plan(tmp_path):
    args = ["train", os.path.join(ROOT, "configs", "digits_reference.yaml"), f"output.dir={tmp_path}", "name=run",
            "output.progress=off", "train.lr_schedule=cosine", "train.epochs=2", "train.resume=auto"]
    assert main([*args, "train.max_iterations=3"]) == 0
    assert main([*args, "train.max_iterations=6"]) == 0
    got = [r["lr"] for r in rows(tmp_path / "run")]
    digits_train = 1438  # 80% of the 1797 digits
    assert got == pytest.approx(planned_rates(args[1], args[4:7], 6, digits_train), rel=1e-12)


# Accumulation: 4 micro-batches of 16 are one batch of 64 (no BatchNorm: its statistics are per micro-batch).
PLAIN = ["model.batch_norm=false", "model.name=lenet5", "data.dataset=synthetic", "data.synthetic.height=16",
         "data.synthetic.width=16", "data.synthetic.channels=1", "data.synthetic.train_size=512"]
WHOLE = ["data.batch_size=64", "train.accumulate=1", "train.max_iterations=10"]
MICRO = ["data.batch_size=16", "train.accumulate=4", "train.max_iterations=40"]


@pytest.fixture(scope="module")
def whole_batches(tmp_path_factory):
    return run(tmp_path_factory.mktemp("whole"), 1, ["scheme=reference", *PLAIN, *WHOLE], "whole")


@pytest.mark.parametrize("scheme,ranks", [("reference", 1), pytest.param("sazd", 5, marks=pytest.mark.mpi),
                                          pytest.param("ps", 5, marks=pytest.mark.mpi)])
@pytest.mark.timeout(300)
def test_four_micro_batches_of_16_equal_one_batch_of_64(tmp_path, whole_batches, scheme, ranks):
    run_dir = run(tmp_path, ranks, [f"scheme={scheme}", *PLAIN, *MICRO])
    ours = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    ref = torch.load(whole_batches / "checkpoint.pt", weights_only=True)["model"]
    for key in ref:
        err = float((ours[key] - ref[key]).norm() / ref[key].norm().clamp_min(1e-12))
        assert err <= 1e-4, f"{key}: relative error {err:.2e}"
    micro = [r["loss"] for r in rows(run_dir)]
    whole = [r["loss"] for r in rows(whole_batches)]
    assert len(micro) == 4 * len(whole)
    means = np.array(micro).reshape(-1, 4).mean(axis=1)
    assert np.allclose(means, whole, rtol=1e-4, atol=1e-5)


def test_an_accumulated_step_covers_the_samples_of_the_whole_batch():
    settings = make_settings(load_run(CONFIG, ["scheme=reference", *PLAIN, *MICRO]))
    data = settings.data
    micro = list(iteration_plan(data, 512, 0, 40, accumulate=4))
    assert [s.last for s in micro[:4]] == [False, False, False, True] and micro[0].first and micro[4].first
    whole = settings.data.__class__(**{**data.__dict__, "batch_size": 64})
    for step in iteration_plan(whole, 512, 0, 10):
        group = micro[4 * (step.iteration - 1):4 * step.iteration]
        assert np.array_equal(np.concatenate([s.indices for s in group]), step.indices)


def test_every_rank_makes_the_same_augmented_image_of_a_sample():
    """Rank 0 augments whole batches, data-parallel workers their shards: equal images for equal samples."""
    settings = make_settings(load_run(CONFIG, ["data.augment=crop-flip", "data.augment_padding=2"]))
    dataset = load_dataset(settings.data)
    step = next(iteration_plan(settings.data, len(dataset.train), 0, 1))
    whole, labels = dataset.train_batch(step.indices, step.epoch)
    shards = [dataset.train_batch(part, step.epoch)[0] for part in np.array_split(step.indices, 3)]
    assert torch.equal(torch.cat(shards), whole)
    plain = dataset.train.fetch(step.indices)[0]
    assert not torch.equal(plain, whole)  # most images moved or flipped
    again = CropFlip(2, 0.5, settings.data.seed)(plain, step.indices, step.epoch)
    assert torch.equal(again, whole)
    other_epoch = dataset.train_batch(step.indices, step.epoch + 1)[0]
    assert not torch.equal(other_epoch, whole)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme,ranks,extra", [("sazd", 5, []), ("stanza", 5, []), ("ps", 5, []),
                                                ("poly", 5, ["code.k=3"]), ("uncoded", 5, ["code.k=4"]),
                                                ("sazd-naive", 5, []), ("reference", 1, [])])
def test_every_scheme_trains_the_digits_in_bf16(tmp_path, scheme, ranks, extra):
    run_dir = run(tmp_path, ranks, [f"scheme={scheme}", "train.precision=bf16", "train.lr_schedule=cosine",
                                    "train.weight_decay=0.0001", "train.nesterov=false", "train.lr=0.02", *extra])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_test_accuracy"] >= 0.95, summary["final_test_accuracy"]


def test_a_crop_of_the_digits_keeps_their_accuracy_within_a_point(tmp_path):
    """A sanity check of the augmentation, not a tuning target: 2 pixels of shift (digits are not mirror
    images of themselves, so no flip) leave the 5-epoch accuracy within 0.01."""
    config = os.path.join(ROOT, "configs", "digits_reference.yaml")
    accuracy = {}
    for augment in ("none", "crop-flip"):
        args = ["train", config, f"name={augment}", f"output.dir={tmp_path}", "output.progress=off",
                f"data.augment={augment}", "data.augment_padding=2", "data.augment_flip=0"]
        assert main(args) == 0
        accuracy[augment] = json.loads((tmp_path / augment / "summary.json").read_text())["final_test_accuracy"]
    assert accuracy["none"] >= 0.95
    assert abs(accuracy["crop-flip"] - accuracy["none"]) < 0.01, accuracy


# Loss scaling: a sample whose loss overflows makes its optimizer step skipped by every rank, the scale
# halved, and then doubled every 3 steps; the run is the reference's (which skips the same step).
OVERFLOW = [f"data.dataset={os.path.join(ROOT, 'tests', 'overflowing_data.py')}:with_an_overflow",
            "model.name=lenet5", "model.batch_norm=false", "train.max_iterations=16", "train.loss_scale=dynamic",
            "train.loss_scale_power=8", "train.loss_scale_window=3", "data.batch_size=32"]
SCALED = {**SCHEMES, "stanza 2 servers": (8, ["scheme=stanza", "train.servers=2", "code.n=3"]),
          "ps 2 servers": (8, ["scheme=ps", "train.servers=2", "code.n=3"])}


@pytest.fixture(scope="module")
def overflow_reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("ref"), 1, ["scheme=reference", *OVERFLOW], "ref")


def skipped_step(run_dir):
    """Return the iteration whose batch holds the overflowing sample, and the run's final loss scale."""
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)["state"]["loss_scale"]
    losses = [r["loss"] for r in rows(run_dir)]
    return [i + 1 for i, x in enumerate(losses) if not np.isfinite(x)], state


def test_the_reference_skips_the_overflowing_step_and_rescales(overflow_reference):
    skipped, state = skipped_step(overflow_reference)
    assert len(skipped) == 1
    # 2^8, halved once, doubled every 3 steps taken since: 15 steps taken, the last change at the 3rd after the skip
    taken_after = 16 - skipped[0]
    assert state["scale"] == 2.0 ** (8 - 1 + taken_after // 3 + (skipped[0] - 1) // 3)
    model = torch.load(overflow_reference / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.isfinite(t).all() for t in model.values())


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", list(SCALED))
def test_every_rank_skips_the_overflowing_step(tmp_path, overflow_reference, scheme):
    ranks, overrides = SCALED[scheme]
    overrides = [o for o in overrides if o != "comm.dissemination=relay"]
    run_dir = run(tmp_path, ranks, [*OVERFLOW, *overrides])
    assert skipped_step(run_dir) == skipped_step(overflow_reference)
    ours = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    ref = torch.load(overflow_reference / "checkpoint.pt", weights_only=True)["model"]
    for key in ref:
        err = float((ours[key] - ref[key]).norm() / ref[key].norm().clamp_min(1e-12))
        assert err <= 1e-4, f"{key}: relative error {err:.2e}"
