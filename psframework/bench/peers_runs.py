"""How psf bench peers trains a case: its job under mpiexec, the worker it disturbs, the figures of its run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from psframework.bench import peers_links as links_report
from psframework.bench import peers_net
from psframework.bench.peers_cases import PROG, RANK0_PARTS, Case, link_gbps
from psframework.bench.peers_links import EMULATED, NETCLUSTER, SLOW_LINK
from psframework.bench.peers_net import BenchCluster
from psframework.bench.runs import MIB
from psframework.launch import mpi_command


def find_process(matches: Callable[[Set[bytes], bytes], bool]) -> Optional[int]:
    """Return the pid of a process whose environment entries and command line (NUL-separated) `matches`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = set(fh.read().split(b"\0"))
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if matches(env, cmdline):
            return int(entry)
    return None


def job_pid(marker: str, rank: int, timeout_s: float = 120.0) -> Optional[int]:
    """Return the pid of the job's process of `rank` (found by its environment), waiting for it to start."""
    wanted = {f"PSF_BENCH_JOB={marker}".encode()}
    ranks = {f"PMI_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        pid = find_process(lambda env, _: wanted <= env and bool(ranks & env))
        if pid is not None:
            return pid
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
    core_per_rank: bool = False  # bind each rank to a core of its own: the time is the critical path


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
        argv, env = net.command(case.ranks, args, opts.timeout_s, {"PSF_BENCH_JOB": marker}, case.ddp,
                                opts.core_per_rank)
    else:
        argv, env = mpi_command(case.ranks, args, timeout_s=opts.timeout_s, env={"PSF_BENCH_JOB": marker},
                                core_per_rank=opts.core_per_rank)
    where = f" on {case.ranks} hosts" if real else ""
    where += ", a core per rank" if opts.core_per_rank else ""
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
        spec = StragglerSpec(model="freeze", ranks=(case.stopped_rank,), pause_s=stop_s, duty=stop_s / (stop_s + go_s))
        freezer = Freezer(spec, pid=pid)
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
