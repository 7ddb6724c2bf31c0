"""psf report: a Markdown report with PNG plots and a CSV of the runs in run and sweep directories.

    psf report RUN_OR_SWEEP_DIR... --out DIR

A run directory holds config.yaml, metrics.jsonl (metrics.jsonl.partial while the run is going on
or after it stopped) and, once finished, summary.json. A sweep directory holds sweep.json, whose
points name their run directories. The report (report.md), the plots (*.png) and one CSV row per
run (runs.csv) go to the --out directory; every file is written atomically. Plotting needs
matplotlib (pip install 'psframework[plot]'); it is imported only when a report is written.

This module writes report.md and runs.csv and holds the command line; the runs are read in
report_runs.py, labelled and paired with their straggler-free twins in report_labels.py and drawn in
report_plots.py.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from psframework.cliparse import EXIT_USAGE, Parser
from psframework.fileio import atomic_write_text
from psframework.report_labels import assign_labels, straggler_pairs
from psframework.report_plots import Plot, pyplot, slowdown_text, write_plots
from psframework.report_runs import (PARTS, ReportError, Run, final_accuracy, iterations, load_inputs,
                                     mean_iteration_s, n_and_k, row_mean)

PROG = "psf report"
ROW_MEANS = ("iteration_s",) + tuple(key for key, _ in PARTS) + ("bytes_sent", "bytes_received")
SCALAR = (str, int, float, bool, type(None))


# --- report.md and runs.csv ----------------------------------------------------------------------


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
