"""`psf plan`: predict each scheme on a cluster and recommend one; `psf plan calibrate`: take a profile.

    psf plan calibrate CONFIG [KEY=VALUE ...] [--out FILE] [--threads T] [--netcluster]
    psf plan CONFIG [KEY=VALUE ...] --hosts N --link 10gbit [--latency 5us] [--cores-per-host C]
             [--straggler stopgo:0.8] [--profile FILE] [--json] [--plot FILE]

Every bad input is one line naming it, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from psframework.plan.cluster import Cluster, PlanError, Straggler, parse_rate, parse_time
from psframework.plan.graphs import DDP
from psframework.plan.profile import Link, Profile, load, save

PROG = "psf plan"
EXIT_USAGE = 2
PROFILES = os.path.join("docs", "benchmarks", "plan", "profiles")  # the profiles taken on the project's machine


def calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} calibrate", description="time a config's pieces of work on this "
                                "machine, one at a time, and write the profile `psf plan` predicts from")
    p.add_argument("config", help="YAML experiment file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p.add_argument("--out", help=f"profile file (default {PROFILES}/MODEL-bBATCH.json)")
    p.add_argument("--threads", type=int, default=1, help="processor threads per rank (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of each piece, median kept (default 5)")
    p.add_argument("--netcluster", action="store_true",
                   help="also measure a TCP link between two hosts of a cluster made on this machine (root)")
    return p


def plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="predict seconds per iteration, images per second and "
                                "rank 0's bytes of every scheme on a cluster, and recommend one")
    p.add_argument("config", help="YAML experiment file (or 'calibrate' to take a profile: psf plan calibrate -h)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p.add_argument("--hosts", type=int, required=True, help="nodes of the cluster")
    p.add_argument("--link", required=True, help="each node's link, each way: 10gbit, 100gbit, 800mbit")
    p.add_argument("--latency", default="5us", help="one-way latency between nodes (default 5us)")
    p.add_argument("--cores-per-host", type=float, default=None,
                   help="cores of a node (default: one per rank); with --hosts 1 the ranks share them")
    p.add_argument("--ranks-per-host", type=int, default=1, help="ranks a node may hold (default 1)")
    p.add_argument("--straggler", default="none", help="none, stopgo:X (a worker stopped X of the time), slow:X "
                   "(a worker X times slower) or slowlink:X (a worker's link at X of its rate)")
    p.add_argument("--profile", help="calibration profile (default: the project's for the config, else taken now)")
    p.add_argument("--schemes", default=None, help="comma-separated schemes to compare (default: every scheme the "
                   "plan proposes, and ddp)")
    p.add_argument("--max-n", type=int, default=256, help="largest n to try (default 256)")
    p.add_argument("--json", action="store_true", help="print the rows and the recommendation as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw seconds per iteration against n for each scheme (PNG)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `psf plan` or `psf plan calibrate`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["calibrate"]:
            return run_calibrate(calibrate_parser().parse_args(argv[1:]))
        return run_plan(plan_parser().parse_args(argv))
    except (PlanError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def settings_of(config: str, overrides: Sequence[str]):
    """Return the config's settings (as a coded run, so that its convolutions are placed)."""
    from psframework.errors import ConfigError
    from psframework.schemes.validate import load_run, make_settings

    try:
        return make_settings(load_run(config, list(overrides) + [f"scheme={coded_scheme()}", "code.n=2", "code.k=1"]))
    except ConfigError as exc:
        raise PlanError(str(exc)) from None


def coded_scheme() -> str:
    """Return the first registered scheme with a shift-and-add code: its settings place every convolution."""
    from psframework.schemes.registry import get_scheme, scheme_names

    return next(name for name in scheme_names() if get_scheme(name).code == "shift-add")


def default_profile(model: str, batch: int) -> str:
    """Return where the project keeps the profile of a model at a batch (psf bench plan writes them)."""
    return os.path.join(PROFILES, f"{model}-b{batch}.json")


def _kept_profile(model: str, batch: int) -> Optional[str]:
    """Return the kept profile of the model at this batch, else at another batch (its fits are per sample)."""
    exact = default_profile(model, batch)
    if os.path.exists(exact):
        return exact
    others = sorted(f for f in (os.listdir(PROFILES) if os.path.isdir(PROFILES) else [])
                    if f.startswith(f"{model}-b") and f.endswith(".json"))
    return os.path.join(PROFILES, others[0]) if others else None


