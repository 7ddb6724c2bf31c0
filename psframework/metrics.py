"""Run outputs: resolved config, per-iteration metrics, summary, progress display."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple

from psframework import environment
from psframework.fileio import atomic_write_json, atomic_write_text


def metrics_rows(path: str) -> Iterator[Dict[str, Any]]:
    """Yield the rows of a metrics file, skipping lines that are not an iteration's row (a torn last line)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("iteration"), int):
                yield row


TENSORBOARD_DIR = "tensorboard"  # below the run directory: `tensorboard --logdir` of a sweep compares its points


def scalar_tag(key: str) -> Optional[str]:
    """Return the TensorBoard tag of a metrics field (None: not a scalar of its own)."""
    named = {"loss": "train/loss", "lr": "train/lr", "test_accuracy": "test/accuracy", "test_loss": "test/loss",
             "workers_live": "workers/live", "verify_max_rel_diff": "coded/verify_max_rel_diff"}
    if key in named:
        return named[key]
    if key in ("iteration", "epoch", "batch"):
        return None
    if key.endswith("_s"):
        return f"time/{key}"
    if key.startswith("bytes_"):
        return f"comm/{key}"
    return f"other/{key}"


def row_scalars(row: Dict[str, Any]) -> Dict[str, float]:
    """Return the TensorBoard scalars of a metrics row: its numbers, and how many workers its rounds used."""
    out = {}
    for key, value in row.items():
        tag = scalar_tag(key)
        if tag is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[tag] = float(value)
    used = row.get("used")
    if isinstance(used, list):
        ranks = {r for u in used for r in (u if isinstance(u, list) else [u])}
        out["workers/used"] = float(len(ranks))
    return out


class TensorBoardSink:
    """Write every metrics row, as it is written to metrics.jsonl, as scalars of one TensorBoard run.

    The event files hold exactly the rows of metrics.jsonl: a run that starts (or resumes) removes the
    earlier event files, and the recorder replays the rows it keeps before it writes new ones.
    """

    def __init__(self, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.path.join(run_dir, TENSORBOARD_DIR)
        if os.path.isdir(self.log_dir):
            for name in os.listdir(self.log_dir):
                if name.startswith("events.out.tfevents."):
                    os.remove(os.path.join(self.log_dir, name))
        self.writer = SummaryWriter(self.log_dir, flush_secs=10)  # a run is watched while it trains

    def write(self, row: Dict[str, Any]) -> None:
        """Add a row's scalars at its iteration."""
        for tag, value in row_scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=row["iteration"])

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class RunRecorder:
    """Stream one JSON object per iteration to the run directory; keep only running sums in memory.

    Lines go to metrics.jsonl.partial, renamed to metrics.jsonl when the run ends. The newest row is
    held back until the next one (an evaluation or sync may still add fields to it). A run resumed
    in place keeps the earlier rows up to its checkpoint's iteration (`keep_until`). Without a run
    directory (a server other than the lead) it writes nothing and keeps the running sums.
    """

    def __init__(self, run_dir: Optional[str], config_yaml: str, keep_until: Optional[int] = None,
                 tensorboard: bool = False):
        self.run_dir = run_dir
        self._pending: Optional[Dict[str, Any]] = None
        self._board: Optional[TensorBoardSink] = None
        self._sums: Dict[str, List[float]] = {}  # key -> [sum, count, first value]
        self.start = time.perf_counter()
        self._fh: Optional[TextIO] = None
        if run_dir is None:  # a server other than the lead: running sums only, no files
            return
        os.makedirs(run_dir, exist_ok=True)
        atomic_write_text(os.path.join(run_dir, "config.yaml"), config_yaml)
        self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
        self._partial_path = self.metrics_path + ".partial"
        earlier = self._set_aside_earlier_rows() if keep_until is not None else None
        self._fh = open(self._partial_path, "w", encoding="utf-8")
        if tensorboard:
            self._board = TensorBoardSink(run_dir)
        if earlier is not None:
            self._copy_rows(earlier, keep_until)

    def _set_aside_earlier_rows(self) -> Optional[str]:
        """Move the earlier run's metrics (the partial file of a run that stopped, else the final one) aside."""
        for source in (self._partial_path, self.metrics_path):
            if os.path.exists(source):
                aside = source + ".earlier"
                os.replace(source, aside)
                return aside
        return None

    def _copy_rows(self, path: str, keep_until: int) -> None:
        """Copy the rows of iterations 1..keep_until from `path` (a torn last line is dropped), then delete it."""
        assert self._fh is not None
        for row in metrics_rows(path):
            if row["iteration"] <= keep_until:
                self._write(row)
        self._fh.flush()
        os.unlink(path)

    def _write(self, row: Dict[str, Any]) -> None:
        """Write a row to metrics.jsonl (and to TensorBoard)."""
        assert self._fh is not None, "recorder already closed"
        self._fh.write(json.dumps(row, sort_keys=False) + "\n")
        if self._board is not None:
            self._board.write(row)

    def elapsed(self) -> float:
        """Return seconds since the recorder was created."""
        return time.perf_counter() - self.start

    def log(self, row: Dict[str, Any]) -> None:
        """Append one iteration's metrics."""
        self._flush_pending()
        self._pending = row
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums = self._sums.setdefault(key, [0.0, 0, float(value)])
                sums[0] += value
                sums[1] += 1

    def _flush_pending(self) -> None:
        if self._pending is not None and self.run_dir is not None:
            self._write(self._pending)
            self._fh.flush()
            self._pending = None

    def update_last(self, **fields: Any) -> None:
        """Add fields (such as an evaluation) to the last iteration's row."""
        assert self._pending is not None, "no iteration logged yet"
        self._pending.update(fields)

    def suspend(self) -> None:
        """Write every row and close, leaving metrics.jsonl.partial for a resume in place to go on from."""
        self._flush_pending()
        if self.run_dir is None:
            return
        assert self._fh is not None, "recorder already closed"
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        if self._board is not None:
            self._board.close()
            self._board = None

    def finish(self, summary: Dict[str, Any]) -> Dict[str, Any]:
        """Complete metrics.jsonl and write summary.json atomically; return the summary."""
        self.suspend()
        summary = dict(summary)
        summary.setdefault("wall_s", self.elapsed())
        if self.run_dir is None:
            return summary
        os.replace(self._partial_path, self.metrics_path)
        atomic_write_json(os.path.join(self.run_dir, "summary.json"), summary)
        return summary

    def mean(self, key: str, skip: int = 0) -> float:
        """Return the mean of a metric over the iterations after the first (skip=1) or all (skip=0)."""
        if key not in self._sums:
            return math.nan
        total, count, first = self._sums[key]
        if skip and count > 1:
            return (total - first) / (count - 1)
        return total / count


