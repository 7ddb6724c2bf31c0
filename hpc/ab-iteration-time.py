#!/usr/bin/env python3
"""Compare the mean iteration time of one config under two source trees, run alternately.

    python hpc/ab-iteration-time.py --baseline /path/to/other/checkout --ranks 5 --pairs 6 \\
        configs/bench_sazd.yaml [key=value ...]

Each pair runs the config once under each tree (the order alternates from pair to pair, so that
a machine that speeds up or slows down over time favours neither), reads `mean_iteration_s` from
each run's summary.json and prints every pair, the medians and the median of the per-pair ratios
(current / baseline). The trees are put first on PYTHONPATH; both must accept output.overwrite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from psframework.launch import mpi_command  # noqa: E402  (the repository, whatever the current directory)


def run(tree: str, ranks: int, config: str, overrides: list, out: str) -> float:
    """Train once under `tree`; return the run's mean iteration time in seconds."""
    args = ["-m", "psframework", "train", config, f"output.dir={out}", "name=ab", "output.overwrite=true",
            "output.progress=off", *overrides]
    env = {"PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}
    if ranks > 1:
        argv, env = mpi_command(ranks, args, timeout_s=900, env=env)
    else:
        argv, env = [sys.executable, *args], {**os.environ, **env}
    proc = subprocess.run(argv, env=env, cwd=HERE, capture_output=True, text=True, timeout=960)
    if proc.returncode != 0:
        sys.exit(f"ab-iteration-time: the run under {tree} failed:\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "ab", "summary.json")) as fh:
        return float(json.load(fh)["mean_iteration_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other source tree (a checkout of another commit)")
    parser.add_argument("--ranks", type=int, default=5)
    parser.add_argument("--pairs", "--rounds", dest="pairs", type=int, default=6)  # --rounds: its old name
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    trees = {"baseline": os.path.abspath(args.baseline), "current": HERE}
    times = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.pairs):
            order = ["baseline", "current"] if r % 2 == 0 else ["current", "baseline"]
            for name in order:
                times[name].append(run(trees[name], args.ranks, args.config, args.overrides, out))
            print(f"pair {r + 1}: baseline {times['baseline'][-1] * 1e3:.2f} ms, "
                  f"current {times['current'][-1] * 1e3:.2f} ms", flush=True)
    ratios = [c / b for b, c in zip(times["baseline"], times["current"])]
    base, cur = statistics.median(times["baseline"]), statistics.median(times["current"])
    print(f"{args.config} {' '.join(args.overrides)}: median mean iteration baseline {base * 1e3:.2f} ms, "
          f"current {cur * 1e3:.2f} ms; current/baseline: median of pairs {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
