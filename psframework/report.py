"""psf report: a Markdown report with PNG plots and a CSV of the runs in run and sweep directories.

    psf report RUN_OR_SWEEP_DIR... --out DIR

A run directory holds config.yaml, metrics.jsonl (metrics.jsonl.partial while the run is going on
or after it stopped) and, once finished, summary.json. A sweep directory holds sweep.json, whose
points name their run directories. The report (report.md), the plots (*.png) and one CSV row per
run (runs.csv) go to the --out directory; every file is written atomically. Plotting needs
matplotlib (pip install 'psframework[plot]'); it is imported only when a report is written.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from psframework.cliparse import EXIT_USAGE, Parser
from psframework.fileio import atomic_write, atomic_write_text

PROG = "psf report"
PLOT_HINT = "pip install 'psframework[plot]' installs it"
EXPECTED = "expected a run directory (with config.yaml) or a sweep directory (with sweep.json)"
SWEEP_EXPECTED = "the sweep.json that psf sweep writes"
MiB = float(2 ** 20)
FIGSIZE = (8.0, 5.0)
DPI = 110
MAX_LABEL_KEYS = 4
# The timed parts of an iteration, in the order the split plot stacks them: (metrics key, name).
PARTS = (("wait_s", "wait"), ("decode_s", "decode"), ("encode_s", "encode"), ("compute_s", "compute"),
         ("comm_s", "communication"))
PART_COLORS = {"wait_s": "#d62728", "decode_s": "#9467bd", "encode_s": "#8c564b", "compute_s": "#1f77b4",
               "comm_s": "#ff7f0e"}
ROW_MEANS = ("iteration_s",) + tuple(key for key, _ in PARTS) + ("bytes_sent", "bytes_received")
# Keys that do not tell runs apart in a label or for the straggler twin comparison.
IGNORED_KEYS = ("name",)
IGNORED_PREFIXES = ("output.",)
# Keys that mean nothing for a run in one process.
MPI_ONLY_PREFIXES = ("code.", "stragglers.", "comm.")
SCALAR = (str, int, float, bool, type(None))


class ReportError(Exception):
    """An input or option the report cannot use; the message is the whole error line after `psf report: `."""


@dataclass
class Run:
    """One run: where it is, its flattened config, its metrics rows and its summary (None: unfinished)."""

    dir: str
    config: Dict[str, Any] = field(default_factory=dict)  # dotted keys, such as "code.k"
    rows: List[Dict[str, Any]] = field(default_factory=list)
    summary: Optional[Dict[str, Any]] = None
    overrides: List[str] = field(default_factory=list)  # the sweep point's overrides
    world_size: Optional[int] = None
    repeat: Optional[int] = None  # which repeat of its sweep point the run is (the point's `seed`)
    started: bool = True
    label: str = ""

    @property
    def finished(self) -> bool:
        """Return whether the run wrote its summary."""
        return self.summary is not None

    @property
    def status(self) -> str:
        """Return finished, unfinished or not started."""
        if not self.started:
            return "not started"
        return "finished" if self.finished else "unfinished"

    @property
    def name(self) -> str:
        """Return the run's name (its directory's name when nothing else says)."""
        name = (self.summary or {}).get("name") or self.config.get("name")
        return str(name) if name else os.path.basename(os.path.normpath(self.dir))

    def get(self, key: str) -> Any:
        """Return a summary field, else the config's value of that key, else None."""
        value = (self.summary or {}).get(key)
        return self.config.get(key) if value is None else value


# --- reading runs and sweeps ---------------------------------------------------------------------


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Return a nested mapping as {dotted key: value}; lists and empty mappings stay values."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def read_json(path: str, expected: str) -> Any:
    """Return the JSON document in `path`; ReportError (saying what was `expected`) when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc}), expected {expected}") from None


def read_config(path: str) -> Dict[str, Any]:
    """Return the flattened config of config.yaml; ReportError when it is not a YAML mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            tree = yaml.safe_load(fh)
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ReportError(f"{path}: not valid YAML{at}, expected the resolved config psf train writes") from None
    if not isinstance(tree, dict):
        raise ReportError(f"{path}: holds a {type(tree).__name__}, expected the resolved config (a YAML mapping)")
    return flatten(tree)


