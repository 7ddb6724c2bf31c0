"""psf bench plan: the cost model's predictions next to measured runs (docs/benchmarks/plan.md).

Calibrates a profile for each workload (psf plan calibrate's pieces, one at a time), then trains
every case as `psf bench peers` does (rank 0 and n workers, or n DDP processes, under mpiexec; on
emulated links on this machine, and on real shaped links of a cluster of hosts made on it) and
predicts it with the model for the same machine: every rank on one pool of this machine's cores,
the links as the case has them. Held-out cases (another model and batch, another (n, k), another
link speed) are measured and predicted in the same run and reported apart.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import yaml

from psframework.bench import peers, peers_cases, peers_net, peers_runs
from psframework.plan import validation_report as plan_report
from psframework.bench import report as rep
from psframework.bench.contenders import Contender
from psframework.bench.contenders import load as load_contenders
from psframework.bench.peers_links import EMULATED, NETCLUSTER, link_words
from psframework.bench.runs import machine, setting
from psframework.plan.cluster import Cluster
from psframework.plan.graphs import DDP, Setup
from psframework.plan.predict import predict
from psframework.plan.profile import Profile, save

PROG = "psf bench plan"
NAME = "plan"
CORES = float(os.cpu_count() or 1)
DEFAULT_CASES = os.path.join("configs", "bench", "plan.yaml")


@dataclass(frozen=True)
class Workload:
    """A model and batch the cases train: a config and overrides."""

    name: str
    config: str
    overrides: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """One validation case: a contender of `psf bench peers` on a workload, n workers and a link."""

    workload: Workload
    contender: Contender
    n: int
    link: str  # none, or Gb/s
    network: str = EMULATED
    k: Optional[int] = None  # None: the benchmark's n - n/4 (n for contenders that need every worker)
    held_out: str = ""  # why the case is held out ("": a validation case)
    core_per_rank: bool = False  # each rank bound to a core of its own: the time measured is the critical path

    @property
    def label(self) -> str:
        k = f", k={self.k}" if self.k else ""
        pinned = ", a core per rank" if self.core_per_rank else ""
        return f"{self.workload.name}: {self.contender.name}, n={self.n}{k}, {link_words(self.link, self.network)}" \
            f"{pinned}"


@dataclass(frozen=True)
class CaseFile:
    """The cases of the benchmark (configs/bench/plan.yaml) and its questions."""

    checks: Tuple[Check, ...]
    questions: Dict[str, Any]
    workloads: Dict[str, Workload]


def load_cases(path: str, contenders: Dict[str, Contender]) -> CaseFile:
    """Read the case file; ValueError names the first entry that cannot be used."""
    with open(path) as fh:
        data = yaml.safe_load(fh)
    workloads = {name: Workload(name, w["config"], tuple(w.get("overrides") or ()))
                 for name, w in data["workloads"].items()}
    checks: List[Check] = []
    for held, groups in ((False, data["validation"]), (True, data.get("held_out") or [])):
        for i, group in enumerate(groups):
            unknown = [w for w in group["workloads"] if w not in workloads] + \
                [c for c in group["contenders"] if c not in contenders]
            if unknown:
                raise ValueError(f"{path}: group {i + 1}: unknown workload or contender {unknown[0]!r}")
            for w in group["workloads"]:
                for n in group["n"]:
                    for link in group["links"]:
                        checks += [Check(workloads[w], contenders[c], int(n), str(link), group.get("network", EMULATED),
                                         group.get("k"), group["why"] if held else "",
                                         bool(group.get("core_per_rank", False))) for c in group["contenders"]]
    return CaseFile(tuple(checks), data["questions"], workloads)


def quick(cases: Sequence[Check]) -> List[Check]:
    """Return a smoke run's cases: the first workload's at the first link of each network, one held out."""
    first = cases[0].workload
    keep = [c for c in cases if not c.held_out and c.workload == first and c.n == cases[0].n]
    links = {net: next(c.link for c in keep if c.network == net) for net in {c.network for c in keep}}
    return [c for c in keep if c.link == links[c.network]] + [c for c in cases if c.held_out][:2]


def setup_of(check: Check, case: peers_cases.Case) -> Setup:
    """Return the model's setup of a case, read from its contender's overrides and then its workload's."""
    if case.ddp:
        return Setup(DDP, check.n, check.n)
    values = dict(o.split("=", 1) for o in check.contender.overrides + check.workload.overrides)
    scheme = values["scheme"]
    return Setup(scheme, check.n, check.k or case.k, dissemination=values.get("comm.dissemination", "direct"),
                 backup=int(values.get("train.backup_workers", 0)))


