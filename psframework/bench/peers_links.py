"""`psf bench peers` on real links: the order of the runs, their pairing with DDP, and the report.

With a real network (--network netcluster, see psframework.bench.peers_net) the cases that share n,
link, network and straggler setting run as DDP, case, DDP, case, ... in every pass: each case's run
is divided by the DDP runs next to it (same pass, same group), so a change of the machine's load
between passes cancels out. Each case is reported as its median run with the spread (min-max) of
every figure over the passes, emulated and real links side by side, with a ping-pong of each real
link and the cases whose worker's link was slowed half-way through the run.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psframework.netcluster.jobs import traffic

EMULATED, NETCLUSTER = "emulated", "netcluster"
NETWORKS = (EMULATED, NETCLUSTER)
SLOW_LINK = "slow-link"  # the straggler setting of a case whose worker's link is slowed half-way
MB = 1e6


def link_words(link: Optional[Any], network: str = EMULATED) -> str:
    """Return a link setting (Gb/s, or none) in words: emulated ('no emulation', '1 Gb/s') or real."""
    if network == NETCLUSTER:
        return "real veth" if link in (None, "none") else f"real {float(link):g} Gb/s"
    return "no emulation" if link in (None, "none") else f"{float(link):g} Gb/s"


def link_figures(before: Sequence[Mapping[str, int]], after: Sequence[Mapping[str, int]],
                 iterations: int) -> Dict[str, Any]:
    """Return what crossed rank 0's host link per iteration (the whole job over its iterations)."""
    moved = traffic(before, after)
    return {"rank0_link_rx_per_iteration": moved[0]["rx_bytes"] / iterations,
            "rank0_link_tx_per_iteration": moved[0]["tx_bytes"] / iterations, "link_bytes": moved}


def before_fault(rows: Sequence[Mapping[str, Any]], after: int) -> Dict[str, Any]:
    """Return a slow-link run's own figures before its fault (iterations 2..after) and its slowdown."""
    calm = [r["iteration_s"] for r in rows if 1 < r["iteration"] <= after]
    slowed = [r["iteration_s"] for r in rows[:-1] if r["iteration"] > after]
    if not calm or not slowed:
        return {"fault_after": after, "before_s": None, "slowdown": None}
    before, later = sum(calm) / len(calm), sum(slowed) / len(slowed)
    return {"fault_after": after, "before_s": before, "slowdown": later / before}


def schedule(cases: Sequence[Any], repeat: int, baseline: str, interleave: bool) -> List[Tuple[int, Any]]:
    """Return (pass, case) in running order: passes over every case, each group DDP, case, DDP, case, ..."""
    if not interleave:
        return [(p, case) for p in range(repeat) for case in cases]
    groups: Dict[tuple, List[Any]] = {}
    for case in cases:
        groups.setdefault((case.n, case.link, case.network, case.straggler), []).append(case)
    order: List[Tuple[int, Any]] = []
    for p in range(repeat):
        for members in groups.values():
            base = next((c for c in members if c.contender.name == baseline), None)
            others = [c for c in members if c is not base]
            for case in others:
                order += ([(p, base)] if base is not None else []) + [(p, case)]
            if base is not None and not others:
                order.append((p, base))
    return order


def _group(record: Mapping[str, Any]) -> tuple:
    return (record["pass"], record["n"], record["link_gbps"], record.get("network", EMULATED), record["straggler"])


def pair(records: List[Dict[str, Any]], baseline: str) -> None:
    """Set each run's iteration time over the mean of the baseline's runs beside it ('over_baseline')."""
    for i, record in enumerate(records):
        if record["scheme"] == baseline:
            continue
        near = [records[j]["iteration_s"] for j in (i - 1, i + 1) if 0 <= j < len(records)
                and records[j]["scheme"] == baseline and _group(records[j]) == _group(record)]
        record["over_baseline"] = record["iteration_s"] / (sum(near) / len(near)) if near else None


def _spread(values: Sequence[Optional[float]]) -> Optional[Dict[str, float]]:
    got = [v for v in values if v is not None]
    return {"median": statistics.median(got), "min": min(got), "max": max(got)} if got else None


