"""Head-to-head benchmark: torch DDP against psframework's schemes, calm and with a worker in stop-go.

Trains one config (configs/bench_stanza.yaml by default: vgg-small, batch 64) under every scheme on
the same model, data order and global batch: torch DistributedDataParallel (psframework.bench.ddp,
one process per worker), ps and stanza with one backup worker, sazd with direct and with relay
dissemination (k = n - n/4) and uncoded (k = n). Each case runs with n workers (default 4 and 8),
without emulated links and with links emulated at 10 and 1 Gb/s (50 us), once undisturbed and once
with one worker in stop-go: the benchmark itself stops that worker's process (SIGSTOP) for --stop-s
seconds and lets it run (SIGCONT) for --go-s seconds, over and over, from the end of the first
iteration on. Reported per case: seconds per iteration (the mean after the first, or after the
stop-go began, up to the last, which waits for every worker to finish), processor seconds per
iteration summed over every rank, rank 0's bytes per iteration (sent + received; DDP: what each process
sends and receives in a ring allreduce), detached workers, and for psframework's undisturbed cases where
rank 0's iteration goes (waiting for replies, decoding, encoding, posting, computing). Writes peers.json
and peers.md.

With --network netcluster the cases run on real links instead (psframework.bench.peers_net): across the
hosts of a cluster the benchmark makes for itself, every link shaped by the kernel to the case's rate.
Cases of the same n, link, network and straggler setting then run as DDP, case, DDP, case, ... in
every pass, so that each case is compared with the DDP runs beside it (psframework.bench.peers_links
renders that report), and --slow-link adds cases where one worker's link drops to a fraction of its
rate half-way through the run.

The cases are in peers_cases.py, how each is trained in peers_runs.py and the report in peers_render.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from psframework.bench import peers_links as links_report
from psframework.bench import peers_net
from psframework.bench import report as rep
from psframework.bench.cases import CaseFileError
from psframework.bench.contenders import ContenderFile
from psframework.bench.contenders import load as load_contenders
from psframework.bench.peers_cases import LATENCY_US, NAME, PROG, STOPPED_WORKER, Case, indexed
from psframework.bench.peers_links import EMULATED, NETCLUSTER, NETWORKS, SLOW_LINK
from psframework.bench.peers_render import render
from psframework.bench.peers_runs import RunOptions, run_all
from psframework.bench.runs import machine, setting
from psframework.netcluster.hosts import UNAVAILABLE

DEFAULT_CONFIG = os.path.join("configs", "bench_stanza.yaml")
DEFAULT_CONTENDERS = os.path.join("configs", "bench", "peers.yaml")
LINKS = ("none", "10", "1")  # Gb/s
STRAGGLERS = ("none", "stop-go")


def parser() -> argparse.ArgumentParser:
    """Return the benchmark's argument parser."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    rep.add_report_options(p, NAME)
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"the config every case trains (default {DEFAULT_CONFIG})")
    p.add_argument("--cases", default=DEFAULT_CONTENDERS, metavar="FILE", help="the contenders, the baseline and "
                   f"the extra ratios (default {DEFAULT_CONTENDERS}; the format is in psframework/bench/contenders.py)")
    p.add_argument("--schemes", default=None, help="comma-separated contenders of the --cases file (default all)")
    p.add_argument("--workers", default="4,8", help="comma-separated worker counts n (default 4,8)")
    p.add_argument("--links", default=",".join(LINKS), help="comma-separated: none and link speeds in Gb/s "
                   "(default none,10,1)")
    p.add_argument("--stragglers", default=",".join(STRAGGLERS), help="comma-separated, of none, stop-go")
    p.add_argument("--network", default=EMULATED, help=f"comma-separated, of {', '.join(NETWORKS)}: links emulated "
                   "by comm.emulate on one host (default), and/or real links of a cluster of hosts the benchmark "
                   "makes (root; 'none' is then an unshaped veth, a speed a tbf-shaped link)")
    p.add_argument("--slow-link", default="", metavar="SCHEMES", help="netcluster: also run these contenders "
                   "with one worker's link slowed half-way through the run (comma-separated)")
    p.add_argument("--slow-link-at", default="10", metavar="GBPS", help="the link speed of the --slow-link cases "
                   "(default 10)")
    p.add_argument("--slow-fraction", type=float, default=0.01, help="the slowed link's share of its rate "
                   "(default 0.01)")
    p.add_argument("--pingpong-mib", type=int, default=64, help="netcluster: MiB of the large messages of each "
                   "link's ping-pong (default 64)")
    p.add_argument("--iterations", type=int, default=30, help="iterations per case (default 30)")
    p.add_argument("--stop-s", type=float, default=0.4, help="stop-go: seconds stopped (default 0.4)")
    p.add_argument("--go-s", type=float, default=0.1, help="stop-go: seconds running (default 0.1)")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="train every case R times (passes over all cases); report each case's median run")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per case")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every case")
    return p


