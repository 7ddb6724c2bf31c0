"""Watching a run: TensorBoard scalars written from the metrics rows, across a preemption and its resume."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from mpiutil import describe, run_psf
from test_preempt import interrupt
from psframework.comm.timeline import Span, Timeline, newest_of_job, trace_events
from psframework.metrics import row_scalars, scalar_tag
from psframework.runtime.preempt import EXIT_PREEMPTED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def board_scalars(log_dir) -> dict:
    """Return {tag: [(step, value), ...]} of every event file below `log_dir`, read back with TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    board.Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


def test_the_tags_of_a_row_name_what_they_hold():
    row = {"iteration": 3, "epoch": 0, "batch": 2, "loss": 1.5, "lr": 0.1, "iteration_s": 0.02, "bytes_sent": 10,
           "used": [[1, 2, 3], [2, 3, 4]], "test_accuracy": 0.9, "straggler_delays": {}, "workers_live": 4}
    assert row_scalars(row) == {"train/loss": 1.5, "train/lr": 0.1, "time/iteration_s": 0.02,
                                "comm/bytes_sent": 10.0, "test/accuracy": 0.9, "workers/live": 4.0,
                                "workers/used": 4.0}
    assert scalar_tag("iteration") is None and scalar_tag("decode_s") == "time/decode_s"


def recorded_iterations(timeline: Timeline, iterations) -> list:
    """Record one compute span in each of `iterations`; return the iterations the timeline keeps."""
    for i in iterations:
        timeline.begin(i)
        timeline.add("compute", "compute", 0.0, 0.001)
    return [s.iteration for s in timeline.spans]


def test_the_ring_keeps_the_newest_iterations_and_the_window_its_own():
    ring, window, off = Timeline(), Timeline(), Timeline()
    ring.configure(True, keep=3)
    window.configure(True, keep=3, window=(4, 6))
    assert recorded_iterations(ring, range(1, 11)) == [8, 9, 10]
    assert recorded_iterations(window, range(1, 11)) == [4, 5, 6]
    assert recorded_iterations(off, range(1, 11)) == [] and off.span("send") is off.span("wait")


def test_the_job_keeps_its_newest_iterations_though_a_rank_stopped_early():
    """A worker detached at iteration 6 still holds 2..6 in its own ring of 5; the job's ring is 6..10."""
    def spans(first, last):
        return [Span(i, "step", "compute", "compute", float(i), 0.001) for i in range(first, last + 1)]

    kept = newest_of_job([spans(6, 10), spans(2, 6), []], keep=5)
    assert [[s.iteration for s in rank] for rank in kept] == [[6, 7, 8, 9, 10], [6], []]
    events = trace_events(kept, ["rank 0 (server)", "rank 1 (worker)", "rank 2 (worker)"])
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
    assert {e["args"]["iteration"] for e in events if e["ph"] == "X"} == {6, 7, 8, 9, 10}


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_tensorboard_holds_every_loss_of_the_metrics_across_a_resume(tmp_path):
    args = [os.path.join("configs", "digits_sazd.yaml"), "train.epochs=2", f"output.dir={tmp_path}",
            "output.progress=off", "output.tensorboard=true", "name=watched"]
    run_dir = tmp_path / "watched"
    status, err = interrupt(5, args, run_dir / "metrics.jsonl.partial", 30)
    assert status == EXIT_PREEMPTED, err
    first = board_scalars(run_dir / "tensorboard")["train/loss"]
    assert first and [s for s, _ in first] == list(range(1, len(first) + 1))
    resumed = run_psf(5, ["train", *args, "train.resume=auto"], timeout=200)
    assert resumed.returncode == 0, describe(resumed)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scalars = board_scalars(run_dir / "tensorboard")
    steps = [s for s, _ in scalars["train/loss"]]
    assert steps == [r["iteration"] for r in rows] == list(range(1, 89))  # every step once: no duplicates
    assert np.array_equal(np.float32([v for _, v in scalars["train/loss"]]), np.float32([r["loss"] for r in rows]))
    assert [s for s, _ in scalars["test/accuracy"]] == [r["iteration"] for r in rows if "test_accuracy" in r]
    assert {"train/lr", "time/iteration_s", "time/wait_s", "time/decode_s", "comm/bytes_sent", "workers/used",
            "workers/live"} <= set(scalars)


def test_tensorboard_without_its_package_is_one_line(monkeypatch, tmp_path, capsys):
    import importlib.util

    from psframework.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert main(["train", os.path.join(ROOT, "configs", "digits_reference.yaml"), f"output.dir={tmp_path}",
                 "output.tensorboard=true"]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert line == ("psf: error: output.tensorboard: true needs the tensorboard package, which is not installed; "
                    "expected pip install 'psframework[tensorboard]' (or output.tensorboard: false)")


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_the_timeline_holds_every_rank_its_waits_and_a_frozen_worker_as_a_gap(tmp_path):
    """Rank 2 is stopped (SIGSTOP) for 1 s in every 2.5 s: its row of compute spans has gaps that long, the
    others' do not; rank 0's wait spans of the recorded steps add up to the metrics' wait_s. The ring of 300
    iterations spans several seconds, so it holds at least one freeze."""
    args = ["train", os.path.join(ROOT, "configs", "digits_sazd.yaml"), f"output.dir={tmp_path}", "name=traced",
            "output.progress=off", "output.trace=true", "output.trace_iterations=300", "train.epochs=12",
            "stragglers.model=freeze", "stragglers.ranks=[2]", "stragglers.pause_s=1.0", "stragglers.duty=0.4",
            "comm.timeout_s=30"]
    proc = run_psf(5, args, timeout=250)
    assert proc.returncode == 0, describe(proc)
    run_dir = tmp_path / "traced"
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] in ("X", "i")]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3, 4}
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[0] == "rank 0 (server)" and names[3] == "rank 3 (worker)"
    recorded = {e["args"]["iteration"] for e in spans}
    assert len(recorded) == 300 and max(recorded) == 528  # the ring of the newest 300 iterations
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    wait = sum(r["wait_s"] for r in rows if r["iteration"] in recorded)
    traced = sum(e["dur"] for e in spans if e["pid"] == 0 and e["cat"] == "wait" and e["args"]["phase"] == "step")
    assert traced / 1e6 == pytest.approx(wait, rel=0.05)

    def longest_gap(pid):
        starts = sorted(e["ts"] for e in spans if e["pid"] == pid and e["cat"] == "compute")
        return max(b - a for a, b in zip(starts, starts[1:])) / 1e6

    assert longest_gap(2) >= 0.8, longest_gap(2)
    assert longest_gap(1) < 0.5 and longest_gap(3) < 0.5, (longest_gap(1), longest_gap(3))
    from psframework.cli import main

    assert main(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"]({run_dir / 'trace.json'})" in report and "## Timelines" in report