def read_rows(path: str) -> List[Dict[str, Any]]:
    """Return the metrics rows of a JSON-lines file, skipping lines that do not parse (a torn last line)."""
    from psframework.metrics import metrics_rows

    try:
        return list(metrics_rows(path))
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None


def load_run(path: str, overrides: Sequence[str] = (), world_size: Optional[int] = None,
             repeat: Optional[int] = None) -> Run:
    """Read a run directory; a run whose metrics are still partial counts as unfinished."""
    run = Run(path, read_config(os.path.join(path, "config.yaml")), overrides=list(overrides),
              world_size=world_size, repeat=repeat)
    partial = os.path.join(path, "metrics.jsonl.partial")
    final = os.path.join(path, "metrics.jsonl")
    metrics = partial if os.path.exists(partial) else final
    if os.path.exists(metrics):
        run.rows = read_rows(metrics)
    summary_path = os.path.join(path, "summary.json")
    if os.path.exists(summary_path) and not os.path.exists(partial):
        summary = read_json(summary_path, "the summary psf train writes")
        if not isinstance(summary, dict):
            raise ReportError(f"{summary_path}: holds a {type(summary).__name__}, expected a JSON object")
        run.summary = summary
        run.world_size = summary.get("world_size", world_size)
    return run


def sweep_points(path: str) -> List[Dict[str, Any]]:
    """Return the points of sweep.json; ReportError when it does not look like one."""
    document = read_json(path, SWEEP_EXPECTED)
    points = document.get("points") if isinstance(document, dict) else None
    if not isinstance(points, list) or not all(isinstance(p, dict) and isinstance(p.get("dir"), str)
                                               for p in points):
        raise ReportError(f"{path}: has no 'points' list of {{\"dir\": ...}} objects, expected {SWEEP_EXPECTED}")
    return points


def load_sweep(path: str) -> List[Run]:
    """Read every point of a sweep directory; a point that has not started yet is listed without data."""
    points = sweep_points(os.path.join(path, "sweep.json"))
    runs = []
    for point in points:
        run_dir = os.path.join(path, point["dir"])
        overrides = [str(o) for o in point.get("overrides") or []]
        world_size = point.get("world_size") if isinstance(point.get("world_size"), int) else None
        repeat = point.get("seed") if isinstance(point.get("seed"), int) else None
        if os.path.isfile(os.path.join(run_dir, "config.yaml")):
            runs.append(load_run(run_dir, overrides, world_size, repeat))
        else:
            config = dict(o.split("=", 1) for o in overrides if "=" in o)
            runs.append(Run(run_dir, config, overrides=overrides, world_size=world_size, repeat=repeat,
                            started=False))
    return runs


def load_inputs(paths: Sequence[str]) -> List[Run]:
    """Read every run and sweep directory given, in order, each run once."""
    runs: List[Run] = []
    for path in paths:
        if not os.path.exists(path):
            raise ReportError(f"{path}: does not exist, {EXPECTED}")
        if not os.path.isdir(path):
            raise ReportError(f"{path}: is a file, {EXPECTED}")
        if os.path.isfile(os.path.join(path, "sweep.json")):
            found = load_sweep(path)
        elif os.path.isfile(os.path.join(path, "config.yaml")):
            found = [load_run(path)]
        else:
            raise ReportError(f"{path}: holds neither config.yaml nor sweep.json, {EXPECTED}")
        if not found:
            raise ReportError(f"{path}: the sweep lists no points, expected at least one run")
        seen = {os.path.realpath(run.dir) for run in runs}
        runs += [run for run in found if os.path.realpath(run.dir) not in seen]
    return runs


# --- what the runs measured ----------------------------------------------------------------------


def number(value: Any) -> Optional[float]:
    """Return a finite number as a float, anything else as None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def steady(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Return the rows without the first iteration's warm-up (all of them when there is only one)."""
    return rows[1:] if len(rows) > 1 else rows


