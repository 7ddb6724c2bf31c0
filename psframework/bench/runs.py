"""Run training jobs under mpiexec for the benchmarks and read their summaries."""

from __future__ import annotations

import json
import os
import platform
import re
from typing import Dict, Sequence

from psframework.bench.machine import cpu_model
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
