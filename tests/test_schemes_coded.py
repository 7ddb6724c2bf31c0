"""Coded model-parallel schemes under mpiexec, against the single-process reference trainer."""

from __future__ import annotations

import json
import os

import pytest
import torch

from mpiutil import describe, run_mpi, run_psf
from psframework.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_sazd.yaml")
ITERATIONS = 30
COMMON = [f"train.max_iterations={ITERATIONS}", "output.progress=off", "train.weight_decay=0.001",
          "train.lr_schedule=constant",
          "train.momentum=0.9", "train.lr=0.05"]
# For runs whose rounding differs from the reference's every round in ways timing decides (readmissions,
# first-k decoding through other subsets): a recipe that does not amplify rounding. Two reference runs
# whose initial weights differ by a relative 1e-5 differ by 4e-1 in loss after 60 iterations of COMMON,
# by 6e-5 with lr 0.005 (python hpc/sensitivity.py --eps 1e-5 --iterations 60 configs/digits_sazd.yaml
# train.lr_schedule=constant train.weight_decay=0.001 train.lr=0.005).
CALM = [*(o for o in COMMON if not o.startswith("train.lr=")), "train.lr=0.005"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}"] + COMMON) == 0
    return out / "ref"


@pytest.fixture(scope="module")
def calm_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("calm_reference")
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}"] + CALM) == 0
    return out / "ref"


def train(tmp_path, ranks, *overrides, timeout=240):
    proc = run_psf(ranks, ["train", CONFIG, "name=run", f"output.dir={tmp_path}", *COMMON, *overrides],
                   timeout=timeout)
    assert proc.returncode == 0, describe(proc)
    return tmp_path / "run"


def model_state(run_dir):
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_model(run_dir, reference_dir, rel=1e-4):
    ours, ref = model_state(run_dir), model_state(reference_dir)
    assert ours.keys() == ref.keys()
    for key in ref:
        a, b = ours[key].float(), ref[key].float()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        assert err <= rel, f"{key}: relative error {err:.2e}"


# lenet5 has 6 and 16 channels: with k = 3 the second layer is padded to 18 channels.
# "rotate" decodes every round from a different k-subset (cycling through all of them, those
# without systematic packets first), waiting for every worker so that the choice is forced.
@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks,overrides", [
    (5, ["scheme=sazd", "comm.dissemination=direct", "code.subsets=rotate", "train.verify_every=10"]),
    (5, ["scheme=sazd", "comm.dissemination=relay", "code.subsets=rotate", "code.systematic=false"]),
    (5, ["scheme=sazd-naive", "code.subsets=rotate"]),
    (4, ["scheme=uncoded", "code.n=3", "code.k=3"]),
    (4, ["scheme=poly", "code.n=3", "code.k=2", "code.subsets=rotate"]),
], ids=["sazd-direct", "sazd-relay-nonsystematic", "sazd-naive", "uncoded", "poly"])
def test_scheme_matches_reference(tmp_path, reference, ranks, overrides):
    run_dir = train(tmp_path, ranks, *overrides)
    assert_same_model(run_dir, reference)
    ref_losses, our_losses = losses(reference), losses(run_dir)
    assert len(our_losses) == ITERATIONS
    assert max(abs(a - b) for a, b in zip(our_losses, ref_losses)) < 1e-4
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("wait_s", "decode_s", "encode_s", "comm_s", "compute_s", "bytes_sent", "bytes_received", "used"):
        assert key in rows[-1]
    assert summary["server_bytes_sent"] > 0 and summary["world_size"] == ranks
    assert summary["membership"] == []  # no straggler: no worker is detached
    if "code.subsets=rotate" in overrides:
        used = {tuple(u) for row in rows for u in row["used"]}
        k = summary["k"]
        assert len(used) > 1 and all(len(u) == k for u in used)
        systematic = set(range(1, k + 1))  # ranks of the workers holding the systematic packets
        assert sum(bool(systematic - set(u)) for u in used) >= 2  # rounds decoded without systematic workers
    if "train.verify_every=10" in overrides:
        assert summary["verify_max_rel_diff"] is not None and summary["verify_max_rel_diff"] < 1e-4
        assert sum("verify_max_rel_diff" in r for r in rows) == 3


@pytest.mark.mpi
@pytest.mark.timeout(400)
def test_resume_gives_the_losses_of_the_uninterrupted_run(tmp_path):
    whole = train(tmp_path / "whole", 5, "train.max_iterations=20")
    first = train(tmp_path / "first", 5, "train.max_iterations=10")
    resumed = train(tmp_path / "second", 5, "train.max_iterations=20", f"train.resume={first / 'checkpoint.pt'}")
    rows = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(11, 21))
    expected = losses(whole)[10:]
    got = [r["loss"] for r in rows]
    # Both runs decode from whichever k replies come first, so they agree up to rounding.
    assert max(abs(a - b) / abs(b) for a, b in zip(got, expected)) < 1e-4
    assert_same_model(resumed, whole)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_wrong_world_size_is_one_clear_line(tmp_path):
    proc = run_mpi(4, ["-m", "psframework", "train", CONFIG, f"output.dir={tmp_path}"], timeout=100)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["psf: error: world size 4 does not fit code.n=4: scheme sazd needs n+1 = 5 ranks "
                     "(1 server + 4 workers); launch with mpiexec -n 5 or set code.n=3"]


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("override,message", [
    ("code.k=5", "code.k: got k=5 > n=4, expected k <= n"),
    ("train.optimizer=adam", "coded conv layers need a linear optimizer"),
    ("data.dataset=mnist data.root=/no/such/directory", "data.root: directory '/no/such/directory' does not exist"),
])
def test_bad_inputs_under_mpi(tmp_path, override, message):
    # In the warm pool job: tests/test_bad_inputs.py runs such errors under a fresh mpiexec too.
    proc = run_psf(5, ["train", CONFIG, *override.split(), f"output.dir={tmp_path}"], timeout=100, keep_mpi=True)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_cosine_schedule_reaches_the_workers(tmp_path):
    # 15 iterations: the schedule decays within them; fewer steps leave less room for rounding to grow.
    cosine = ["train.lr_schedule=cosine", "train.max_iterations=15"]
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={tmp_path}"] + COMMON + cosine) == 0
    run_dir = train(tmp_path / "coded", 5, *cosine)
    assert_same_model(run_dir, tmp_path / "ref")