def row_mean(rows: List[Dict[str, Any]], key: str, missing: Optional[float] = None) -> Optional[float]:
    """Return the mean of a field over the rows after warm-up (rows without it count as `missing`)."""
    values = [number(row.get(key, missing)) for row in steady(rows)]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def mean_iteration_s(run: Run) -> Optional[float]:
    """Return the run's mean iteration time: the summary's, else the one of its metrics rows."""
    value = number((run.summary or {}).get("mean_iteration_s"))
    return value if value is not None else row_mean(run.rows, "iteration_s")


def time_split(run: Run, parts: Sequence[str]) -> Optional[Dict[str, float]]:
    """Return the mean seconds of each timed part (a run in one process is all compute), None without rows."""
    if not run.rows:
        return None
    if not any(key in row for row in run.rows for key, _ in PARTS):
        total = row_mean(run.rows, "iteration_s") or 0.0
        return {key: (total if key == "compute_s" else 0.0) for key in parts}
    return {key: row_mean(run.rows, key, 0.0) or 0.0 for key in parts}


def server_bytes(run: Run) -> Optional[Tuple[float, float]]:
    """Return rank 0's mean bytes (sent, received) per iteration, None when the run has no byte counts."""
    summary = run.summary or {}
    sent = row_mean(run.rows, "bytes_sent")
    received = row_mean(run.rows, "bytes_received")
    sent = sent if sent is not None else number(summary.get("server_bytes_sent_per_iteration"))
    received = received if received is not None else number(summary.get("server_bytes_received_per_iteration"))
    if sent is None and received is None:
        return None
    return sent or 0.0, received or 0.0


def evaluations(run: Run) -> List[Dict[str, Any]]:
    """Return the rows that hold a test accuracy."""
    return [row for row in run.rows if number(row.get("test_accuracy")) is not None]


def final_accuracy(run: Run) -> Tuple[Optional[float], bool]:
    """Return the final test accuracy (the last evaluated one for an unfinished run) and whether it is final."""
    if run.finished:
        return number(run.summary.get("final_test_accuracy")), True
    evaluated = evaluations(run)
    return (number(evaluated[-1]["test_accuracy"]) if evaluated else None), False


def iterations(run: Run) -> Optional[int]:
    """Return the run's iterations (the last one logged for an unfinished run)."""
    if run.finished and isinstance(run.summary.get("iterations"), int):
        return run.summary["iterations"]
    return run.rows[-1]["iteration"] if run.rows else None


def scheme_traits(run: Run) -> Tuple[Optional[bool], Optional[bool]]:
    """Return whether the run's scheme uses MPI and whether it codes layers (None: unknown)."""
    if run.world_size is not None:
        mpi: Optional[bool] = run.world_size > 1
    else:
        mpi = None
    try:
        from psframework.schemes.registry import get_scheme

        scheme = get_scheme(str(run.config.get("scheme")))
    except Exception:  # an unknown or renamed scheme: tell what the summary tells
        return mpi, None
    return scheme.mpi if mpi is None else mpi, scheme.coded


def n_and_k(run: Run) -> Tuple[Any, Any]:
    """Return the run's n and k: the summary's, else the config's where its scheme uses them."""
    if run.finished:
        return run.summary.get("n"), run.summary.get("k")
    mpi, coded = scheme_traits(run)
    n = run.config.get("code.n") if mpi is not False else None
    return n, (run.config.get("code.k") if coded is not False and n is not None else None)


# --- labels and straggler twins ------------------------------------------------------------------