def measure_links(netcluster: bool) -> Dict[str, Link]:
    """Measure the shared-memory link between two ranks here and, with `netcluster`, a TCP link between hosts."""
    from psframework.launch import mpi_command

    argv, env = mpi_command(2, ["-m", "psframework.plan.links"], timeout_s=300)
    links = {"shm": _link_of(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=360))}
    if netcluster:
        from psframework.bench.peers_net import bench_cluster

        with bench_cluster(2) as net:
            net.shape("none")
            argv, env = net.command(2, ["-m", "psframework.plan.links"], 300, {}, False)
            links["tcp"] = _link_of(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=360))
    return links


def _link_of(done: subprocess.CompletedProcess) -> Link:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"link measurement failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return Link(**json.loads(lines[-1]))


def run_calibrate(args: argparse.Namespace) -> int:
    from psframework.plan.calibrate import calibrate

    if args.threads < 1 or args.repeats < 1:
        raise PlanError(f"--threads/--repeats: got {args.threads}/{args.repeats}, expected positive integers")
    settings = settings_of(args.config, args.overrides)
    print(f"{PROG}: measuring the links between two ranks", flush=True)
    links = measure_links(args.netcluster)
    profile = calibrate(settings, args.config, links, args.threads, args.repeats,
                        say=lambda text: print(text, flush=True))
    out = args.out or default_profile(profile.model, profile.batch)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save(profile, out)
    print(f"{PROG}: profile written to {out}")
    return 0


def profile_for(args: argparse.Namespace, settings) -> Profile:
    """Return the profile to predict from, at the config's batch; take one now if none is there."""
    model, batch = settings.model.name, settings.data.batch_size
    path = args.profile or _kept_profile(model, batch)
    if path is not None and os.path.exists(path):
        profile = load(path)
    elif args.profile:
        raise PlanError(f"--profile: {args.profile} does not exist (write it with psf plan calibrate CONFIG --out)")
    else:
        from psframework.plan.calibrate import calibrate

        path = default_profile(model, batch)
        print(f"{PROG}: no profile of {model} yet: calibrating on this machine first ({path})", file=sys.stderr,
              flush=True)
        profile = calibrate(settings, args.config, measure_links(False), say=lambda t: print(t, file=sys.stderr))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        save(profile, path)
    if profile.model != settings.model.name:
        raise PlanError(f"--profile: {path} was taken for model {profile.model}, the config trains "
                        f"{settings.model.name} (psf plan calibrate {args.config} --out FILE)")
    return replace(profile, batch=settings.data.batch_size)


def check_cluster(args: argparse.Namespace) -> None:
    """Refuse a bad description of the cluster before anything is measured or read."""
    if args.hosts < 1:
        raise PlanError(f"--hosts: got {args.hosts}, expected a positive number of nodes")
    if args.ranks_per_host < 1:
        raise PlanError(f"--ranks-per-host: got {args.ranks_per_host}, expected a positive integer")
    if args.cores_per_host is not None and not args.cores_per_host > 0:
        raise PlanError(f"--cores-per-host: got {args.cores_per_host}, expected a positive number")
    if args.max_n < 2:
        raise PlanError(f"--max-n: got {args.max_n}, expected 2 or more")
    parse_rate(args.link), parse_time(args.latency), Straggler.parse(args.straggler)


def cluster_of(args: argparse.Namespace, profile: Profile) -> Cluster:
    """Return the cluster the options describe, its costs per byte from the profile's links."""
    cores = args.cores_per_host if args.cores_per_host is not None else float(args.ranks_per_host)
    shm = profile.links.get("shm") or Link(0.0, math.inf, 0.0)
    tcp = profile.links.get("tcp") or shm
    return Cluster(hosts=args.hosts, cores_per_host=cores / profile.threads, link_Bps=parse_rate(args.link),
                   latency_s=parse_time(args.latency), local=shm, remote=tcp, one_pool=args.hosts == 1,
                   straggler=Straggler.parse(args.straggler))


