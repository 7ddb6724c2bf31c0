"""Sweeps: a grid of overrides (and repeats with other seeds) over one config, run locally or as a Slurm job array.

`psf sweep CONFIG --grid code.k=2,3 stragglers.factor=1,4` writes OUT/NAME/sweep.json, the index of
its points, and runs each point as `psf train OUT/NAME/sweep.json` (under mpiexec -n WORLD where the
scheme needs MPI) with the point's number in PSF_SWEEP_POINT (locally) or SLURM_ARRAY_TASK_ID (a job
array task): a point's run directory is OUT/NAME/POINT/, it resumes with train.resume=auto, and a
point that finished is skipped. --dry-run prints each point's launch line (or the sbatch line) instead.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from psframework import environment
from psframework.cliparse import Parser
from psframework.errors import ConfigError
from psframework.schemes.validate import load_run
from psframework.sweepindex import Point, Sweep, write_index

DEFAULT_TEMPLATE = os.path.join("jobs", "single-node.sbatch")


def parse_grid(items: Sequence[str]) -> Dict[str, List[str]]:
    """Return {key: [values]} from KEY=V1,V2 items; raise ConfigError naming a malformed one."""
    grid: Dict[str, List[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not key.strip() or not all(parts):
            raise ConfigError(f"psf sweep: --grid: got {item!r}, expected KEY=VALUE1,VALUE2,... (e.g. code.k=2,3)")
        if key.strip() in grid:
            raise ConfigError(f"psf sweep: --grid: key {key.strip()!r} given twice")
        grid[key.strip()] = parts
    return grid


def point_name(overrides: Sequence[str]) -> str:
    """Return a point's directory name: its overrides joined by commas, with no path separators."""
    return ",".join(overrides).replace("/", "_").replace(" ", "_") or "base"


def plan_sweep(config: str, overrides: List[str], grid: Dict[str, List[str]], repeat: int, name: str) -> Sweep:
    """Expand the grid (times the repeats) into points, each checked as a full config; raise ConfigError."""
    from psframework.schemes.registry import world_size_of

    base = load_run(config, overrides)
    sweep = Sweep(name, os.path.abspath(config), list(overrides), grid, repeat)
    combos = itertools.product(*[[f"{k}={v}" for v in values] for k, values in grid.items()]) if grid else [()]
    for combo in combos:
        for r in range(repeat):
            seeds = [] if repeat == 1 else [f"train.seed={base.train.seed + r}", f"data.seed={base.data.seed + r}"]
            point = list(combo) + seeds
            try:
                cfg = load_run(config, overrides + point)
            except ConfigError as exc:
                raise ConfigError(f"psf sweep: point {point_name(point)}: {exc}") from None
            world = world_size_of(cfg)
            label = point_name(list(combo) + ([f"seed={r}"] if repeat > 1 else []))
            sweep.points.append(Point(label, point, r if repeat > 1 else None, label, world))
    return sweep


def finished(sweep_dir: str, point: Point) -> bool:
    """Return whether a point's run finished (its summary is written)."""
    return os.path.exists(os.path.join(sweep_dir, point.dir, "summary.json"))


def point_command(index: str, sweep: Sweep, i: int) -> Tuple[List[str], Dict[str, str]]:
    """Return (argv, environment) that train point i locally: under mpiexec -n WORLD where the scheme needs MPI."""
    from psframework.launch import mpi_command

    args = ["-m", "psframework", "train", index]
    env = {environment.SWEEP_POINT: str(i)}
    world = sweep.points[i].world_size
    if world > 1:
        try:
            return mpi_command(world, args, env=env)
        except RuntimeError as exc:  # no mpiexec: one line, as for any bad input
            raise ConfigError(f"psf sweep: point {sweep.points[i].name} needs {world} MPI ranks: {exc}") from None
    return [sys.executable] + args, {**environment.child_environment(), **env}


def launch_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Return a shell line that runs `argv` with the point's number and the variables `env` adds or changes."""
    ours = environment.child_environment()
    added = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
             if k == environment.SWEEP_POINT or ours.get(k) != v]
    return " ".join(added + [shlex.quote(a) for a in argv])