def show(value: Any) -> str:
    """Return a config value the way an override writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def label_items(run: Run) -> Dict[str, str]:
    """Return the config values that may tell this run apart from others."""
    mpi, _ = scheme_traits(run)
    items = {}
    for key, value in run.config.items():
        if key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES):
            continue
        if mpi is False and key.startswith(MPI_ONLY_PREFIXES):
            continue
        items[key] = show(value)
    return items


def differing_keys(runs: Sequence[Run], items: Sequence[Dict[str, str]]) -> List[str]:
    """Return the keys whose values differ between runs: scheme, the sweep's overrides, then the rest."""
    order: List[str] = ["scheme"]
    for run in runs:
        order += [o.split("=", 1)[0] for o in run.overrides if "=" in o]
    override_keys = set(order)
    for each in items:
        order += list(each)
    keys = []
    for key in dict.fromkeys(order):
        if len({each[key] for each in items if key in each}) > 1:
            keys.append(key)
    if len(keys) > MAX_LABEL_KEYS:
        keys = [key for key in keys if key in override_keys] or keys[:MAX_LABEL_KEYS]
    return keys


def merge_seeds(runs: Sequence[Run], keys: List[str], items: Sequence[Dict[str, str]]) -> List[str]:
    """Write train.seed and data.seed as one "seed" (the repeat of a sweep point, else the shared value)."""
    if not {"train.seed", "data.seed"} <= set(keys):
        return keys
    seeds = [str(run.repeat) if run.repeat is not None else each.get("train.seed")
             for run, each in zip(runs, items)]
    if any(run.repeat is None and each.get("train.seed") != each.get("data.seed") for run, each in zip(runs, items)):
        return keys
    for each, seed in zip(items, seeds):
        if seed is not None:
            each["seed"] = seed
    return [("seed" if key == "train.seed" else key) for key in keys if key != "data.seed"]


def assign_labels(runs: Sequence[Run]) -> None:
    """Label every run by what differs between the runs (its name when nothing does); labels are unique."""
    items = [label_items(run) for run in runs]
    keys = merge_seeds(runs, differing_keys(runs, items), items)
    labels = [", ".join(f"{key}={each[key]}" for key in keys if key in each) for each in items]
    counts = {label: labels.count(label) for label in labels}
    labels = [label if label and counts[label] == 1 else ", ".join(filter(None, [label, run.name]))
              for label, run in zip(labels, runs)]
    for index, (run, label) in enumerate(zip(runs, labels)):
        run.label = f"{label} #{labels[:index].count(label) + 1}" if labels.count(label) > 1 else label


def stragglers_off(config: Dict[str, Any]) -> bool:
    """Return whether a config injects no stragglers: model none, or a slowdown model that slows nothing."""
    model = str(config.get("stragglers.model", "none"))
    factor = number(config.get("stragglers.factor"))
    factor = 1.0 if factor is None else factor
    if model == "none":
        return True
    if model in ("fixed", "random"):
        return factor <= 1.0
    if model in ("exponential", "pareto"):
        return factor == 0.0
    return factor == 1.0 and number(config.get("stragglers.pause_s")) == 0.0


def twin_key(config: Dict[str, Any]) -> Dict[str, Any]:
    """Return the config without its name, outputs and straggler settings."""
    return {key: value for key, value in config.items() if key not in IGNORED_KEYS
            and not key.startswith(IGNORED_PREFIXES + ("stragglers.",))}


def straggler_pairs(runs: Sequence[Run]) -> Tuple[List[Tuple[Run, Run, float]], List[Run]]:
    """Return (run with stragglers, its straggler-free twin, slowdown) triples and the runs without a twin."""
    pairs, lonely = [], []
    measured = [run for run in runs if run.started and mean_iteration_s(run)]
    for run in measured:
        if stragglers_off(run.config) or scheme_traits(run)[0] is False:
            continue
        key = twin_key(run.config)
        twins = [t for t in measured if t is not run and stragglers_off(t.config) and twin_key(t.config) == key]
        if twins:
            pairs.append((run, twins[0], mean_iteration_s(run) / mean_iteration_s(twins[0])))
        else:
            lonely.append(run)
    return pairs, lonely


# --- plots ---------------------------------------------------------------------------------------