def aggregate(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Return each case's median run (by iteration time) with the spread of its figures over every run."""
    by: Dict[str, List[Dict[str, Any]]] = {}
    for record in records:
        by.setdefault(record["label"], []).append(record)
    out = []
    for runs in by.values():
        ordered = sorted(runs, key=lambda r: r["iteration_s"])
        chosen = {k: v for k, v in ordered[(len(ordered) - 1) // 2].items() if k not in ("pass", "over_baseline")}
        chosen["repeat_iteration_s"] = [r["iteration_s"] for r in runs]
        chosen["spread"] = {key: _spread([r.get(key) for r in runs]) for key in
                            ("iteration_s", "over_baseline", "slowdown", "before_s", "cpu_s_per_iteration", "load")}
        chosen["spread"] = {k: v for k, v in chosen["spread"].items() if v is not None}
        out.append(chosen)
    return out


def run_rows(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Return every run in running order: its pass, case, time, load and ratio to the DDP runs beside it."""
    keys = ("pass", "label", "scheme", "n", "link_gbps", "network", "straggler", "iteration_s", "load",
            "over_baseline", "slowdown")
    return [{k: r.get(k, EMULATED if k == "network" else None) for k in keys} for r in records]


def per_pass(report: Mapping[str, Any], scheme: str, n: int, link: Optional[float],
             straggler: str = "none") -> Optional[Dict[str, float]]:
    """Return the spread over passes of one case's real time over its emulated time in the same pass."""
    times: Dict[str, Dict[int, float]] = {EMULATED: {}, NETCLUSTER: {}}
    for run in report.get("runs", []):
        if (run["scheme"], run["n"], run["link_gbps"], run["straggler"]) == (scheme, n, link, straggler):
            times[run["network"]][run["pass"]] = run["iteration_s"]
    return _spread([times[NETCLUSTER][p] / times[EMULATED][p] for p in times[NETCLUSTER] if p in times[EMULATED]])


# ---------------------------------------------------------------- the report


def _range(spread: Optional[Mapping[str, float]], scale: float = 1.0, digits: int = 2) -> str:
    if not spread:
        return ""
    f = f"{{:.{digits}f}}"
    return f"{f.format(spread['median'] * scale)} ({f.format(spread['min'] * scale)}-{f.format(spread['max'] * scale)})"


def _cases(report: Mapping[str, Any]) -> Dict[tuple, Mapping[str, Any]]:
    return {(c["scheme"], c["n"], c["link_gbps"], c.get("network", EMULATED), c["straggler"]): c
            for c in report["cases"]}


def pingpong_table(report: Mapping[str, Any]) -> List[str]:
    """Return the ping-pong of every real link: one-way latency and the bandwidth of large messages."""
    rows = report.get("pingpong") or []
    if not rows:
        return []
    lines = ["## The real links, measured", "",
             "A ping-pong between two hosts (`python -m psframework.netcluster.pingpong` through `hpc/netcluster "
             "pingpong`, MPI over each host's link): one-way latency, the median half round trip of 1-byte "
             "messages; bandwidth, of messages of the size below (median of their half round trips).", "",
             "| link | one-way latency (us) | bandwidth (Gb/s) | of the line rate | message (MiB) | load |",
             "|---|---|---|---|---|---|"]
    for p in rows:
        share = f"{p['bandwidth_bps'] / (p['link_gbps'] * 1e9):.2f}" if p["link_gbps"] else ""
        lines.append(f"| {link_words(p['link_gbps'], NETCLUSTER)} | {p['latency_s'] * 1e6:.0f} | "
                     f"{p['bandwidth_bps'] / 1e9:.3f} | {share} | {p['size_bytes'] / 2**20:g} | {p['load']:.1f} |")
    return lines + [""]


def _side_row(name: str, emu: Optional[Mapping[str, Any]], real: Optional[Mapping[str, Any]],
              versus: Optional[Mapping[str, float]], gbps: Optional[float]) -> str:
    """Return one row of the side-by-side table."""
    cells = [name]
    for case in (emu, real):
        cells += ([_range(case["spread"].get("iteration_s"), 1e3, 1), _range(case["spread"].get("over_baseline"))]
                  if case else ["", ""])
    cells.append(_range(versus))
    some = real or emu
    cells.append(f"{some['rank0_bytes_per_iteration'] / 2**20:.1f}" if some else "")
    if real and "rank0_link_rx_per_iteration" in real:
        rx, tx = real["rank0_link_rx_per_iteration"], real["rank0_link_tx_per_iteration"]
        cells += [f"{rx / MB:.1f} / {tx / MB:.1f}", f"{max(rx, tx) * 8 / (gbps * 1e9) * 1e3:.1f}" if gbps else ""]
    else:
        cells += ["", ""]
    loads = [c["spread"]["load"]["median"] for c in (emu, real) if c and "load" in c["spread"]]
    cells.append(" / ".join(f"{v:.1f}" for v in loads))
    return "| " + " | ".join(cells) + " |"


def side_by_side(report: Mapping[str, Any]) -> List[str]:
    """Return one table per worker count and link: every undisturbed case emulated and real."""
    by, names = _cases(report), list(dict.fromkeys(c["scheme"] for c in report["cases"]))
    lines: List[str] = []
    for n, link in dict.fromkeys((c["n"], c["link_gbps"]) for c in report["cases"] if c["straggler"] == "none"):
        lines += [f"### n = {n} workers, {link_words(link)}", "",
                  "| scheme | emulated ms / iteration | emulated x DDP | real ms / iteration | real x DDP | "
                  "real / emulated | rank 0 MiB / iteration | rank 0's link MB / iteration, in / out | "
                  "rank 0's link busy, ms / iteration | load |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name in names:
            emu, real = by.get((name, n, link, EMULATED, "none")), by.get((name, n, link, NETCLUSTER, "none"))
            if emu or real:
                lines.append(_side_row(name, emu, real, per_pass(report, name, n, link), link))
        lines.append("")
    return lines


def fault_table(report: Mapping[str, Any]) -> List[str]:
    """Return the slow-link cases: each run's time before and after one worker's link slowed."""
    cases = [c for c in report["cases"] if c["straggler"] == SLOW_LINK]
    if not cases:
        return []
    slow = report["inputs"]["slow_link"]
    lines = [f"## One worker's link slowed to {slow['fraction'] * 100:g}% of its rate", "",
             f"Real {cases[0]['link_gbps']:g} Gb/s links; once a run has written half its iterations the benchmark "
             f"slows the link of rank {slow['rank']}'s host (the second worker of a psframework job, the second DDP "
             "process) to that share of the rate, both directions, for the rest of the run (`hosts.set_link`, as "
             "`hpc/netcluster link H --rate R` does). Before: the run's iterations 2 to the fault; after: from "
             "the fault to the last but one. The slowdown is after over before within each run, so it does not "
             "depend on the machine's load from run to run.", "",
             "| scheme | ms / iteration before | ms / iteration after | slowdown | scheme / DDP after | "
             "workers detached | load |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        s = c["spread"]
        lines.append(f"| {c['scheme']} | {_range(s.get('before_s'), 1e3, 1)} | {_range(s.get('iteration_s'), 1e3, 1)} "
                     f"| {_range(s.get('slowdown'))} | {_range(s.get('over_baseline'))} | {c['detached']} | "
                     f"{_range(s.get('load'), 1, 1)} |")
    return lines + [""]


def differences(report: Mapping[str, Any]) -> List[str]:
    """Return, per link, each scheme's real time over its emulated time, and why they differ."""
    lines = ["## Where emulated and real links differ", ""]
    for n, link in dict.fromkeys((c["n"], c["link_gbps"]) for c in report["cases"] if c["straggler"] == "none"):
        parts = [f"{name} {_range(per_pass(report, name, n, link))}"
                 for name in dict.fromkeys(c["scheme"] for c in report["cases"])
                 if per_pass(report, name, n, link)]
        if parts:
            lines.append(f"- n = {n}, {link_words(link)}: real / emulated time per pass: " + ", ".join(parts))
        inbound = [f"{c['scheme']} {c['rank0_link_rx_per_iteration'] * 8 / (link * 1e9) * 1e3:.0f} ms"
                   for c in report["cases"] if link and (c["n"], c["link_gbps"], c["straggler"]) == (n, link, "none")
                   and "rank0_link_rx_per_iteration" in c and c["ranks"] > c["n"]]  # a server: not DDP's ring
        if inbound:
            lines.append(f"- n = {n}, {link_words(link)}: what rank 0's host receives per iteration takes, at the "
                         "line rate, " + ", ".join(inbound) + " (one link on a real network; the emulation lets "
                         "every worker's reply cross its own)")
    return lines + [*_link_limits(report), "", *WHY, ""]


def _link_limits(report: Mapping[str, Any]) -> List[str]:
    """Return a line for each shaped link whose ping-pong fell well short of its rate (the machine limits it)."""
    return [f"- The real {p['link_gbps']:g} Gb/s link carried {p['bandwidth_bps'] / 1e9:.1f} Gb/s in the "
            "ping-pong: here TCP over veth on the machine's cores, not the token bucket, sets its speed."
            for p in report.get("pingpong") or [] if p["link_gbps"] and p["bandwidth_bps"] < 0.8 * p["link_gbps"] * 1e9]


WHY = [
    "Why they differ. The emulation (comm.emulate) delays each message by its bytes over the link's rate "
    "plus 50 us, on the sender's side only: every rank's sends queue on its own emulated link, and the "
    "bytes themselves move at memory speed (MPI through shared memory, DDP's gloo through the loopback "
    "interface). A real link differs in three ways:",
    "- Incast at rank 0: every worker's reply crosses rank 0's one link, so a round's replies take the sum "
    "of their sizes over the rate; the emulation sends them on n separate links in parallel and does not "
    "model contention at the receiver. Schemes whose rank 0 receives much (ps: the gradients of every "
    "worker) lose most; DDP's ring spreads its traffic over every link and has no such hot spot.",
    "- TCP: each connection starts with a small window (slow start) and is paced by acknowledgements; the "
    "kernel's token bucket drops or delays bursts above its depth. The emulation's sleeps have none of "
    "that. And the real link has no added delay: this kernel has no netem, so only veth's own latency (the "
    "ping-pong) separates hosts, against the emulation's 50 us per message.",
    "- Processor work: TCP over veth costs kernel time on the same 2 cores the ranks compute on, and the "
    "emulation's spin-waits cost time too; on this machine both are part of every figure.",
]


def render_links(report: Mapping[str, Any]) -> List[str]:
    """Return the Markdown of a report with real links (everything after the common header)."""
    inputs = report["inputs"]
    loads = [r["load"] for r in report.get("runs", []) if r.get("load") is not None]
    return [
        f"- Real links: a cluster of {inputs['hosts']} hosts on this machine (network namespaces joined by veth "
        "cables to a bridge, `psframework.netcluster`), rank r of every job on host r mod "
        f"{inputs['hosts']}: rank 0 and each worker, and each DDP process, on a host of its own. Every host's "
        "cable is shaped in both directions by a token bucket (tbf) at the link's rate; MPICH runs over UCX's "
        "TCP transport on each host's interface (shared memory off), gloo on the same interface "
        "(GLOO_SOCKET_IFNAME, rank 0's host address as MASTER_ADDR). No delay is added to a real link: this "
        "kernel has no netem queueing discipline; its latency is veth's own (below).",
        f"- Every case ran {inputs['repeat']} times, in passes; within a pass, the cases of one link and network "
        "ran as DDP, case, DDP, case, ... Figures are the median run and the spread (min-max) over the passes; "
        "x DDP divides each run by the DDP runs next to it in the same pass. Load: the machine's 1-minute load "
        f"average at the start of each run (a job's own busy ranks count): {min(loads, default=0):.1f} to "
        f"{max(loads, default=0):.1f}.", "",
        *pingpong_table(report), "## Emulated and real links side by side", "",
        "ms / iteration: median (min-max) over the passes; rank 0 MiB: what rank 0 sends and receives per "
        "iteration as psframework counts it (DDP: a ring allreduce per process); rank 0's link: bytes its "
        "host's interface received and sent over the whole job divided by its iterations (headers, start-up "
        "and the final evaluation included), and the time those bytes occupy it at the line rate.", "",
        *side_by_side(report), *fault_table(report), *differences(report),
    ]