def cluster_of(check: Check, profile: Profile) -> Cluster:
    """Return this machine as the case ran on it: one pool of cores, emulated or real links."""
    gbps = peers_cases.link_gbps(check.link)
    shm, tcp = profile.links["shm"], profile.links.get("tcp", profile.links["shm"])
    if check.network == NETCLUSTER:
        rate = tcp.bandwidth_Bps if gbps is None else gbps * 1e9 / 8
        return Cluster(hosts=5, cores_per_host=CORES, link_Bps=rate, latency_s=tcp.latency_s, local=tcp, remote=tcp,
                       one_pool=True, cyclic=True)
    rate = float("inf") if gbps is None else gbps * 1e9 / 8
    latency = 0.0 if gbps is None else peers_cases.LATENCY_US * 1e-6
    return Cluster(hosts=1, cores_per_host=CORES, link_Bps=rate, latency_s=latency, local=shm, remote=tcp,
                   emulated=True, one_pool=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="the cost model of psf plan against measured runs")
    rep.add_report_options(p, NAME)
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"the cases and questions (default {DEFAULT_CASES})")
    p.add_argument("--iterations", type=int, default=10, help="iterations per case (default 10)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per case (default 600)")
    p.add_argument("--quick", action="store_true", help="a few cases: a smoke run of the whole benchmark")
    p.add_argument("--no-netcluster", action="store_true", help="leave out the cases on real links (they need root)")
    return p


@contextlib.contextmanager
def real_links(wanted: bool) -> Iterator[Optional[peers_net.BenchCluster]]:
    """Yield the benchmark's cluster of 5 hosts, or None when not wanted or not possible here."""
    if not wanted or peers_net.require() is not None:
        yield None
        return
    with peers_net.bench_cluster(5) as net:
        yield net


def profiles(workloads: Sequence[Workload], out: str, netcluster: bool) -> Dict[str, Profile]:
    """Calibrate each workload (links measured once); write the profiles under `out`/plan/profiles."""
    from psframework.plan.calibrate import calibrate
    from psframework.plan.cli import measure_links, settings_of

    links = measure_links(netcluster)
    found = {}
    for w in workloads:
        profile = calibrate(settings_of(w.config, w.overrides), w.config, links, say=lambda t: print(t, flush=True))
        found[w.name] = profile
        save(profile, os.path.join(out, "plan", "profiles", profile.model + f"-b{profile.batch}.json"))
    return found


def measure(args: argparse.Namespace, argv: List[str]) -> Union[Dict[str, Any], int]:
    """Calibrate, run every case and predict it; return the report."""
    if args.iterations < 3:
        return rep.fail(PROG, f"--iterations: got {args.iterations}, expected 3 or more")
    out = args.out or rep.DEFAULT_OUT
    try:
        default_scheme = setting(peers.DEFAULT_CONFIG, [])["scheme"]
        contenders = {c.name: c for c in load_contenders(peers.DEFAULT_CONTENDERS, default_scheme).contenders}
        cases = load_cases(args.cases, contenders)
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        return rep.fail(PROG, f"--cases: {exc}")
    todo = quick(cases.checks) if args.quick else list(cases.checks)
    netcluster = not args.no_netcluster and peers_net.require() is None
    todo = [c for c in todo if netcluster or c.network != NETCLUSTER]
    workloads = list(dict.fromkeys([c.workload for c in todo] + [cases.workloads[cases.questions["profile"]]]))
    found = profiles(workloads, out, netcluster)
    rows = []
    with real_links(netcluster) as net, tempfile.TemporaryDirectory(prefix="psf-plan-") as runs:
        for check in todo:
            case = peers_cases.Case(check.contender, check.n, check.link, "none", check.network)
            extra = list(check.workload.overrides) + ([f"code.k={check.k}"] if check.k else [])
            opts = peers_runs.RunOptions(check.workload.config, args.iterations, tuple(extra), (0.4, 0.1), args.timeout,
                                         core_per_rank=check.core_per_rank)
            measured = peers_runs.run_case(case, opts, runs, net)
            profile = found[check.workload.name]
            predicted = predict(profile, setup_of(check, case), cluster_of(check, profile))
            rows.append(plan_report.row(check, measured, predicted, os.getloadavg()[0]))
            print(f"{PROG}: {check.label}: measured {measured['iteration_s'] * 1e3:.1f} ms, predicted "
                  f"{predicted.iteration_s * 1e3:.1f} ms", flush=True)
    os.makedirs(out, exist_ok=True)
    plan_report.scatter(rows, os.path.join(out, "plan.png"))
    q = cases.questions
    return {"benchmark": NAME, "command": rep.command_line(PROG, argv), "machine": machine(), "date": rep.today(),
            "inputs": {"iterations": args.iterations, "cases": args.cases,
                       "workloads": [asdict(w) for w in workloads],
                       "profiles": {name: {"machine": p.machine, "date": p.date, "links": asdict(p)["links"]}
                                    for name, p in found.items()}},
            "cases": rows, "questions": plan_report.questions(found[q["profile"]], q["coded"], q["stop_go"])}


def main(argv: Optional[List[str]] = None) -> int:
    return rep.main(NAME, parser(), argv, measure, plan_report.render)
