"""Straggler benchmark: coded (SAZD) vs uncoded model parallelism with one worker slowed, and SAZD vs naive SAZD.

Runs real training jobs under mpiexec (one after another, in one invocation) on the benchmark pair of
configs and reports mean iteration times, the slowdown ratio caused by a fixed straggler, server bytes
per iteration, and the share of the iteration that the workers spend computing.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Dict, List, Optional

from psframework.bench.runs import machine, missing_config, run_cases, write_report

STRAGGLER = ["stragglers.model=fixed", "stragglers.ranks=[2]", "stragglers.factor=5"]


def report(cases: Dict[str, Dict], args: argparse.Namespace) -> tuple:
    """Return (markdown, json object) of the results."""
    def ratio(a: str, b: str) -> float:
        return cases[a]["mean_iteration_s"] / cases[b]["mean_iteration_s"]

    def lag(label: str) -> str:
        slow = cases[label]["workers"]["2"]
        return (f"skipped {slow['replies_skipped']:.0f} of {slow['replies_sent'] + slow['replies_skipped']:.0f} "
                f"replies and fell up to {slow['max_behind']:.0f} commands behind, applying every update")

    sazd_ratio = ratio("sazd, straggler", "sazd, none")
    uncoded_ratio = ratio("uncoded, straggler", "uncoded, none")
    rows = []
    for label, s in cases.items():
        share = s["worker_compute_share"]
        rows.append(f"| {label} | {s['n']} | {s['k']} | {s['mean_iteration_s'] * 1e3:.1f} | "
                    f"{s['mean_wait_s'] * 1e3:.1f} | {s['server_bytes_sent_per_iteration'] / 2**20:.2f} | "
                    f"{s.get('server_bytes_received_per_iteration', 0) / 2**20:.2f} | "
                    f"{'' if share is None else f'{100 * share:.0f}%'} |")
    naive_time = ratio("sazd-naive, none", "sazd, none")
    naive_bytes = (cases["sazd-naive, none"]["server_bytes_sent_per_iteration"]
                   / cases["sazd, none"]["server_bytes_sent_per_iteration"])
    command = "psf bench stragglers" + (f" --iterations {args.iterations}" if args.iterations else "")
    md = "\n".join([
        "# Straggler benchmark",
        "",
        f"Command: `{command}` (runs each case below under `mpiexec`, one after another).",
        f"Machine: {machine()}. Date: {datetime.date.today().isoformat()}.",
        "",
        f"Configs: `{args.sazd}` (n=4, k=3) and `{args.uncoded}` (n=k=3); the straggler case adds "
        f"`{' '.join(STRAGGLER)}` (worker rank 2 sleeps 4x its own compute time after every reply it computes, "
        "so it takes 5x as long). Mean iteration time excludes the first iteration (warm-up).",
        "",
        "| case | n | k | mean iteration (ms) | mean wait for k-th reply (ms) | server MiB sent / it | "
        "server MiB received / it | worker compute share |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## Ratios",
        "",
        f"- `sazd`: iteration time with the straggler / without: **{sazd_ratio:.2f}** (rank 0 decodes from "
        "the first 3 of 4 replies; the slowed worker " + lag("sazd, straggler") + ").",
        f"- `uncoded`: iteration time with the straggler / without: **{uncoded_ratio:.2f}** (every worker is "
        "needed, so each round waits for the slow one).",
        f"- `sazd-naive` / `sazd` without stragglers: iteration time **{naive_time:.2f}x**, server bytes sent "
        f"per iteration **{naive_bytes:.2f}x** (the naive server ships every worker's coded weights each "
        "round and computes the conv weight gradients itself).",
        "",
        "The worker compute share is the workers' mean compute time per iteration (wall time of their "
        "convolutions and updates, which share this machine's cores) over the mean iteration time of the "
        "run without stragglers: the setting is compute-bound when it is high.",
        "",
    ])
    data = {"command": command, "machine": machine(), "date": datetime.date.today().isoformat(),
            "ratios": {"sazd_straggler_over_none": sazd_ratio, "uncoded_straggler_over_none": uncoded_ratio,
                       "naive_over_sazd_time": naive_time, "naive_over_sazd_bytes": naive_bytes},
            "cases": cases}
    return md, data


def main(argv: Optional[List[str]] = None) -> int:
    """Run the straggler benchmark and write stragglers.md and stragglers.json."""
    parser = argparse.ArgumentParser(prog="psf bench stragglers", description=__doc__)
    parser.add_argument("--out", default="docs/benchmarks", help="directory for stragglers.md/.json")
    parser.add_argument("--sazd", default="configs/bench_sazd.yaml", help="coded config (n=4, k=3)")
    parser.add_argument("--uncoded", default="configs/bench_uncoded.yaml", help="uncoded config (n=k=3)")
    parser.add_argument("--iterations", type=int, default=None, help="override train.max_iterations")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per case")
    args = parser.parse_args(argv)
    if missing_config("psf bench stragglers", (args.sazd, args.uncoded)):
        return 2
    extra = [f"train.max_iterations={args.iterations}"] if args.iterations else []
    plan = [("sazd, none", args.sazd, 5, []), ("sazd, straggler", args.sazd, 5, STRAGGLER),
            ("uncoded, none", args.uncoded, 4, []), ("uncoded, straggler", args.uncoded, 4, STRAGGLER),
            ("sazd-naive, none", args.sazd, 5, ["scheme=sazd-naive"])]
    cases = run_cases("psf bench stragglers", plan, extra, args.timeout)
    md, data = report(cases, args)
    write_report(args.out, "stragglers", md, data)
    return 0
