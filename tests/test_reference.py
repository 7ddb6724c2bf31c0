"""The single-process reference trainer: accuracy, determinism and run outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from psframework.cli import main


def read_losses(run_dir: str) -> list:
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line)["loss"] for line in fh]


def test_same_seed_gives_identical_losses(tmp_path, configs_dir):
    config = os.path.join(configs_dir, "digits_reference.yaml")
    common = [f"output.dir={tmp_path}", "output.progress=off", "train.max_iterations=30"]
    assert main(["train", config, "name=a"] + common) == 0
    assert main(["train", config, "name=b"] + common) == 0
    assert main(["train", config, "name=c", "train.seed=1"] + common) == 0
    a, b, c = (read_losses(str(tmp_path / x)) for x in "abc")
    assert len(a) == 30 and a == b
    assert a != c


def test_digits_reaches_95_percent_in_5_epochs_with_complete_outputs(tmp_path, configs_dir):
    config = os.path.join(configs_dir, "digits_reference.yaml")
    # Through the installed console entry point, as a user runs it.
    proc = subprocess.run([sys.executable, "-m", "psframework", "train", config, f"output.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "digits_reference"
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("scheme", "world_size", "n", "k", "iterations", "final_test_accuracy", "mean_iteration_s",
                "server_bytes_sent", "server_bytes_received", "wall_s"):
        assert key in summary
    assert summary["scheme"] == "reference" and summary["world_size"] == 1
    assert summary["final_test_accuracy"] >= 0.95
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == summary["iterations"] and rows[-1]["epoch"] == 4
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert sum("test_accuracy" in r for r in rows) == 5
    assert (run_dir / "config.yaml").read_text().startswith("name: digits_reference")
    leftovers = [p for p in os.listdir(run_dir) if p.endswith((".tmp", ".partial"))]
    assert leftovers == []
    assert "test accuracy" in proc.stderr


def test_bad_config_exits_2_with_one_line(tmp_path, configs_dir):
    config = os.path.join(configs_dir, "digits_reference.yaml")
    proc = subprocess.run([sys.executable, "-m", "psframework", "train", config, "data.batch_size=-3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "psf: error: data.batch_size: got -3, expected a positive integer"


def test_batch_larger_than_dataset_is_a_clear_error(tmp_path, configs_dir, capsys):
    config = os.path.join(configs_dir, "digits_reference.yaml")
    assert main(["train", config, "data.batch_size=5000", f"output.dir={tmp_path}"]) == 2
    assert "larger than the 1438 training samples" in capsys.readouterr().err


def test_resume_from_a_checkpoint_gives_the_uninterrupted_losses(tmp_path, configs_dir):
    config = os.path.join(configs_dir, "digits_reference.yaml")
    common = [config, "train.checkpoint_every=20", "train.max_iterations=40", f"output.dir={tmp_path}",
              "output.progress=off"]
    assert main(["train", *common, "name=whole"]) == 0
    checkpoint = tmp_path / "whole" / "checkpoint-20.pt"
    assert checkpoint.is_file() and (tmp_path / "whole" / "checkpoint.pt").is_file()
    assert main(["train", *common, "name=resumed", f"train.resume={checkpoint}"]) == 0

    def losses(name):
        return {row["iteration"]: row["loss"] for row in map(json.loads, (tmp_path / name / "metrics.jsonl").open())}

    whole, resumed = losses("whole"), losses("resumed")
    assert sorted(resumed) == list(range(21, 41))
    assert [resumed[i] for i in range(21, 41)] == [whole[i] for i in range(21, 41)]
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["start_iteration"] == 20 and summary["iterations"] == 40
