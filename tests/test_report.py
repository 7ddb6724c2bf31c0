"""psf report: report.md, runs.csv and readable PNG plots from run and sweep directories."""

from __future__ import annotations

import csv
import json
import os
import re
import struct
import sys

import pytest
import yaml

from psframework import report, report_labels, report_plots, report_runs
from psframework.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "configs", "digits_reference.yaml")
PLOTS = ("loss_vs_iteration.png", "loss_vs_time.png", "accuracy_vs_iteration.png", "accuracy_vs_time.png",
         "iteration_time_split.png", "server_bytes.png", "straggler_slowdown.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ITERATIONS = 20


def config(k: int, factor: float) -> dict:
    """Return the resolved config of a synthetic coded run with n=4 workers."""
    return {"name": f"k{k}-f{factor:g}", "scheme": "sazd", "device": "cpu",
            "data": {"dataset": "digits", "batch_size": 32, "seed": 0},
            "model": {"name": "lenet5"}, "train": {"epochs": 5, "lr": 0.02, "seed": 0},
            "code": {"n": 4, "k": k},
            "stragglers": {"model": "fixed", "factor": float(factor), "pause_s": 0.5, "ranks": [1]},
            "output": {"dir": "sweeps/s", "progress": "off"}}


def rows(k: int, factor: float, count: int = ITERATIONS) -> list:
    """Return metrics rows whose stragglers make the wait (and so the iteration) `factor` times longer."""
    out, wall = [], 0.0
    for i in range(1, count + 1):
        wait = 0.004 * factor + 0.0001 * (i % 3)
        parts = {"wait_s": wait, "comm_s": 0.003, "decode_s": 0.001 * k, "encode_s": 0.0005, "compute_s": 0.006}
        iteration_s = sum(parts.values()) + (0.4 if i == 1 else 0.0)
        parts["compute_s"] += 0.4 if i == 1 else 0.0
        wall += iteration_s
        loss = 2.3 / (1 + 0.1 * i * k) + 0.05 * factor
        row = {"iteration": i, "epoch": 0, "batch": i - 1, "loss": loss, "iteration_s": iteration_s, "wall_s": wall,
               **parts, "bytes_sent": 400_000 * k, "bytes_received": 300_000 * k, "used": [[1, 2]]}
        if i % 5 == 0:
            row.update(test_accuracy=min(0.99, 0.2 + 0.03 * i + 0.05 * k), test_loss=1.5)
        out.append(row)
    return out


def mean_iteration_s(metrics: list) -> float:
    steady = metrics[1:]
    return sum(row["iteration_s"] for row in steady) / len(steady)


def summary(cfg: dict, metrics: list) -> dict:
    steady = metrics[1:]
    return {"scheme": cfg["scheme"], "name": cfg["name"], "model": "lenet5", "dataset": "digits", "world_size": 5,
            "n": 4, "k": cfg["code"]["k"], "iterations": len(metrics), "start_iteration": 0,
            "final_test_accuracy": metrics[-1]["test_accuracy"], "final_test_loss": 1.5,
            "mean_iteration_s": mean_iteration_s(metrics),
            "mean_wait_s": sum(row["wait_s"] for row in steady) / len(steady),
            "server_bytes_sent": sum(row["bytes_sent"] for row in metrics),
            "server_bytes_received": sum(row["bytes_received"] for row in metrics),
            "server_bytes_sent_per_iteration": steady[0]["bytes_sent"],
            "server_bytes_received_per_iteration": steady[0]["bytes_received"],
            "membership": [], "workers": {"1": {"updates": 20}}, "wall_s": metrics[-1]["wall_s"]}


def write_point(directory, k: int, factor: float, finished: bool) -> list:
    """Write a synthetic run directory: finished, or stopped with a torn last metrics line."""
    os.makedirs(directory)
    cfg = config(k, factor)
    with open(os.path.join(directory, "config.yaml"), "w") as fh:
        yaml.safe_dump(cfg, fh, sort_keys=False)
    metrics = rows(k, factor, ITERATIONS if finished else 12)
    lines = "".join(json.dumps(row) + "\n" for row in metrics)
    if finished:
        with open(os.path.join(directory, "metrics.jsonl"), "w") as fh:
            fh.write(lines)
        with open(os.path.join(directory, "summary.json"), "w") as fh:
            json.dump(summary(cfg, metrics), fh)
    else:
        with open(os.path.join(directory, "metrics.jsonl.partial"), "w") as fh:
            fh.write(lines + '{"iteration": 13, "epoch": 0, "lo')
    return metrics


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2x2 sweep over code.k and stragglers.factor; the point k=3, factor=4 stopped after 12 iterations."""
    base = tmp_path_factory.mktemp("sweep") / "s"
    points, metrics = [], {}
    for k in (2, 3):
        for factor in (1, 4):
            name = f"code.k={k},stragglers.factor={factor}"
            metrics[(k, factor)] = write_point(base / name, k, factor, finished=(k, factor) != (3, 4))
            points.append({"name": name, "overrides": [f"code.k={k}", f"stragglers.factor={factor}"], "seed": None,
                           "dir": name, "world_size": 5})
    document = {"sweep": "s", "config": "configs/digits_sazd.yaml", "overrides": ["train.epochs=1"],
                "grid": {"code.k": ["2", "3"], "stragglers.factor": ["1", "4"]}, "repeat": 1, "points": points}
    (base / "sweep.json").write_text(json.dumps(document))
    return base, metrics


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """A real single-process run of 6 iterations, evaluated every 2."""
    out = tmp_path_factory.mktemp("runs")
    assert main(["train", DIGITS, "train.max_iterations=6", "train.eval_every=2", f"output.dir={out}", "name=a",
                 "output.progress=off"]) == 0
    return out / "a"


def check_png(path) -> None:
    """Assert that `path` is a PNG of sensible size that is not blank."""
    import matplotlib.image

    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    assert 400 <= width <= 3000 and 400 <= height <= 3000, (path, width, height)
    assert os.path.getsize(path) > 5000, path
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0, path


def embedded(markdown: str) -> list:
    return re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", markdown)


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert err[0].startswith("psf: error: psf report:"), err[0]
    assert "Traceback" not in captured.err
    return err[0]


@pytest.fixture(scope="module")
def written(sweep, reference_run, tmp_path_factory):
    """The report of the sweep and the reference run, written through the psf command line."""
    out = tmp_path_factory.mktemp("report") / "out"
    status = main(["report", str(reference_run), str(sweep[0]), "--out", str(out)])
    return status, out


def test_the_report_embeds_every_plot_and_each_one_is_a_readable_png(written):
    status, out = written
    assert status == 0
    markdown = (out / "report.md").read_text()
    assert set(PLOTS) <= set(embedded(markdown))
    for name in embedded(markdown):
        check_png(out / name)
    assert set(PLOTS) <= set(os.listdir(out))
    assert not [name for name in os.listdir(out) if name.endswith(".tmp")]


def test_runs_csv_has_one_row_per_run_with_its_label_and_summary(written, sweep, reference_run):
    _, out = written
    with open(out / "runs.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    labels = [row["label"] for row in table]
    assert labels == ["scheme=reference", "scheme=sazd, code.k=2, stragglers.factor=1",
                      "scheme=sazd, code.k=2, stragglers.factor=4", "scheme=sazd, code.k=3, stragglers.factor=1",
                      "scheme=sazd, code.k=3, stragglers.factor=4"]
    header = list(table[0])
    assert header[:4] == ["label", "status", "dir", "overrides"]
    assert header.index("server_bytes_sent_per_iteration") < header.index("metrics_rows")  # summary, then means
    assert "final_test_accuracy" in header and "metrics_mean_wait_s" in header
    assert table[0]["dir"] == str(reference_run) and table[0]["status"] == "finished"
    assert float(table[0]["final_test_accuracy"]) > 0
    assert table[1]["overrides"] == "code.k=2 stragglers.factor=1"
    assert "membership" not in table[0] and "workers" not in table[0]  # lists and mappings are left out
    unfinished = table[4]
    assert unfinished["status"] == "unfinished" and unfinished["final_test_accuracy"] == ""
    assert unfinished["metrics_rows"] == "12"  # the torn 13th line is skipped


def test_the_slowdown_is_the_ratio_to_the_straggler_free_twin(written, sweep):
    _, out = written
    _, metrics = sweep
    ratio = mean_iteration_s(metrics[(2, 4)]) / mean_iteration_s(metrics[(2, 1)])
    markdown = (out / "report.md").read_text()
    line = [row for row in markdown.splitlines() if row.startswith("| scheme=sazd, code.k=2, stragglers.factor=4 |")
            and "x |" in row]
    assert len(line) == 1 and "| scheme=sazd, code.k=2, stragglers.factor=1 |" in line[0]
    text = report_plots.slowdown_text(ratio)
    assert f"| {text} |" in line[0] and text == f"{ratio:.2f}x"


def test_the_unfinished_point_is_listed_as_unfinished(written):
    _, out = written
    markdown = (out / "report.md").read_text()
    row = [line for line in markdown.splitlines() if line.startswith("| scheme=sazd, code.k=3, stragglers.factor=4 |")
           and "| unfinished |" in line]
    assert len(row) == 1
    assert "(last)" in row[0]  # its accuracy is the last evaluated one, not a final one


def test_a_sweep_alone_is_labelled_by_its_grid(sweep, tmp_path, capsys):
    assert report.main([str(sweep[0]), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == f"psf report: wrote report.md, runs.csv and 7 plots to {tmp_path / 'out'}"
    with open(tmp_path / "out" / "runs.csv", newline="") as fh:
        labels = [row["label"] for row in csv.DictReader(fh)]
    assert labels[:2] == ["code.k=2, stragglers.factor=1", "code.k=2, stragglers.factor=4"]


def test_a_single_run_is_named_and_its_missing_plots_are_explained(reference_run, tmp_path, capsys):
    out = tmp_path / "deep" / "out"
    assert report.main([str(reference_run), "--out", str(out)]) == 0
    assert "and 5 plots" in capsys.readouterr().out
    markdown = (out / "report.md").read_text()
    assert "| a | reference |" in markdown
    assert "no traffic plot" in markdown and "No straggler-free twin was found" in markdown
    assert not (out / "server_bytes.png").exists() and not (out / "straggler_slowdown.png").exists()
    for name in embedded(markdown):
        check_png(out / name)


def test_a_point_not_started_yet_is_listed(sweep, tmp_path):
    base = tmp_path / "s"
    document = json.loads((sweep[0] / "sweep.json").read_text())
    for point in document["points"]:
        point["dir"] = str(sweep[0] / point["dir"])  # absolute directories stay as they are
    document["points"].append({"name": "code.k=4", "overrides": ["code.k=4"], "seed": None, "dir": "later"})
    base.mkdir()
    (base / "sweep.json").write_text(json.dumps(document))
    assert report.main([str(base), "--out", str(tmp_path / "out")]) == 0
    assert "| not started |" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("case", ["missing", "file", "empty", "bad sweep", "no points"])
def test_an_input_that_is_not_a_run_or_sweep_is_one_error_line(case, tmp_path, capsys):
    path = tmp_path / "input"
    if case == "file":
        path.write_text("x")
    elif case == "empty":
        path.mkdir()
    elif case == "bad sweep":
        path.mkdir()
        (path / "sweep.json").write_text("{not json")
    elif case == "no points":
        path.mkdir()
        (path / "sweep.json").write_text(json.dumps({"sweep": "s", "points": []}))
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "expected" in line
    assert not (tmp_path / "out").exists()


def test_options_missing_are_one_error_line(capsys):
    assert report.main(["somewhere"]) == 2
    assert "--out" in one_error_line(capsys)


def test_without_matplotlib_the_error_says_how_to_install_it(reference_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert report.main([str(reference_run), "--out", str(tmp_path / "out")]) == 2
    assert "pip install 'psframework[plot]'" in one_error_line(capsys)


def test_repeats_are_labelled_by_seed_and_each_pairs_with_the_twin_of_its_seed():
    def run(factor: int, seed: int) -> report_runs.Run:
        cfg = {"name": f"r{factor}{seed}", "scheme": "sazd", "code.k": 2, "stragglers.model": "fixed",
               "stragglers.factor": float(factor), "train.seed": 10 + seed, "data.seed": 20 + seed, "output.dir": "x"}
        metrics = [{"iteration": i, "iteration_s": (1.0 if i == 1 else 0.01 * factor * (1 + seed))} for i in (1, 2, 3)]
        return report_runs.Run(f"d{factor}{seed}", cfg, metrics, None,
                               [f"stragglers.factor={factor}", f"train.seed={10 + seed}", f"data.seed={20 + seed}"],
                               world_size=5, repeat=seed)

    runs = [run(factor, seed) for factor in (1, 3) for seed in (0, 1)]
    report_labels.assign_labels(runs)
    assert [r.label for r in runs] == ["stragglers.factor=1, seed=0", "stragglers.factor=1, seed=1",
                                       "stragglers.factor=3, seed=0", "stragglers.factor=3, seed=1"]
    pairs, lonely = report_labels.straggler_pairs(runs)
    assert [(a.label, b.label, round(ratio, 6)) for a, b, ratio in pairs] == [
        ("stragglers.factor=3, seed=0", "stragglers.factor=1, seed=0", 3.0),
        ("stragglers.factor=3, seed=1", "stragglers.factor=1, seed=1", 3.0)]
    assert not lonely


@pytest.mark.parametrize("stragglers, off", [({"stragglers.model": "none", "stragglers.factor": 4.0}, True),
                                             ({"stragglers.model": "fixed", "stragglers.factor": 1.0}, True),
                                             ({"stragglers.model": "fixed", "stragglers.factor": 4.0}, False),
                                             ({"stragglers.model": "exponential", "stragglers.factor": 0.0}, True),
                                             ({"stragglers.model": "freeze", "stragglers.pause_s": 0.5}, False)])
def test_which_configs_count_as_straggler_free(stragglers, off):
    assert report_labels.stragglers_off(stragglers) is off


def test_runs_that_nothing_tells_apart_get_numbered_labels():
    runs = [report_runs.Run(f"d{i}", {"name": "same", "scheme": "sazd"}) for i in range(3)]
    report_labels.assign_labels(runs)
    assert [r.label for r in runs] == ["same #1", "same #2", "same #3"]