def pyplot() -> Any:
    """Return matplotlib.pyplot on the Agg backend; ReportError with the install hint when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(f"matplotlib is not installed, the plots need it: {PLOT_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new_axes(plt: Any, title: str, xlabel: str, ylabel: str, size: Tuple[float, float] = FIGSIZE) -> Any:
    """Return the axes of a new figure with a title, axis labels and grid lines."""
    fig, ax = plt.subplots(figsize=size, dpi=DPI)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.35)
    ax.set_axisbelow(True)
    return ax


def add_legend(ax: Any, entries: int, longest: int) -> None:
    """Add a legend: inside the axes for a few short entries, else to the right of them."""
    if entries <= 4 and longest <= 30:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


def save_figure(plt: Any, ax: Any, path: str) -> None:
    """Write the figure of `ax` as a PNG atomically and close it."""
    fig = ax.figure
    try:
        fig.tight_layout()
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=DPI), mode="wb")
    finally:
        plt.close(fig)


def curve_label(run: Run) -> str:
    """Return a run's legend entry (unfinished runs say so)."""
    return run.label if run.finished else f"{run.label} ({run.status})"


def wide(runs: Sequence[Run]) -> Tuple[float, float]:
    """Return the figure size: wider when the legend goes beside the axes, taller for a long legend."""
    longest = max((len(curve_label(run)) for run in runs), default=0)
    if len(runs) <= 4 and longest <= 30:
        return FIGSIZE
    return FIGSIZE[0] + min(6.0, 1.0 + 0.07 * longest), min(20.0, max(FIGSIZE[1], 1.0 + 0.2 * len(runs)))


def colors(plt: Any, count: int) -> List[Any]:
    """Return `count` distinct line colours (the default cycle for up to 10)."""
    if count <= 10:
        return [f"C{i}" for i in range(count)]
    cmap = plt.get_cmap("tab20" if count <= 20 else "turbo")
    return [cmap(i / max(1, count - 1)) if count > 20 else cmap(i) for i in range(count)]


def render_curves(plt: Any, runs: Sequence[Run], x: str, y: str, title: str, xlabel: str, ylabel: str,
                  scale: float = 1.0, markers: bool = False) -> Optional[Any]:
    """Return axes with one line per run of field `y` against field `x` (None when no run has both)."""
    shown = [(run, [row for row in run.rows if number(row.get(x)) is not None and number(row.get(y)) is not None])
             for run in runs]
    shown = [(run, rows) for run, rows in shown if rows]
    if not shown:
        return None
    ax = new_axes(plt, title, xlabel, ylabel, wide([run for run, _ in shown]))
    for (run, rows), color in zip(shown, colors(plt, len(shown))):
        ax.plot([row[x] for row in rows], [row[y] * scale for row in rows], label=curve_label(run), color=color,
                marker="o" if markers else None, markersize=4, linewidth=1.4,
                linestyle="-" if run.finished else "--")
    if x == "iteration":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    add_legend(ax, len(shown), max(len(curve_label(run)) for run, _ in shown))
    return ax


def bar_height(count: int) -> Tuple[float, float]:
    """Return the size of a horizontal bar chart of `count` runs."""
    return FIGSIZE[0] + 2.0, min(20.0, max(FIGSIZE[1], 1.5 + 0.45 * count))


def finish_bars(ax: Any, labels: Sequence[str], legend_title: Optional[str]) -> None:
    """Name the bars of a horizontal bar chart (top to bottom) and put its legend beside the axes."""
    positions = list(range(len(labels)))[::-1]
    ax.set_yticks(positions)
    ax.set_yticklabels(labels, fontsize="small")
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False, title=legend_title)
    ax.grid(False, axis="y")


