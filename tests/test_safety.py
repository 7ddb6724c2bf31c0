"""Safe by default: checkpoints cannot run code, runs cannot clobber each other, resumes keep history."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest
import torch

from psframework.cli import main
from psframework.metrics import RunRecorder
from psframework.rundir import LOCK_NAME
from psframework.schemes.driver import events, make_schedule
from psframework.schemes.validate import load_run, make_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "configs", "digits_reference.yaml")


class RunsCode:
    """A pickle payload that would create a marker file when unpickled by a full unpickler."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def train(out, name: str, *overrides: str) -> int:
    return main(["train", DIGITS, f"output.dir={out}", f"name={name}", "output.progress=off",
                 "train.lr_schedule=constant", *overrides])


def snapshot(directory) -> dict:
    """Return every file below `directory` with its bytes."""
    found = {}
    for base, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as fh:
                found[os.path.relpath(path, directory)] = fh.read()
    return found


def metrics(run_dir) -> list:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("psf: error: ")
    return err[0]


def test_a_checkpoint_that_would_run_code_is_refused_and_the_payload_never_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format": 3, "x": RunsCode(str(marker))}, evil)
    assert train(tmp_path / "out", "victim", f"train.resume={evil}") == 2
    line = one_error_line(capsys)
    assert str(evil) in line and "refused, loading it could run code" in line and "system" in line
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished reference run of 12 iterations with checkpoints at 6 and 12."""
    out = tmp_path_factory.mktemp("finished")
    assert train(out, "run", "train.max_iterations=12", "train.checkpoint_every=6") == 0
    return out / "run"


def test_resume_from_another_config_names_every_key_that_differs(finished, tmp_path, capsys):
    checkpoint = finished / "checkpoint-6.pt"
    assert train(tmp_path, "other", f"train.resume={checkpoint}", "train.lr=0.1", "data.batch_size=16",
                 "train.max_iterations=12") == 2
    line = one_error_line(capsys)
    assert "was written with other settings" in line
    assert "train.lr 0.02 -> 0.1" in line and "data.batch_size 32 -> 16" in line
    assert "train.resume_force=true" in line and not (tmp_path / "other").exists()
    assert train(tmp_path, "forced", f"train.resume={checkpoint}", "train.lr=0.1", "train.max_iterations=12",
                 "train.resume_force=true") == 0
    assert "psf: warning: resuming from" in capsys.readouterr().err
    summary = json.loads((tmp_path / "forced" / "summary.json").read_text())
    assert summary["resume_forced"] == ["train.lr 0.02 -> 0.1"]


def test_a_checkpoint_with_other_layer_shapes_is_refused_by_its_fingerprint(finished, tmp_path, capsys):
    assert train(tmp_path, "wide", f"train.resume={finished / 'checkpoint-6.pt'}", "model.channels=[8,16]",
                 "train.max_iterations=12") == 2
    line = one_error_line(capsys)
    assert "model.channels None -> [8, 16]" in line and "model.shapes" in line


def test_a_longer_run_under_a_length_dependent_schedule_is_another_config(finished, tmp_path, capsys):
    assert train(tmp_path, "cosine", f"train.resume={finished / 'checkpoint-6.pt'}", "train.lr_schedule=cosine") == 2
    assert "train.lr_schedule 'constant' -> 'cosine'" in one_error_line(capsys)


def test_resuming_a_finished_run_says_so_and_leaves_it_byte_identical(finished, capsys):
    before = snapshot(finished)
    assert train(finished.parent, "run", f"train.resume={finished / 'checkpoint.pt'}", "train.max_iterations=12") == 0
    out = capsys.readouterr()
    assert "nothing to do" in out.out and "all 12 planned iterations" in out.out and out.err == ""
    assert snapshot(finished) == before


def test_resuming_in_place_keeps_the_earlier_metrics(finished, tmp_path):
    whole = metrics(finished)
    copy = tmp_path / "run"
    copy.mkdir()
    for name, data in snapshot(finished).items():
        (copy / name).write_bytes(data)
    assert train(tmp_path, "run", f"train.resume={copy / 'checkpoint-6.pt'}", "train.max_iterations=18") == 0
    rows = metrics(copy)
    assert [r["iteration"] for r in rows] == list(range(1, 19))
    assert rows[:6] == whole[:6]
    assert [r["loss"] for r in rows[6:12]] == [r["loss"] for r in whole[6:12]]
    assert sorted(os.listdir(copy)) == ["checkpoint-12.pt", "checkpoint-6.pt", "checkpoint.pt",
                                        "config.yaml", "metrics.jsonl", "summary.json"]


def test_a_finished_run_is_never_overwritten_unless_asked(finished, tmp_path, capsys):
    before = snapshot(finished)
    assert train(finished.parent, "run", "train.max_iterations=3") == 2
    line = one_error_line(capsys)
    assert "already holds a finished run" in line and "output.overwrite=true" in line
    assert snapshot(finished) == before
    out = tmp_path / "again"
    assert train(out, "run", "train.max_iterations=12", "train.checkpoint_every=6") == 0
    assert train(out, "run", "train.max_iterations=3", "output.overwrite=true") == 0
    assert sorted(os.listdir(out / "run")) == ["checkpoint.pt", "config.yaml", "metrics.jsonl", "summary.json"]
    assert len(metrics(out / "run")) == 3


def test_a_second_run_on_a_directory_in_use_exits_at_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "psframework", "train", DIGITS, f"output.dir={tmp_path}", "name=busy",
               "output.progress=off"]
    first = subprocess.Popen(command + ["train.epochs=1000"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "busy" / "metrics.jsonl.partial").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.2)
        t0 = time.monotonic()
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        first.kill()
        first.wait()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert f"is in use by pid {first.pid} on host {socket.gethostname()}" in lines[0]
    assert elapsed < 60  # at once: it does not wait for the first run
    # The killed run left its lock; the next run on this host sees its owner is gone and takes it over.
    assert (tmp_path / "busy" / LOCK_NAME).exists()
    assert train(tmp_path, "busy", "train.max_iterations=2", "output.overwrite=true") == 0
    assert not (tmp_path / "busy" / LOCK_NAME).exists()


def test_temporary_files_of_a_killed_write_are_removed_at_start(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".checkpoint.pt.k2j3h4.tmp").write_bytes(b"half a checkpoint")
    (run / ".summary.json.x8.tmp").write_text("{")
    assert train(tmp_path, "run", "train.max_iterations=2") == 0
    assert not [name for name in os.listdir(run) if name.endswith(".tmp")]


def test_the_plan_and_the_metrics_take_constant_memory_in_the_run_length():
    def peak(epochs: int) -> int:
        settings = make_settings(load_run(None, [f"train.epochs={epochs}"]))
        schedule = make_schedule(settings, 1437)
        tracemalloc.start()
        plan = events(settings, 1437, schedule, with_syncs=True)
        for _, _ in zip(range(2000), plan):
            pass
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size

    assert peak(10**6) < 2 * peak(50) + 100_000


def test_the_recorder_keeps_running_sums_not_rows(tmp_path):
    recorder = RunRecorder(str(tmp_path / "run"), "name: x\n")
    tracemalloc.start()
    for i in range(1, 20001):
        recorder.log({"iteration": i, "loss": 1.0, "iteration_s": float(i)})
    size = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert size < 200_000
    recorder.update_last(test_accuracy=0.5)
    summary = recorder.finish({"mean_iteration_s": recorder.mean("iteration_s", skip=1)})
    assert summary["mean_iteration_s"] == pytest.approx(sum(range(2, 20001)) / 19999)
    rows = metrics(tmp_path / "run")
    assert len(rows) == 20000 and rows[-1]["test_accuracy"] == 0.5


def test_model_info_and_check_need_neither_the_dataset_nor_a_gpu(capsys):
    mnist = os.path.join(ROOT, "configs", "mnist_sazd.yaml")
    assert main(["model-info", mnist, "data.root=/no/such/directory"]) == 0
    assert "conv_blocks.0.conv" in capsys.readouterr().out
    assert main(["check", mnist, "device=cuda", "data.root=/no/such/directory"]) == 0
    assert main(["check", "--machine", mnist, "data.root=/no/such/directory"]) == 2
    assert "data.root: directory '/no/such/directory' does not exist" in capsys.readouterr().err


def test_keep_checkpoints_leaves_the_newest_periodic_ones_and_the_latest(tmp_path):
    assert train(tmp_path, "kept", "train.max_iterations=12", "train.checkpoint_every=2",
                 "train.keep_checkpoints=2") == 0
    names = sorted(p.name for p in (tmp_path / "kept").glob("checkpoint*.pt"))
    assert names == ["checkpoint-10.pt", "checkpoint-12.pt", "checkpoint.pt"]


def test_a_kill_during_checkpoints_always_leaves_a_loadable_one(tmp_path):
    """SIGKILL at moments spread over a run that checkpoints every iteration and keeps one periodic checkpoint:
    a loadable checkpoint is always on disk (each is written under a temporary name, then renamed, and
    the older one removed only after)."""
    from psframework.schemes.checkpoint import read_checkpoint

    argv = [sys.executable, "-m", "psframework", "train", DIGITS, f"output.dir={tmp_path}", "output.progress=off",
            "train.checkpoint_every=1", "train.keep_checkpoints=1", "train.epochs=50"]
    for attempt, delay in enumerate((3.0, 3.4, 3.8, 4.3)):
        proc = subprocess.Popen([*argv, f"name=killed{attempt}"], cwd=ROOT)
        run_dir = tmp_path / f"killed{attempt}"
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoint.pt").exists():  # training has begun
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not checkpoint"
            time.sleep(0.02)
        time.sleep(delay - 3.0)
        proc.kill()
        proc.wait()
        loadable = []
        for path in sorted(run_dir.glob("checkpoint*.pt")):
            try:
                loadable.append(read_checkpoint(str(path)).iteration)
            except Exception:
                pass
        assert loadable, sorted(p.name for p in run_dir.iterdir())
        assert len(list(run_dir.glob("checkpoint-*.pt"))) <= 2  # the newest, and at most one being replaced
