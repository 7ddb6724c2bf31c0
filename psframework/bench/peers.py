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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from psframework.bench import expectations as expect
from psframework.bench import peers_links as links_report
from psframework.bench import peers_net
from psframework.bench import report as rep
from psframework.bench.cases import CaseFileError
from psframework.bench.contenders import Contender, ContenderFile
from psframework.bench.contenders import load as load_contenders
from psframework.bench.peers_links import EMULATED, NETCLUSTER, NETWORKS, SLOW_LINK, link_words
from psframework.bench.peers_net import BenchCluster
from psframework.bench.runs import MIB, machine, setting, setting_text
from psframework.launch import mpi_command
from psframework.netcluster.hosts import UNAVAILABLE

NAME = "peers"
PROG = f"psf bench {NAME}"
DEFAULT_CONFIG = os.path.join("configs", "bench_stanza.yaml")
DEFAULT_CONTENDERS = os.path.join("configs", "bench", "peers.yaml")
LINKS = ("none", "10", "1")  # Gb/s
STRAGGLERS = ("none", "stop-go")
LATENCY_US = 50
STOPPED_WORKER = 2  # the second worker: rank 2 of a psframework job, rank 1 of DDP's
RANK0_PARTS = ("wait_s", "decode_s", "encode_s", "comm_s", "compute_s")  # rank 0's iteration, part by part