def render_time_split(plt: Any, runs: Sequence[Run]) -> Optional[Any]:
    """Return axes with each run's mean iteration time as a bar stacked by timed part."""
    encode = any("encode_s" in row for run in runs for row in run.rows)
    parts = [(key, name) for key, name in PARTS if key != "encode_s" or encode]
    split = [(run, time_split(run, [key for key, _ in parts])) for run in runs]
    split = [(run, times) for run, times in split if times is not None]
    if not split:
        return None
    ax = new_axes(plt, "Where an iteration's time goes (first iteration left out)", "mean iteration time (ms)",
                  "run", bar_height(len(split)))
    positions = list(range(len(split)))[::-1]
    left = [0.0] * len(split)
    for key, name in parts:
        widths = [times[key] * 1e3 for _, times in split]
        ax.barh(positions, widths, left=left, color=PART_COLORS[key], label=name, height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(0.0, max(left + [1e-3]) * 1.05)
    finish_bars(ax, [curve_label(run) for run, _ in split], "part")
    return ax


def render_server_bytes(plt: Any, runs: Sequence[Run]) -> Optional[Any]:
    """Return axes with rank 0's mean MiB sent and received per iteration, two bars per run."""
    counted = [(run, server_bytes(run)) for run in runs]
    counted = [(run, sizes) for run, sizes in counted if sizes is not None]
    if not counted:
        return None
    ax = new_axes(plt, "Rank 0 traffic per iteration (mean, first iteration left out)", "MiB per iteration",
                  "run", bar_height(len(counted)))
    positions = list(range(len(counted)))[::-1]
    for offset, index, name, color in ((0.2, 0, "sent", "#1f77b4"), (-0.2, 1, "received", "#ff7f0e")):
        values = [sizes[index] / MiB for _, sizes in counted]
        bars = ax.barh([p + offset for p in positions], values, height=0.38, label=name, color=color)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], padding=2, fontsize="x-small")
    ax.set_xlim(0.0, max(max(sizes) for _, sizes in counted) / MiB * 1.15 or 1.0)
    finish_bars(ax, [curve_label(run) for run, _ in counted], "rank 0")
    return ax