class Progress:
    """Show training progress on the terminal: a bar on a TTY, plain lines otherwise."""

    def __init__(self, total: int, mode: str = "auto", stream: Optional[TextIO] = None):
        self.total = total
        stream = stream or sys.stderr  # looked up now: a default bound at import would miss a redirection
        self.stream = stream
        if mode == "auto":  # under a launcher, rank 0 writes to a pipe that may end on a terminal
            mode = "bar" if stream.isatty() or environment.on_terminal() else "lines"
        self.mode = mode
        self.start = time.perf_counter()
        self._last_line = 0.0
        self._first: Optional[Tuple[int, float]] = None  # the first iteration reported and when

    def rate(self, iteration: int, now: float) -> Optional[float]:
        """Return iterations per second since the first one reported (its warm-up left out), None before."""
        if self._first is None:
            self._first = (iteration, now)
        done, span = iteration - self._first[0], now - self._first[1]
        return done / span if done > 0 and span > 0 else None

    def update(self, iteration: int, epoch: int, loss: float, extra: str = "") -> None:
        """Report that `iteration` (1-based) is done."""
        if self.mode == "off":
            return
        now = time.perf_counter()
        elapsed = now - self.start
        rate = self.rate(iteration, now)
        speed = "warming up" if rate is None else f"{rate:.1f} it/s eta {(self.total - iteration) / rate:.0f}s"
        text = f"epoch {epoch} it {iteration}/{self.total} loss {loss:.4f} {speed}{(' ' + extra) if extra else ''}"
        if self.mode == "bar":
            width = 24
            filled = int(width * iteration / max(self.total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
            if iteration >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif extra or iteration >= self.total or elapsed - self._last_line >= 5.0:
            self._last_line = elapsed
            self.stream.write(text + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """Print a line that does not disturb the bar."""
        if self.mode == "off":
            return
        prefix = "\r\033[K" if self.mode == "bar" else ""
        self.stream.write(prefix + text + "\n")
        self.stream.flush()
