"""Run outputs: resolved config, per-iteration metrics, summary, progress display."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, TextIO

from psframework.fileio import atomic_write_json, atomic_write_text


class RunRecorder:
    """Collect one JSON object per iteration and write the run directory atomically."""

    def __init__(self, run_dir: str, config_yaml: str):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        atomic_write_text(os.path.join(run_dir, "config.yaml"), config_yaml)
        self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
        # Lines stream into a partial file, renamed into place only when the run ends.
        self._partial_path = self.metrics_path + ".partial"
        self._fh: Optional[TextIO] = open(self._partial_path, "w", encoding="utf-8")
        self.rows: List[Dict[str, Any]] = []
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Return seconds since the recorder was created."""
        return time.perf_counter() - self.start

    def log(self, row: Dict[str, Any]) -> None:
        """Append one iteration's metrics."""
        self.rows.append(row)
        assert self._fh is not None, "recorder already closed"
        self._fh.write(json.dumps(row, sort_keys=False) + "\n")
        self._fh.flush()

    def update_last(self, **fields: Any) -> None:
        """Add fields (such as an evaluation) to the last iteration's row."""
        self.rows[-1].update(fields)

    def finish(self, summary: Dict[str, Any]) -> Dict[str, Any]:
        """Write metrics.jsonl and summary.json atomically; return the summary."""
        assert self._fh is not None, "recorder already closed"
        self._fh.close()
        self._fh = None
        # Rewrite so late additions (evaluations) appear in their iteration's line.
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in self.rows))
        os.unlink(self._partial_path)
        summary = dict(summary)
        summary.setdefault("wall_s", self.elapsed())
        atomic_write_json(os.path.join(self.run_dir, "summary.json"), summary)
        return summary

    def mean(self, key: str, skip: int = 0) -> float:
        """Return the mean of a metric over the iterations after the first `skip`."""
        values = [r[key] for r in self.rows[skip:] if key in r]
        if not values:
            values = [r[key] for r in self.rows if key in r]
        return sum(values) / len(values) if values else math.nan


class Progress:
    """Show training progress on the terminal: a bar on a TTY, plain lines otherwise."""

    def __init__(self, total: int, mode: str = "auto", stream: TextIO = sys.stderr):
        self.total = total
        self.stream = stream
        if mode == "auto":
            mode = "bar" if stream.isatty() else "lines"
        self.mode = mode
        self.start = time.perf_counter()
        self._last_line = 0.0

    def update(self, iteration: int, epoch: int, loss: float, extra: str = "") -> None:
        """Report that `iteration` (1-based) is done."""
        if self.mode == "off":
            return
        elapsed = time.perf_counter() - self.start
        rate = iteration / elapsed if elapsed > 0 else 0.0
        eta = (self.total - iteration) / rate if rate > 0 else 0.0
        text = (f"epoch {epoch} it {iteration}/{self.total} loss {loss:.4f} "
                f"{rate:.1f} it/s eta {eta:.0f}s{(' ' + extra) if extra else ''}")
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