def run_plan(args: argparse.Namespace) -> int:
    from psframework.plan.choose import PRUNE_MARGIN, WORKER_COUNTS, plan_names, recommend, row_json, rows, setups

    known = plan_names()
    schemes = known if args.schemes is None else [s.strip() for s in args.schemes.split(",") if s.strip()]
    if not schemes or any(s not in known for s in schemes) or not set(schemes) - {DDP}:
        raise PlanError(f"--schemes: got {args.schemes!r}, expected a comma-separated list of {', '.join(known)} "
                        "(one scheme at least)")
    check_cluster(args)
    settings = settings_of(args.config, args.overrides)
    profile = profile_for(args, settings)
    cluster = cluster_of(args, profile)
    max_ranks = args.hosts * args.ranks_per_host if args.hosts > 1 else max(2, 2 * args.max_n + 2)
    counts = [n for n in WORKER_COUNTS if n <= args.max_n]
    candidates = setups(max_ranks, schemes, counts)
    if not candidates:
        raise PlanError(f"--hosts: got {args.hosts}, expected room for a server and 2 workers at least")
    predictions, skipped = rows(profile, cluster, candidates, say=lambda t: print(f"{PROG}: {t}", file=sys.stderr,
                                                                                  flush=True))
    if skipped:
        print(f"{PROG}: {len(skipped)} of {len(candidates)} setups not replayed: their processor work alone takes "
              f"over {PRUNE_MARGIN}x the best iteration (the largest, {skipped[-1].scheme} n={skipped[-1].n})",
              file=sys.stderr, flush=True)
    rec = recommend(profile, cluster, predictions)
    if args.plot:
        plot(predictions, args.plot, f"{settings.model.name}, batch {profile.batch}: {cluster.words()}")
    if args.json:
        print(json.dumps({"rows": [row_json(p) for p in predictions], "recommendation": rec.to_json(),
                          "cluster": cluster.words(), "profile": {"machine": profile.machine, "date": profile.date,
                                                                  "model": profile.model, "batch": profile.batch}},
                         indent=1))
        return 0
    print(f"{PROG}: {settings.model.name}, global batch {profile.batch}, on {cluster.words()}")
    print(f"{PROG}: profile of {profile.machine}, {profile.date}")
    for line in table(predictions):
        print(line)
    print(f"recommendation: {rec.reason}")
    return 0


def table(predictions) -> List[str]:
    """Return the rows as a text table, fastest first within each n."""
    lines = [f"{'scheme':8} {'n':>4} {'k':>4} {'G':>2} {'b':>2} {'delivery':8} {'ms/iter':>10} {'images/s':>10} "
             f"{'rank0 MB':>9}"]
    for p in sorted(predictions, key=lambda p: (p.setup.n, p.iteration_s)):
        s = p.setup
        coded = coded_setup(s)
        lines.append(f"{s.scheme:8} {s.n:4d} {s.k if coded else '':>4} {s.servers:2d} {s.backup:2d} "
                     f"{s.dissemination if coded else '':8} {p.iteration_s * 1e3:10.1f} "
                     f"{p.images_per_s:10.0f} {p.rank0_bytes / 1e6:9.1f}")
    return lines


def coded_setup(setup) -> bool:
    """Return whether a setup's scheme codes its conv layers (its k and delivery matter)."""
    from psframework.schemes.registry import get_scheme

    return setup.scheme != DDP and get_scheme(setup.scheme).coded


def plot(predictions, path: str, title: str) -> None:
    """Draw the fastest setup of each scheme at each n (seconds per iteration against n)."""
    from psframework.report_plots import pyplot, save_figure
    from psframework.report_runs import ReportError

    try:
        plt = pyplot()
    except ReportError as exc:
        raise PlanError(f"--plot: {exc}") from None
    best: Dict[str, Dict[int, float]] = {}
    for p in predictions:
        name = p.setup.scheme + (f" {p.setup.dissemination}" if coded_setup(p.setup) else "")
        current = best.setdefault(name, {}).get(p.setup.n)
        if current is None or p.iteration_s < current:
            best[name][p.setup.n] = p.iteration_s
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sorted(best.items()):
        ns = sorted(points)
        ax.plot(ns, [points[n] * 1e3 for n in ns], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers n")
    ax.set_ylabel("ms per iteration (predicted)")
    ax.set_title(title, fontsize=8)
    ax.legend()
    save_figure(plt, ax, path)