def render_slowdown(plt: Any, pairs: Sequence[Tuple[Run, Run, float]]) -> Optional[Any]:
    """Return axes with each straggler run's slowdown against its straggler-free twin."""
    if not pairs:
        return None
    ax = new_axes(plt, "Straggler slowdown against the straggler-free twin",
                  "slowdown (mean iteration time / twin's, x)", "run with stragglers", bar_height(len(pairs)))
    positions = list(range(len(pairs)))[::-1]
    ratios = [ratio for _, _, ratio in pairs]
    bars = ax.barh(positions, ratios, height=0.6, color="#d62728", label="with stragglers / straggler-free twin")
    ax.bar_label(bars, labels=[slowdown_text(r) for r in ratios], padding=3, fontsize="small")
    ax.axvline(1.0, color="black", linewidth=1.0, linestyle="--", label="no slowdown (1x)")
    ax.set_xlim(0.0, max(ratios + [1.0]) * 1.2)
    finish_bars(ax, [run.label for run, _, _ in pairs], None)
    return ax


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its file, caption, what it shows and why it may be missing."""

    file: str
    caption: str
    sentence: str
    missing: str
    draw: Callable[[Any, Sequence[Run], Any], Optional[Any]]


PLOTS = (
    Plot("loss_vs_iteration.png", "Training loss against iteration",
         "Training loss of each run at every iteration (dashed: runs that have not finished).",
         "No run has logged a training loss yet, so there is no loss plot.",
         lambda plt, runs, _: render_curves(plt, runs, "iteration", "loss", "Training loss against iteration",
                                            "iteration", "training loss")),
    Plot("loss_vs_time.png", "Training loss against wall time",
         "Training loss of each run against the seconds since the run started.",
         "No run has logged a training loss with its wall time yet, so there is no loss-against-time plot.",
         lambda plt, runs, _: render_curves(plt, runs, "wall_s", "loss", "Training loss against wall time",
                                            "wall time (s)", "training loss")),
    Plot("accuracy_vs_iteration.png", "Test accuracy against iteration",
         "Test accuracy at each evaluated iteration of each run.",
         "No run has been evaluated yet, so there are no accuracy plots.",
         lambda plt, runs, _: render_curves(plt, runs, "iteration", "test_accuracy", "Test accuracy against "
                                            "iteration", "iteration", "test accuracy (%)", 100.0, True)),
    Plot("accuracy_vs_time.png", "Test accuracy against wall time",
         "Test accuracy at each evaluation against the seconds since the run started.",
         "",
         lambda plt, runs, _: render_curves(plt, runs, "wall_s", "test_accuracy", "Test accuracy against wall "
                                            "time", "wall time (s)", "test accuracy (%)", 100.0, True)),
    Plot("iteration_time_split.png", "Mean iteration time split into its parts",
         "Mean iteration time of each run (first iteration left out), split into waiting for workers, decoding, "
         "encoding, rank 0's own compute and communication; a single-process run is all compute.",
         "No run has logged an iteration yet, so there is no iteration time split.",
         lambda plt, runs, _: render_time_split(plt, runs)),
    Plot("server_bytes.png", "Rank 0 bytes per iteration",
         "Mean MiB that rank 0 sent and received per iteration (first iteration left out), for the runs that "
         "counted bytes.",
         "No run counted rank 0's bytes (single-process runs send none), so there is no traffic plot.",
         lambda plt, runs, _: render_server_bytes(plt, runs)),
    Plot("straggler_slowdown.png", "Straggler slowdown",
         "Mean iteration time of each run with stragglers divided by that of its straggler-free twin "
         "(the same config with stragglers off).",
         "",
         lambda plt, runs, pairs: render_slowdown(plt, pairs)),
)


def write_plots(out: str, runs: Sequence[Run], pairs: Sequence[Tuple[Run, Run, float]]) -> List[Tuple[Plot, bool]]:
    """Draw every plot that has data into `out`; return each plot with whether it was written."""
    plt = pyplot()
    written = []
    for plot in PLOTS:
        ax = plot.draw(plt, runs, pairs)
        if ax is not None:
            save_figure(plt, ax, os.path.join(out, plot.file))
        written.append((plot, ax is not None))
    return written


# --- report.md and runs.csv ----------------------------------------------------------------------


def slowdown_text(ratio: float) -> str:
    """Return a slowdown the way the report writes it."""
    return f"{ratio:.2f}x"


def cell(value: Any) -> str:
    """Return a value for a Markdown table cell."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def ms(seconds: Optional[float]) -> str:
    """Return seconds as milliseconds for a table ('-' when unknown)."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def run_table(runs: Sequence[Run]) -> List[str]:
    """Return the Markdown table of the runs."""
    lines = ["| run | scheme | n | k | iterations | final test accuracy | mean iteration (ms) | status | directory |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        n, k = n_and_k(run)
        accuracy, final = final_accuracy(run)
        shown = "-" if accuracy is None else f"{accuracy:.4f}" + ("" if final else " (last)")
        lines.append(f"| {cell(run.label)} | {cell(run.get('scheme'))} | {cell(n)} | {cell(k)} | "
                     f"{cell(iterations(run))} | {shown} | {ms(mean_iteration_s(run))} | {run.status} | "
                     f"`{run.dir}` |")
    return lines


def slowdown_section(pairs: Sequence[Tuple[Run, Run, float]], lonely: Sequence[Run]) -> List[str]:
    """Return the straggler section: the table of slowdowns, or why there is none."""
    lines = ["## Straggler slowdown", ""]
    if pairs:
        lines += ["| run with stragglers | straggler-free twin | mean iteration (ms) | twin's (ms) | slowdown |",
                  "|---|---|---|---|---|"]
        lines += [f"| {cell(run.label)} | {cell(twin.label)} | {ms(mean_iteration_s(run))} | "
                  f"{ms(mean_iteration_s(twin))} | {slowdown_text(ratio)} |" for run, twin, ratio in pairs]
        lines.append("")
    if lonely:
        lines.append("No straggler-free twin was found for " + ", ".join(run.label for run in lonely) +
                     " (a twin has the same config except `stragglers.*`, with stragglers off).")
    elif not pairs:
        lines.append("No straggler-free twin was found: no run with stragglers has a run with the same config "
                     "except `stragglers.*` and stragglers off (model none, or factor 1).")
    return lines + [""]


def render_report(paths: Sequence[str], runs: Sequence[Run], plots: Sequence[Tuple[Plot, bool]],
                  pairs: Sequence[Tuple[Run, Run, float]], lonely: Sequence[Run]) -> str:
    """Return report.md."""
    finished = sum(run.finished for run in runs)
    lines = ["# Training report", "",
             f"{len(runs)} run(s), {finished} finished, from " + ", ".join(f"`{p}`" for p in paths) + ".",
             "Every run's summary is in [runs.csv](runs.csv).", "", "## Runs", ""]
    lines += run_table(runs) + [""] + timeline_lines(runs) + ["## Plots", ""]
    for plot, written in plots:
        if written:
            lines += [f"![{plot.caption}]({plot.file})", "", plot.sentence, ""]
        elif plot.missing:
            lines += [plot.missing, ""]
    lines += slowdown_section(pairs, lonely)
    return "\n".join(lines)


def timeline_lines(runs: Sequence[Run]) -> List[str]:
    """Return the lines that link each run's timeline (trace.json, written with output.trace), if any."""
    traces = [path for path in (os.path.join(run.dir, "trace.json") for run in runs) if os.path.exists(path)]
    if not traces:
        return []
    return (["## Timelines", "", "Per-rank timelines (Chrome trace-event JSON: open them in Perfetto or "
             "chrome://tracing):", ""] + [f"- [{path}]({os.path.abspath(path)})" for path in traces] + [""])


