"""psf report's runs: run and sweep directories read into `Run`s, and what each run measured.

A run directory holds config.yaml, metrics.jsonl (metrics.jsonl.partial while the run is going on
or after it stopped) and, once finished, summary.json. A sweep directory holds sweep.json, whose
points name their run directories.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

EXPECTED = "expected a run directory (with config.yaml) or a sweep directory (with sweep.json)"
SWEEP_EXPECTED = "the sweep.json that psf sweep writes"
# The timed parts of an iteration, in the order the split plot stacks them: (metrics key, name).
PARTS = (("wait_s", "wait"), ("decode_s", "decode"), ("encode_s", "encode"), ("compute_s", "compute"),
         ("comm_s", "communication"))


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
