"""psf report's plots: PNG figures of the runs, drawn with matplotlib (imported only when a report is written)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from psframework.fileio import atomic_write
from psframework.report_runs import PARTS, ReportError, Run, number, server_bytes, time_split

PLOT_HINT = "pip install 'psframework[plot]' installs it"
MiB = float(2 ** 20)
FIGSIZE = (8.0, 5.0)
DPI = 110
PART_COLORS = {"wait_s": "#d62728", "decode_s": "#9467bd", "encode_s": "#8c564b", "compute_s": "#1f77b4",
               "comm_s": "#ff7f0e"}


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


def slowdown_text(ratio: float) -> str:
    """Return a slowdown the way the report writes it."""
    return f"{ratio:.2f}x"


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