def plan(args: argparse.Namespace, contenders: ContenderFile) -> Union[List[Case], str]:
    """Return the cases the options ask for, or the error line for a bad option."""
    names = [c.name for c in contenders.contenders]
    schemes = names if args.schemes is None else [s for s in args.schemes.split(",") if s]
    if not schemes or any(s not in names for s in schemes):
        return f"--schemes: got {args.schemes!r}, expected a comma-separated list of {', '.join(names)}"
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError:
        workers = []
    if not workers or any(w < 2 for w in workers):
        return f"--workers: got {args.workers!r}, expected comma-separated worker counts >= 2"
    links = [link for link in args.links.split(",") if link]
    if not links or any(link != "none" and not _positive(link) for link in links):
        return f"--links: got {args.links!r}, expected 'none' and/or link speeds in Gb/s (> 0)"
    stragglers = [s for s in args.stragglers.split(",") if s]
    if not stragglers or any(s not in STRAGGLERS for s in stragglers):
        return f"--stragglers: got {args.stragglers!r}, expected a comma-separated list of {', '.join(STRAGGLERS)}"
    for name in ("stop_s", "go_s"):
        if not getattr(args, name) > 0:
            return f"--{name.replace('_', '-')}: got {getattr(args, name)}, expected seconds > 0"
    if args.iterations < 3:
        return f"--iterations: got {args.iterations}, expected at least 3"
    if args.repeat < 1:
        return f"--repeat: got {args.repeat}, expected at least 1"
    networks = [net for net in args.network.split(",") if net]
    if not networks or any(net not in NETWORKS for net in networks) or len(set(networks)) < len(networks):
        return f"--network: got {args.network!r}, expected a comma-separated list of {', '.join(NETWORKS)}"
    slow = plan_real_links(args, names, networks)
    if isinstance(slow, str):
        return slow
    return [Case(contenders.named(s), n, link, straggler, net) for n in workers for link in links
            for net in networks for straggler in stragglers for s in schemes] + [
        Case(contenders.named(s), n, args.slow_link_at, SLOW_LINK, NETCLUSTER) for n in workers for s in slow]