@dataclass(frozen=True)
class Case:
    """One training job: a contender with n workers, a link and a straggler setting."""

    contender: Contender
    n: int
    link: str
    straggler: str
    network: str = EMULATED  # or NETCLUSTER: the link is a real one of the benchmark's cluster

    @property
    def ddp(self) -> bool:
        """Return whether torch DDP trains the case (one process per worker)."""
        return self.contender.program == "ddp"

    @property
    def k(self) -> int:
        """Return the replies a round needs: n - n/4 (n/4 stragglers tolerated), or n when every worker is."""
        return self.n if self.contender.needs_every_worker else self.n - max(1, self.n // 4)

    @property
    def ranks(self) -> int:
        """Return the MPI ranks of the job: n DDP processes, or a server and n workers."""
        return self.n if self.ddp else self.n + 1

    @property
    def stopped_rank(self) -> int:
        """Return the rank stopped and let go in stop-go."""
        return STOPPED_WORKER - 1 if self.ddp else STOPPED_WORKER

    def overrides(self) -> List[str]:
        """Return the config overrides of the case."""
        unemulated = self.link == "none" or self.network == NETCLUSTER  # a real link is shaped by the kernel
        link = (["comm.emulate.bandwidth_gbps=null", "comm.emulate.latency_us=0"] if unemulated else
                [f"comm.emulate.bandwidth_gbps={self.link}", f"comm.emulate.latency_us={LATENCY_US}"])
        return list(self.contender.overrides) + [f"code.n={self.n}", f"code.k={self.k}"] + link

    @property
    def label(self) -> str:
        """Return the case in words."""
        return f"{self.contender.name}, n={self.n}, {link_words(self.link, self.network)}, {self.straggler}"


def link_gbps(link: str) -> Optional[float]:
    """Return a link setting as a number of Gb/s, None for no emulation."""
    return None if link == "none" else float(link)


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


def job_pid(marker: str, rank: int, timeout_s: float = 120.0) -> Optional[int]:
    """Return the pid of the job's process of `rank` (found by its environment), waiting for it to start."""
    wanted = {f"PSF_BENCH_JOB={marker}".encode()}
    ranks = {f"PMI_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    env = set(fh.read().split(b"\0"))
            except OSError:
                continue
            if wanted <= env and ranks & env:
                return int(entry)
        time.sleep(0.05)
    return None


def rows_of(path: str) -> List[Dict[str, Any]]:
    """Return the metrics rows written so far (the last line may still be partial: it is left out)."""
    try:
        with open(path) as fh:
            lines = fh.read().split("\n")
    except OSError:
        return []
    out = []
    for line in lines[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def metrics_path(run_dir: str) -> str:
    """Return where a run's metrics are, while it runs and once it has finished."""
    partial = os.path.join(run_dir, "metrics.jsonl.partial")
    return partial if os.path.exists(partial) else os.path.join(run_dir, "metrics.jsonl")


@dataclass(frozen=True)
class RunOptions:
    """What every case of one benchmark run shares."""

    config: str
    iterations: int
    overrides: Tuple[str, ...]
    stop_go: Tuple[float, float]  # seconds stopped, seconds running
    timeout_s: float
    slow_fraction: float = 0.01
    pingpong_bytes: int = 64 << 20  # the large message of each real link's ping-pong


def run_case(case: Case, opts: RunOptions, out: str, net: Optional[BenchCluster] = None) -> Dict[str, Any]:
    """Train one case (on the cluster's hosts for a real link; disturbing a worker if asked); return its figures."""
    run_dir = os.path.join(out, case.label.replace(" ", "").replace(",", "_").replace("/", "_"))
    shutil.rmtree(run_dir, ignore_errors=True)  # an old run's metrics would start the stop-go before this run does
    common = [f"train.max_iterations={opts.iterations}", "train.epochs=1000", f"train.eval_every={opts.iterations}",
              "output.progress=off"] + case.overrides() + list(opts.overrides)
    if case.ddp:
        args = ["-m", "psframework.bench.ddp", opts.config, run_dir] + common
    else:
        args = ["-m", "psframework", "train", opts.config, f"name={os.path.basename(run_dir)}", f"output.dir={out}",
                "output.overwrite=true"] + common
    marker = uuid.uuid4().hex
    real = case.network == NETCLUSTER and net is not None
    if real:
        net.shape(case.link)
        argv, env = net.command(case.ranks, args, opts.timeout_s, {"PSF_BENCH_JOB": marker}, case.ddp)
    else:
        argv, env = mpi_command(case.ranks, args, timeout_s=opts.timeout_s, env={"PSF_BENCH_JOB": marker})
    where = f" on {case.ranks} hosts" if real else ""
    print(f"{PROG}: {case.label}: mpiexec -n {case.ranks} python -m mpi4py {' '.join(args)}{where}", flush=True)
    counted = net.counters() if real else None
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    undo, after = None, 1
    try:
        undo, after = disturb(case, proc, run_dir, marker, opts, net)
        code = proc.wait(timeout=opts.timeout_s + 30)
    finally:
        if undo is not None:
            undo()
        if proc.poll() is None:
            proc.kill()
    log.seek(0)
    if code != 0:
        tail = log.read().strip().splitlines()[-5:]
        raise RuntimeError(f"case {case.label!r} failed with exit status {code}: {' | '.join(tail)}")
    done = figures(case, run_dir, after)
    if real and counted is not None:
        done.update(links_report.link_figures(counted, net.counters(), opts.iterations))
    return done


def disturb(case: Case, proc: subprocess.Popen, run_dir: str, marker: str, opts: RunOptions,
            net: Optional[BenchCluster]) -> Tuple[Optional[Callable[[], None]], int]:
    """Start the case's disturbance once its run is far enough; return (what ends it, rows written before it)."""
    from psframework.runtime.stragglers import Freezer, StragglerSpec

    if case.straggler == "stop-go":
        after = _await_rows(proc, run_dir, 1, opts.timeout_s)
        pid = job_pid(marker, case.stopped_rank, 10.0)
        if pid is None or proc.poll() is not None:
            return None, after
        stop_s, go_s = opts.stop_go
        freezer = Freezer(StragglerSpec("freeze", (case.stopped_rank,), pause_s=stop_s, duty=stop_s / (stop_s + go_s)),
                          pid=pid)
        return freezer.stop, after
    if case.straggler == SLOW_LINK and net is not None:
        # Half-way, so that the run times itself before and after the fault under the same load.
        _await_rows(proc, run_dir, max(2, opts.iterations // 2), opts.timeout_s)
        host = net.slow(case.stopped_rank, opts.slow_fraction)
        # Iterations that ended while the link was being reshaped count as before the fault.
        return (lambda: net.mend(host)), max(2, len(rows_of(metrics_path(run_dir))))
    return None, 1


def _await_rows(proc: subprocess.Popen, run_dir: str, count: int, timeout_s: float) -> int:
    """Wait until the run has written `count` metrics rows; return how many it had then."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        rows = len(rows_of(metrics_path(run_dir)))
        if rows >= count:
            return rows
        time.sleep(0.01)
    return count


def figures(case: Case, run_dir: str, after: int) -> Dict[str, Any]:
    """Return a finished case's figures from its summary and metrics (iterations after `after` count)."""
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    rows = rows_of(os.path.join(run_dir, "metrics.jsonl"))
    # The iterations after the first (warm-up) or after the stop-go began, but the last: it waits for
    # the workers to finish the run, a lagging one too.
    timed = [r for r in rows[:-1] if r["iteration"] > after] or rows[1:]
    sent = summary.get("server_bytes_sent_per_iteration") or 0.0
    received = summary.get("server_bytes_received_per_iteration") or 0.0
    parts = {key: sum(r.get(key, 0.0) for r in timed) / len(timed) for key in RANK0_PARTS if key in timed[0]}
    workers = [w["compute_s"] / max(1, summary["iterations"]) for w in (summary.get("workers") or {}).values()]
    return {"scheme": case.contender.name, "coded": case.contender.coded, "n": case.n, "k": case.k,
            "link_gbps": link_gbps(case.link), "straggler": case.straggler, "ranks": case.ranks,
            "label": case.label, "iteration_s": sum(r["iteration_s"] for r in timed) / len(timed),
            "timed_iterations": len(timed), "cpu_s_per_iteration": summary["cpu_s_per_iteration"]["total"],
            "cpu_s_per_iteration_rank0": summary["cpu_s_per_iteration"]["server"],
            "rank0_bytes_per_iteration": sent + received, "rank0_parts_s": parts,
            "worker_compute_s": sum(workers) / len(workers) if workers else None,
            "detached": len(summary.get("membership") or []),
            **({"network": case.network} if case.network != EMULATED else {}),
            **(links_report.before_fault(rows, after) if case.straggler == SLOW_LINK else {})}


def median_case(runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Return the run with the median iteration time, listing every run's."""
    ordered = sorted(runs, key=lambda r: r["iteration_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeat_iteration_s"] = [r["iteration_s"] for r in runs]
    return chosen


def indexed(cases: Sequence[Mapping[str, Any]]) -> Tuple[Dict[tuple, Mapping[str, Any]], List[str]]:
    """Return the cases by (contender, n, link, straggler), and the contenders in the order they ran."""
    by = {(c["scheme"], c["n"], c["link_gbps"], c["straggler"]): c for c in cases}
    return by, list(dict.fromkeys(c["scheme"] for c in cases))


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
    from psframework.config import ConfigError

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


def run_all(cases: Sequence[Case], opts: RunOptions, repeat: int, baseline: str,
            real: bool) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Train every case `repeat` times (interleaved with the baseline on real links); return runs and ping-pongs."""
    order = links_report.schedule(cases, repeat, baseline, interleave=real)
    hosts = max(c.n for c in cases) + 1
    records = []
    with tempfile.TemporaryDirectory(prefix="psf-bench-") as tmp, \
            (peers_net.bench_cluster(hosts) if real else contextlib.nullcontext()) as net:
        measured = dict.fromkeys(["none"] + [c.link for c in cases if c.network == NETCLUSTER]) if net else {}
        pings = [net.pingpong(link, opts.pingpong_bytes) for link in measured]
        for number, case in order:
            load = os.getloadavg()[0]
            done = run_case(case, opts, tmp, net)
            records.append({**done, "pass": number, "load": load})
            print(f"  {done['iteration_s'] * 1e3:.1f} ms/it, {done['cpu_s_per_iteration'] * 1e3:.1f} ms of "
                  f"processor time/it, rank 0 {done['rank0_bytes_per_iteration'] / MIB:.2f} MiB/it, load {load:.1f}",
                  flush=True)
    return records, pings


def _times(value: Optional[float], base: Optional[float]) -> str:
    """Return ' (R x)' for value over base, or '' when either is missing."""
    return "" if value is None or not base else f" ({value / base:.2f}x)"


def _row(calm: Optional[Mapping[str, Any]], go: Optional[Mapping[str, Any]],
         ddp: Optional[Mapping[str, Any]], ddp_go: Optional[Mapping[str, Any]]) -> str:
    """Return one table row: a contender's figures undisturbed and in stop-go, against the baseline's."""
    any_case = calm or go
    assert any_case is not None
    cells = [any_case["scheme"], str(any_case["k"]) if any_case.get("coded") else ""]
    if calm:
        cells += [f"{calm['iteration_s'] * 1e3:.1f}{_times(calm['iteration_s'], ddp and ddp['iteration_s'])}",
                  f"{calm['cpu_s_per_iteration'] * 1e3:.1f}"
                  f"{_times(calm['cpu_s_per_iteration'], ddp and ddp['cpu_s_per_iteration'])}"]
    else:
        cells += ["", ""]
    if go:
        slowdown = f"{go['iteration_s'] / calm['iteration_s']:.2f}x" if calm else ""
        faster = f"{ddp_go['iteration_s'] / go['iteration_s']:.2f}x" if ddp_go and ddp_go is not go else ""
        cells += [f"{go['iteration_s'] * 1e3:.1f}", slowdown, faster]
    else:
        cells += ["", "", ""]
    cells += [f"{any_case['rank0_bytes_per_iteration'] / MIB:.1f}",
              " / ".join(str(c["detached"]) for c in (calm, go) if c)]
    return "| " + " | ".join(cells) + " |"


def tables(report: Mapping[str, Any]) -> List[str]:
    """Return one table per worker count and link."""
    cases, baseline = report["cases"], report["inputs"]["baseline"]
    by, names = indexed(cases)
    lines: List[str] = []
    for n, link in dict.fromkeys((c["n"], c["link_gbps"]) for c in cases):
        k = next((c["k"] for c in cases if c["n"] == n and c.get("coded") and c["k"] < n), None)
        lines += [f"### n = {n} workers, {link_words(link)}" + (f" (coded k = {k})" if k else ""), "",
                  "| scheme | k | ms / iteration, undisturbed (x DDP) | CPU ms / iteration, all ranks (x DDP) | "
                  "ms / iteration, stop-go | stop-go slowdown | DDP / scheme in stop-go | rank 0 MiB / iteration | "
                  "workers detached |",
                  "|---|---|---|---|---|---|---|---|---|"]
        ddp, ddp_go = by.get((baseline, n, link, "none")), by.get((baseline, n, link, "stop-go"))
        for name in names:
            calm, go = by.get((name, n, link, "none")), by.get((name, n, link, "stop-go"))
            if calm or go:
                lines.append(_row(calm, go, ddp, ddp_go))
        lines.append("")
    return lines


def parts_table(report: Mapping[str, Any]) -> List[str]:
    """Return where rank 0's iteration goes in psframework's undisturbed cases, with the workers' compute."""
    rows = [c for c in report["cases"] if c["straggler"] == "none" and c.get("rank0_parts_s")]
    if not rows:
        return []
    lines = ["| case | iteration | wait for replies | decode | encode | post sends | compute | rank 0 CPU | "
             "compute per worker |", "|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        p = c["rank0_parts_s"]
        cells = [c["label"], c["iteration_s"]] + [p.get(key) for key in RANK0_PARTS] + [
            c["cpu_s_per_iteration_rank0"], c["worker_compute_s"]]
        lines.append("| " + " | ".join([cells[0]] + ["" if v is None else f"{v * 1e3:.1f}" for v in cells[1:]]) + " |")
    return ["## Where rank 0's time goes", "",
            "Milliseconds per iteration, undisturbed, from rank 0's metrics (wait: for the k-th reply of each round; "
            "post sends: handing messages to MPI; compute: everything else rank 0 does, its layers and the head "
            "included), its processor time, and each worker's compute time (convolutions and updates):", "",
            *lines, ""]


def ratio_lines(report: Mapping[str, Any]) -> List[str]:
    """Return the ratios of each worker count and link as list items."""
    lines = []
    for entry in report["ratios"]:
        parts = [f"{key} {value:.2f}" for key, value in entry.items() if key not in ("n", "link_gbps", "network")]
        if parts:
            words = link_words(entry["link_gbps"], entry.get("network", EMULATED))
            lines.append(f"- n = {entry['n']}, {words}: " + ", ".join(parts))
    return lines


def header(report: Dict[str, Any], title: str) -> List[str]:
    """Return a report's title, command, machine and config lines."""
    inputs = report["inputs"]
    extra = " ".join(inputs.get("overrides") or [])
    return [title, "", f"Command: `{report['command']}` (runs each case under `mpiexec`, one after another).",
            f"Machine: {report['machine']}. Date: {report['date']}.", "",
            f"- `{inputs['config']}`: {setting_text(inputs['setting'])}" + (f"; overrides `{extra}`" if extra else "")]


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the peers benchmark report as Markdown (emulated links, or emulated and real side by side)."""
    inputs = report["inputs"]
    if inputs.get("networks"):
        return render_real(report, expectations)
    lines = [
        *header(report, "# Head to head: torch DDP and psframework's schemes"),
        f"- {inputs['iterations']} iterations per case" + (f", median of {inputs['repeat']} runs" if
                                                           inputs.get("repeat", 1) > 1 else "") +
        f"; emulated links add {inputs['latency_us']} us of latency; stop-go: the benchmark stops one worker "
        f"(SIGSTOP) for {inputs['stop_s']:g} s and lets it run (SIGCONT) for {inputs['go_s']:g} s, over and "
        "over, from the end of the first iteration",
        "- DDP: torch DistributedDataParallel (gloo on the CPU), one process per worker, each on its share of the "
        "global batch; with emulated links each gradient bucket's allreduce waits for a ring allreduce's bytes "
        "on the process's link while the backward pass goes on. Its rank 0 bytes are those a ring allreduce "
        "sends and receives per process.",
        "- ps and stanza take the first n - 1 workers of every round (one backup worker); sazd decodes from the "
        "first k of n; uncoded needs all n.",
        "- ms / iteration: the mean after the first iteration (undisturbed) or after the stop-go began, up to the "
        "last (which waits for every worker to finish the run); CPU ms: "
        "processor time per iteration summed over every rank (all threads), the first iteration left out. With "
        "more ranks than cores, wall time measures the sum of all ranks' work: the processor time compares the "
        "schemes' cost on any machine.", "",
        "## Cases", "", *tables(report), *parts_table(report),
        "## Ratios", "", *ratio_lines(report), "",
    ]
    return "\n".join(lines + expect.section(report, expectations))


def render_real(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the report of a run with real links: emulated and real side by side, ping-pongs, slowed links."""
    inputs = report["inputs"]
    lines = [
        *header(report, "# Head to head on real links: torch DDP and psframework's schemes"),
        f"- {inputs['iterations']} iterations per run; emulated links (comm.emulate, on one host over shared "
        f"memory) add {inputs['latency_us']} us of latency per message; DDP: torch DistributedDataParallel "
        "(gloo on the CPU), one process per worker.",
        "- ps and stanza take the first n - 1 workers of every round (one backup worker); sazd decodes from the "
        "first k of n; uncoded needs all n.",
        "- ms / iteration: the mean after the first iteration up to the last (which waits for every worker to "
        "finish the run). With more ranks than cores every figure is a sum of all ranks' work.",
        *links_report.render_links(report),
        *parts_table(report), "## Ratios", "",
        "Of each case's median run (the x DDP columns above pair runs within a pass instead):", "",
        *ratio_lines(report), "",
    ]
    return "\n".join(lines + expect.section(report, expectations))


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark and write peers.json and peers.md (or re-render with --render)."""
    return rep.main(NAME, parser(), argv, measure, render)
