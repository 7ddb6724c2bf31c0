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


class RunRecorder:
    """Stream one JSON object per iteration to the run directory; keep only running sums in memory.

    Lines go to metrics.jsonl.partial, renamed to metrics.jsonl when the run ends. The newest row is
    held back until the next one (an evaluation or sync may still add fields to it). A run resumed
    in place keeps the earlier rows up to its checkpoint's iteration (`keep_until`). Without a run
    directory (a server other than the lead) it writes nothing and keeps the running sums.
    """

    def __init__(self, run_dir: Optional[str], config_yaml: str, keep_until: Optional[int] = None):
        self.run_dir = run_dir
        self._pending: Optional[Dict[str, Any]] = None
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
                self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        os.unlink(path)

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
            assert self._fh is not None, "recorder already closed"
            self._fh.write(json.dumps(self._pending, sort_keys=False) + "\n")
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

    def __init__(self, total: int, mode: str = "auto", stream: TextIO = sys.stderr):
        self.total = total
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