def run_locally(index: str, sweep: Sweep, todo: List[int]) -> int:
    """Run the points one after another (under mpiexec where the scheme needs it); return the exit status."""
    failed = []
    for count, i in enumerate(todo, 1):
        point = sweep.points[i]
        argv, full_env = point_command(index, sweep, i)
        print(f"psf sweep: point {count}/{len(todo)} {point.name}: {' '.join(argv[:3])} ...", flush=True)
        t0 = time.perf_counter()
        status = subprocess.run(argv, env=full_env).returncode
        print(f"psf sweep: point {point.name}: {'done' if status == 0 else f'failed, status {status}'} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        if status != 0:
            failed.append(point.name)
    if failed:
        print(f"psf sweep: {len(failed)} of {len(todo)} points failed: {', '.join(failed)}; run the sweep again to "
              "retry them (finished points are skipped)", file=sys.stderr, flush=True)
        return 1
    return 0


def submit(index: str, sweep: Sweep, todo: List[int], template: str, sbatch_args: List[str],
           dry_run: bool, max_parallel: Optional[int] = None) -> int:
    """Submit one Slurm job array whose task i runs point i, at most `max_parallel` tasks at once (None: as many
    as Slurm runs); return sbatch's status."""
    if not os.path.isfile(template):
        raise ConfigError(f"psf sweep: --template: {template!r} is not a file, expected an sbatch script such as "
                          f"{DEFAULT_TEMPLATE}")
    sweep_dir = os.path.dirname(index)
    tasks = max(sweep.points[i].world_size for i in todo)
    throttle = "" if max_parallel is None else f"%{max_parallel}"
    argv = ["sbatch", f"--array={','.join(map(str, todo))}{throttle}", f"--ntasks={tasks}",
            f"--job-name=psf-{sweep.sweep}", f"--output={os.path.join(sweep_dir, 'slurm-%A_%a.out')}",
            *sbatch_args, template, index]
    if dry_run:
        print(" ".join(shlex.quote(a) for a in argv))
        return 0
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"psf: error: psf sweep: sbatch failed: {(done.stderr or done.stdout).strip()}", file=sys.stderr)
        return done.returncode
    job = done.stdout.strip().split()[-1]
    print(f"psf sweep: submitted job array {job} ({len(todo)} tasks, {tasks} ranks each) for {sweep_dir}; "
          f"watch it with squeue -j {job}; then psf report {sweep_dir} --out {sweep_dir}/report", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of `psf sweep`."""
    p = Parser(prog="psf sweep", description="run a grid of overrides over one config, locally or as a Slurm "
               "job array; results go to OUT/NAME/POINT/ with the index OUT/NAME/sweep.json")
    p.add_argument("config", help="YAML experiment file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides every point shares")
    p.add_argument("--grid", nargs="+", default=[], metavar="KEY=V1,V2", help="a key and its values; several "
                   "keys make their cartesian product")
    p.add_argument("--repeat", type=int, default=1, metavar="R", help="run every point R times with seeds "
                   "train.seed and data.seed + 0..R-1 (default 1)")
    p.add_argument("--name", default=None, help="sweep name (default: the config's name + '-sweep')")
    p.add_argument("--out", default="runs", help="directory of sweeps (default runs)")
    p.add_argument("--slurm", action="store_true", help="submit one Slurm job array instead of running locally")
    p.add_argument("--template", default=DEFAULT_TEMPLATE, help=f"sbatch script (default {DEFAULT_TEMPLATE})")
    p.add_argument("--sbatch", action="append", default=[], metavar="ARG", help="extra sbatch argument, "
                   "repeatable (e.g. --sbatch=--partition=cpu)")
    p.add_argument("--max-parallel", type=int, default=None, metavar="P", help="--slurm: run at most P tasks of "
                   "the array at once (sbatch --array=...%%P), so the sweep does not take the whole partition")
    p.add_argument("--dry-run", action="store_true", help="write the index and print what would run: each "
                   "point's launch line (mpiexec -n WORLD ... where the scheme needs MPI), or the sbatch line")
    return p


def main(argv: Sequence[str]) -> int:
    """Run `psf sweep`."""
    args, extra = build_parser().parse_known_args(argv)
    if extra and not all("=" in e and not e.startswith("-") for e in extra):
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.repeat < 1:
            raise ConfigError(f"psf sweep: --repeat: got {args.repeat}, expected a positive number of runs")
        if args.max_parallel is not None and args.max_parallel < 1:
            raise ConfigError(f"psf sweep: --max-parallel: got {args.max_parallel}, expected a positive number of "
                              "array tasks at once")
        name = args.name or f"{load_run(args.config, args.overrides + extra).name}-sweep"
        sweep = plan_sweep(args.config, args.overrides + extra, parse_grid(args.grid), args.repeat, name)
        sweep_dir = os.path.join(args.out, name)
        index = write_index(sweep_dir, sweep)
        todo = [i for i, point in enumerate(sweep.points) if not finished(sweep_dir, point)]
        print(f"psf sweep: {len(sweep.points)} points in {sweep_dir} ({len(sweep.points) - len(todo)} finished)",
              flush=True)
        if not todo:
            return 0
        if args.slurm:
            return submit(index, sweep, todo, args.template, args.sbatch, args.dry_run, args.max_parallel)
        if args.dry_run:  # the launch line of every point, as run_locally starts it
            print("\n".join(launch_line(*point_command(index, sweep, i)) for i in todo))
            return 0
        return run_locally(index, sweep, todo)
    except ConfigError as exc:
        print(f"psf: error: {exc}", file=sys.stderr, flush=True)
        return 2