def csv_rows(runs: Sequence[Run]) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Return the CSV header and one row per run: label, directory, overrides, summary scalars, metric means."""
    header: Dict[str, None] = dict.fromkeys(["label", "status", "dir", "overrides"])
    means = {"metrics_rows"}
    rows = []
    for run in runs:
        row: Dict[str, Any] = {"label": run.label, "status": run.status, "dir": run.dir,
                               "overrides": " ".join(run.overrides)}
        for key, value in (run.summary or {}).items():
            if isinstance(value, SCALAR) and key not in row:
                row[key] = value
        header.update(dict.fromkeys(row))
        row["metrics_rows"] = len(run.rows)
        for key in ROW_MEANS:
            mean = row_mean(run.rows, key)
            if mean is not None:
                row[f"metrics_mean_{key}"] = mean
                means.add(f"metrics_mean_{key}")
        rows.append(row)
    order = ["metrics_rows"] + [f"metrics_mean_{key}" for key in ROW_MEANS]
    return list(header) + [key for key in order if key in means and key not in header], rows


def render_csv(runs: Sequence[Run]) -> str:
    """Return runs.csv."""
    header, rows = csv_rows(runs)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# --- command line --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of psf report."""
    parser = Parser(prog=PROG, description="Write a Markdown report (report.md) with PNG plots and a CSV of "
                    "every run's summary (runs.csv) for run and sweep directories.")
    parser.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR",
                        help="a run directory (config.yaml, metrics.jsonl) or a sweep directory (sweep.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the report (created if missing)")
    return parser


def make_out(out: str) -> None:
    """Create the output directory; ReportError when it cannot be one."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ReportError(f"{out}: is a file, expected a directory for the report (--out)")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"{out}: cannot be created ({exc.strerror}), expected a directory for the report") from None


def write_report(paths: Sequence[str], out: str) -> str:
    """Read the runs, write the report, plots and CSV into `out`; return the line that says what was written."""
    pyplot()  # fail before any work when matplotlib is missing
    runs = load_inputs(paths)
    assign_labels(runs)
    pairs, lonely = straggler_pairs(runs)
    make_out(out)
    plots = write_plots(out, runs, pairs)
    atomic_write_text(os.path.join(out, "runs.csv"), render_csv(runs))
    atomic_write_text(os.path.join(out, "report.md"), render_report(paths, runs, plots, pairs, lonely))
    count = sum(written for _, written in plots)
    return f"{PROG}: wrote report.md, runs.csv and {count} plots to {out}"


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Run psf report; return the exit status."""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help, or a usage error already printed as one line
        return int(exc.code or 0)
    try:
        line = write_report(args.dirs, args.out)
    except ReportError as exc:
        print(f"psf: error: {PROG}: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    print(line, flush=True)
    return 0
