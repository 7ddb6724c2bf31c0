"""Run training jobs under mpiexec for the benchmarks and read their summaries."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from psframework.bench.machine import cpu_model
from psframework.fileio import atomic_write_json, atomic_write_text
from psframework.launch import run_mpi


def run_case(prog: str, label: str, config: str, ranks: int, overrides: Sequence[str], out_dir: str,
             timeout_s: float) -> Dict:
    """Train one case under mpiexec; return its summary with the label and the workers' compute share."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")
    args = ["-m", "psframework", "train", config, f"name={name}", f"output.dir={out_dir}",
            "output.progress=off"] + list(overrides)
    print(f"{prog}: {label}: mpiexec -n {ranks} python -m mpi4py {' '.join(args)}", flush=True)
    proc = run_mpi(ranks, args, timeout_s=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-5:]
        raise RuntimeError(f"case {label!r} failed with exit status {proc.returncode}: {' | '.join(tail)}")
    with open(os.path.join(out_dir, name, "summary.json")) as fh:
        summary = json.load(fh)
    summary["label"] = label
    workers = summary.get("workers") or {}
    iterations = max(1, summary["iterations"] - summary.get("start_iteration", 0))
    compute = [w["compute_s"] / iterations for w in workers.values()]
    summary["worker_compute_share"] = (sum(compute) / len(compute) / summary["mean_iteration_s"]) if compute else None
    return summary


def machine() -> str:
    """Describe the machine a benchmark ran on."""
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
            f"{platform.system()} {platform.release()}")


def run_cases(prog: str, plan: Sequence[Tuple[str, str, int, List[str]]], extra: Sequence[str], timeout_s: float,
              annotate: Optional[Callable[[str, List[str], Dict], None]] = None) -> Dict[str, Dict]:
    """Run every (label, config, ranks, overrides) case with `extra` overrides; return {label: summary}.

    `annotate(config, overrides, summary)` may add figures to a summary while its config is at hand.
    """
    cases: Dict[str, Dict] = {}
    with tempfile.TemporaryDirectory(prefix="psf-bench-") as tmp:
        for label, config, ranks, overrides in plan:
            summary = run_case(prog, label, config, ranks, list(overrides) + list(extra), tmp, timeout_s)
            if annotate is not None:
                annotate(config, list(overrides) + list(extra), summary)
            cases[label] = summary
            print(f"  mean iteration {summary['mean_iteration_s'] * 1e3:.1f} ms, rank 0 sent "
                  f"{summary['server_bytes_sent_per_iteration'] / 2**20:.2f} MiB/it", flush=True)
    return cases


def missing_config(prog: str, paths: Sequence[str]) -> bool:
    """Print an error and return True when a config file does not exist."""
    for path in paths:
        if not os.path.isfile(path):
            print(f"{prog}: error: config {path!r} does not exist", file=sys.stderr)
            return True
    return False


def write_report(out_dir: str, basename: str, md: str, data: Dict) -> None:
    """Write `basename`.md and `basename`.json atomically into `out_dir` and print the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_text(os.path.join(out_dir, basename + ".md"), md)
    atomic_write_json(os.path.join(out_dir, basename + ".json"), data)
    print(md)