def plan_real_links(args: argparse.Namespace, names: Sequence[str], networks: Sequence[str]) -> Union[List[str], str]:
    """Return the contenders of the slow-link cases after checking the real-link options, or the error line."""
    slow = [s for s in args.slow_link.split(",") if s]
    if any(s not in names for s in slow):
        return f"--slow-link: got {args.slow_link!r}, expected a comma-separated list of {', '.join(names)}"
    if slow and NETCLUSTER not in networks:
        return f"--slow-link: got {args.slow_link!r}, but only real links can be slowed: add --network {NETCLUSTER}"
    if not _positive(args.slow_link_at):
        return f"--slow-link-at: got {args.slow_link_at!r}, expected a link speed in Gb/s (> 0)"
    if not 0 < args.slow_fraction < 1:
        return f"--slow-fraction: got {args.slow_fraction}, expected a share of the rate between 0 and 1"
    if args.pingpong_mib < 1:
        return f"--pingpong-mib: got {args.pingpong_mib}, expected at least 1"
    return slow


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def median_case(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Return the run with the median iteration time, listing every run's."""
    ordered = sorted(runs, key=lambda r: r["iteration_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeat_iteration_s"] = [r["iteration_s"] for r in runs]
    return chosen


def ratios(cases: Sequence[Mapping[str, Any]], baseline: str,
           pairs: Mapping[str, Sequence[str]]) -> List[Dict[str, Any]]:
    """Return, per worker count and link, each contender's figures over the baseline's and the pairs' ratios."""
    by, names = indexed(cases)
    others = [name for name in names if name != baseline]
    base = baseline.replace("-", "_")
    out = []
    for n, link in dict.fromkeys((c["n"], c["link_gbps"]) for c in cases):
        entry: Dict[str, Any] = {"n": n, "link_gbps": link}
        ref, ref_go = by.get((baseline, n, link, "none")), by.get((baseline, n, link, "stop-go"))
        for name in others:
            calm, go = by.get((name, n, link, "none")), by.get((name, n, link, "stop-go"))
            key = name.replace("-", "_")
            if calm and ref:
                entry[f"{key}_over_{base}_time"] = calm["iteration_s"] / ref["iteration_s"]
                entry[f"{key}_over_{base}_cpu"] = calm["cpu_s_per_iteration"] / ref["cpu_s_per_iteration"]
            if go and ref_go:
                entry[f"{base}_over_{key}_stop_go"] = ref_go["iteration_s"] / go["iteration_s"]
        for ratio, (top, bottom) in pairs.items():
            num, den = by.get((top, n, link, "none")), by.get((bottom, n, link, "none"))
            if num and den:
                entry[ratio] = num["iteration_s"] / den["iteration_s"]
        out.append(entry)
    return out


def measure(args: argparse.Namespace, argv: List[str]) -> Union[Dict[str, Any], int]:
    """Train every case and return the report, or exit status 2 on bad options or config (3: no cluster here)."""
    from psframework.errors import ConfigError

    try:
        base = setting(args.config, list(args.overrides))
        contenders = load_contenders(args.cases, base["scheme"])
    except (ConfigError, CaseFileError) as exc:
        return rep.fail(PROG, str(exc))
    cases = plan(args, contenders)
    if isinstance(cases, str):
        return rep.fail(PROG, cases)
    real = any(c.network == NETCLUSTER for c in cases)
    reason = peers_net.require() if real else None
    if reason is not None:
        print(f"{PROG}: error: --network {NETCLUSTER}: {reason}", file=sys.stderr, flush=True)
        return UNAVAILABLE
    if real:
        args.out = args.out or os.path.join(rep.DEFAULT_OUT, NETCLUSTER)  # never over the emulated report
    opts = RunOptions(args.config, args.iterations, tuple(args.overrides), (args.stop_s, args.go_s), args.timeout,
                      args.slow_fraction, args.pingpong_mib << 20)
    records, pings = run_all(cases, opts, args.repeat, contenders.baseline, real)
    report = {"benchmark": NAME, "command": rep.command_line(PROG, argv), "machine": machine(), "date": rep.today(),
              "inputs": {"config": args.config, "setting": base, "overrides": list(args.overrides),
                         "iterations": args.iterations, "stop_s": args.stop_s, "go_s": args.go_s,
                         "repeat": args.repeat, "latency_us": LATENCY_US, "cases": args.cases,
                         "baseline": contenders.baseline,
                         "pairs": {k: list(v) for k, v in contenders.pairs.items()}}}
    if not real:
        runs: Dict[str, List[Dict[str, Any]]] = {}
        for record in records:
            runs.setdefault(record["label"], []).append({k: v for k, v in record.items() if k != "pass"})
        results = [median_case(r) if len(r) > 1 else r[0] for r in runs.values()]
        return {**report, "cases": results, "ratios": ratios(results, contenders.baseline, contenders.pairs)}
    links_report.pair(records, contenders.baseline)
    results = links_report.aggregate(records)
    networks = list(dict.fromkeys(c.network for c in cases))
    report["inputs"].update(networks=networks, hosts=max(c.n for c in cases) + 1,
                            slow_link={"fraction": args.slow_fraction, "rank": STOPPED_WORKER})
    by_network = [dict(entry, network=net) for net in networks for entry in
                  ratios([c for c in results if c.get("network", EMULATED) == net], contenders.baseline,
                         contenders.pairs)]
    return {**report, "pingpong": pings, "cases": results, "ratios": by_network,
            "runs": links_report.run_rows(records)}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark and write peers.json and peers.md (or re-render with --render)."""
    return rep.main(NAME, parser(), argv, measure, render)
