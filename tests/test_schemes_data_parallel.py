"""Data-parallel schemes (`ps`, `stanza`) under mpiexec, against the single-process reference trainer."""

from __future__ import annotations

import json
import os
import socket

import pytest

from mpiutil import describe, run_mpi, run_psf
from psframework.cli import main
from test_schemes_coded import assert_same_model, losses, model_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_stanza.yaml")
ITERATIONS = 30
# One epoch of the digits is 44 iterations: the cosine schedule, planned over the epochs, decays within the run.
COMMON = [f"train.max_iterations={ITERATIONS}", "train.epochs=1", "output.progress=off", "train.weight_decay=0.001",
          "train.lr_schedule=cosine", "train.momentum=0.9", "train.lr=0.05"]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Reference runs, one per distinct setting, made on first use."""
    made = {}

    def get(*overrides):
        if overrides not in made:
            out = tmp_path_factory.mktemp("reference")
            assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}"]
                        + COMMON + list(overrides)) == 0
            made[overrides] = out / "ref"
        return made[overrides]
    return get


def train(tmp_path, *overrides, ranks=5, timeout=200):
    proc = run_psf(ranks, ["train", CONFIG, "name=run", f"output.dir={tmp_path}", *COMMON, *overrides],
                   timeout=timeout)
    assert proc.returncode == 0, describe(proc)
    return tmp_path / "run"


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# The same global batch order as the reference; shards are contiguous slices of each batch.
# A batch of 30 over 4 workers gives shards of 8, 8, 7, 7 samples.
# Uneven shards and Nesterov momentum are separate cases. Together, on an AVX-512 Xeon, the first
# layer's weights alone jumped from 7e-8 to 5.5e-6 from the reference at iteration 7, its bias still
# bit-equal: what a max-pool window does when rounding swaps its two nearly equal largest values.
# Training grew that to 2e-3 by iteration 30; each case alone stays within 3e-7 for the whole run.
@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme,setting", [
    ("ps", ()),
    ("stanza", ()),
    ("ps", ("data.batch_size=30",)),
    ("ps", ("train.nesterov=true",)),
    ("stanza", ("data.batch_size=30", "train.head_optimizer=adam", "train.head_lr=0.002")),
], ids=["ps", "stanza", "ps-uneven-shards", "ps-nesterov", "stanza-uneven-shards-adam-head"])
def test_scheme_matches_reference(tmp_path, references, scheme, setting):
    reference = references(*setting)
    run_dir = train(tmp_path, f"scheme={scheme}", *setting)
    assert_same_model(run_dir, reference)
    ref_losses, our_losses = losses(reference), losses(run_dir)
    assert len(our_losses) == ITERATIONS
    assert max(abs(a - b) for a, b in zip(our_losses, ref_losses)) < 1e-4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["scheme"] == scheme and summary["world_size"] == 5 and summary["backup_workers"] == 0
    assert summary["hosts"] == [socket.gethostname()] * 5  # every rank's host, by rank
    batch = 30 if "data.batch_size=30" in setting else 32
    for row in rows(run_dir):
        assert row["used"] == [1, 2, 3, 4]
        assert sum(row["samples"]) == batch
        for key in ("wait_s", "comm_s", "compute_s", "bytes_sent", "bytes_received"):
            assert key in row
    assert summary["emulation"] is None
    assert all(w["replies_skipped"] == 0 for w in summary["workers"].values())


def detached(summary, iteration):
    """Return whether a worker was detached during an iteration (between its detach and readmission)."""
    return any(e["detached_at"] < iteration and (e["readmitted_at"] is None or iteration < e["readmitted_at"])
               for e in summary["membership"])


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme", ["ps", "stanza"])
def test_backup_worker_leaves_the_straggler_out(tmp_path, scheme):
    run_dir = train(tmp_path, f"scheme={scheme}", "train.backup_workers=1", "stragglers.model=fixed",
                    "stragglers.ranks=[2]", "stragglers.factor=20")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backup_workers"] == 1
    table = rows(run_dir)
    # All but one of the attached workers: 3, or 2 while the slowed one is detached for falling behind.
    assert all(len(r["used"]) == len(r["samples"]) == (2 if detached(summary, r["iteration"]) else 3) for r in table)
    assert all(sum(r["samples"]) == 8 * len(r["used"]) for r in table)  # shards of 8: the update covers those used
    assert sum(2 not in r["used"] for r in table) >= ITERATIONS // 2  # the slowed worker is mostly left out
    slow = summary["workers"]["2"]
    # it skipped iterations that rank 0 had finished without it, or was detached for falling behind
    assert slow["replies_skipped"] > 0 or summary["membership"]
    first, last = [r["loss"] for r in table[:5]], [r["loss"] for r in table[-5:]]
    assert sum(last) < sum(first)  # it still learns from the samples it uses


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme", ["ps", "stanza"])
def test_batch_norm_statistics_reach_rank_0(tmp_path, scheme):
    run_dir = train(tmp_path, f"scheme={scheme}", "model.batch_norm=true", "train.max_iterations=5")
    state = model_state(run_dir)
    means = [v for k, v in state.items() if k.endswith("running_mean")]
    assert means and all(float(m.abs().sum()) > 0 for m in means)  # the workers' statistics, not the initial zeros


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scheme,ranks", [("ps", 5), ("sazd", 5)])
def test_network_emulation_holds_sends_back(tmp_path, scheme, ranks):
    run_dir = train(tmp_path, f"scheme={scheme}", "train.max_iterations=5", "comm.emulate.bandwidth_gbps=0.5",
                    "comm.emulate.latency_us=100", ranks=ranks)
    summary = json.loads((run_dir / "summary.json").read_text())
    emulation = summary["emulation"]
    assert emulation["bandwidth_gbps"] == 0.5 and emulation["latency_us"] == 100
    # Rank 0 waits bytes / bandwidth + latency per message before posting it.
    least = summary["server_bytes_sent"] * 8 / 0.5e9
    assert emulation["server_send_delay_s"] >= least


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("override,message", [
    ("train.backup_workers=4", "train.backup_workers: got 4 with code.n=4, expected 0 <= backup_workers < n"),
    ("data.batch_size=3", "data.batch_size: got 3 with code.n=4 workers, expected at least one sample per worker"),
    ("train.head_optimizer=rmsprop", "train.head_optimizer: got 'rmsprop', expected one of sgd, adam"),
    ("train.head_momentum=0.5", "unknown key 'train.head_momentum'"),
])
def test_bad_input_is_one_line_on_rank_0(tmp_path, override, message):
    # In the warm pool job: tests/test_bad_inputs.py runs such errors under a fresh mpiexec too.
    proc = run_psf(5, ["train", CONFIG, f"output.dir={tmp_path}", override], timeout=100, keep_mpi=True)
    assert proc.returncode == 2, describe(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("psf: error: ") and message in lines[0], describe(proc)


# Each scheme's analytic byte count per iteration must be what rank 0 really moves. `rotate` makes
# sazd wait for every reply, so that each iteration's bytes fall in that iteration.
@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("overrides", [
    ["scheme=ps"], ["scheme=stanza"], ["scheme=stanza", "model.batch_norm=true", "data.batch_size=30"],
    ["scheme=sazd", "code.k=3", "code.subsets=rotate"],
    ["scheme=sazd", "code.k=3", "code.subsets=rotate", "comm.dissemination=relay"],
], ids=["ps", "stanza", "stanza-bn-uneven", "sazd-direct", "sazd-relay"])
def test_measured_bytes_match_the_analytic_count(tmp_path, overrides):
    from psframework.schemes.common import analytic_server_bytes
    from psframework.schemes.validate import load_run, make_settings

    run_dir = train(tmp_path, "train.max_iterations=4", *overrides)
    sent, received = analytic_server_bytes(make_settings(load_run(CONFIG, overrides)))
    for row in rows(run_dir)[1:]:
        assert (row["bytes_sent"], row["bytes_received"]) == (sent, received)
    assert json.loads((run_dir / "summary.json").read_text())["membership"] == []  # no straggler, no detach


# A scheme added from outside the package (tests/mpi/toy_scheme.py, docs/adding-a-scheme.md):
# it registers itself and trains through the same driver and round layer as the built-in schemes.
@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_scheme_registered_from_outside_matches_the_reference(tmp_path):
    common = [CONFIG, "train.max_iterations=20", "output.progress=off", f"output.dir={tmp_path}",
              "model.dropout=0", "train.checkpoint_every=10"]
    assert main(["train", *common, "scheme=reference", "name=ref"]) == 0
    proc = run_mpi(3, "toy_scheme.py", "train", *common, "scheme=toy-average", "code.n=2", "code.k=2", "name=toy",
                   timeout=240)
    assert proc.returncode == 0, describe(proc)
    ref, toy = rows(tmp_path / "ref"), rows(tmp_path / "toy")
    assert len(toy) == 20 and max(abs(a["loss"] - b["loss"]) for a, b in zip(ref, toy)) < 1e-4
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["scheme"] == "toy-average" and summary["world_size"] == 3 and summary["n"] == 2
    assert (tmp_path / "toy" / "checkpoint-10.pt").is_file()
    assert set(summary["workers"]) == {"1", "2"} and all(w["replies_sent"] == 20 for w in summary["workers"].values())
