"""The report of `psf bench plan`: each case's measured and predicted time, the errors, the rankings,
and the coded-path questions answered with the model for a cluster with a core per rank."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from psframework.bench.plan_errors import HELD_OUT_BOUND, MEDIAN_BOUND, RANK_GAP, WORST_BOUND, missed_term, summary
from psframework.plan.choose import code_sizes, shapes
from psframework.plan.cluster import Cluster, Straggler
from psframework.plan.graphs import DDP, Setup
from psframework.plan.predict import Prediction, predict
from psframework.plan.profile import Profile
from psframework.schemes.registry import get_scheme

QUESTION_COUNTS = (4, 8, 32, 128)


def row(check: Any, measured: Mapping[str, Any], predicted: Prediction, load: float) -> Dict[str, Any]:
    """Return one case of the report."""
    return {"label": check.label, "workload": check.workload.name, "contender": check.contender.name, "n": check.n,
            "k": predicted.setup.k, "link": check.link, "network": check.network, "held_out": check.held_out,
            "measured_s": measured["iteration_s"], "predicted_s": predicted.iteration_s,
            "error": predicted.iteration_s / measured["iteration_s"] - 1.0,
            "measured_cpu_s": measured["cpu_s_per_iteration"], "predicted_cpu_s": predicted.cpu_s,
            "measured_rank0_bytes": measured["rank0_bytes_per_iteration"], "predicted_rank0_bytes":
            predicted.rank0_bytes, "load": load, "core_per_rank": check.core_per_rank, "ranks": measured["ranks"],
            "rank0_busy_s": _rank0_busy(measured), "worker_compute_s": measured["worker_compute_s"]}


def _rank0_busy(measured: Mapping[str, Any]) -> Optional[float]:
    """Return the seconds per iteration rank 0 spends on anything but waiting for replies (None: no rank 0)."""
    parts = measured["rank0_parts_s"]
    return measured["iteration_s"] - parts["wait_s"] if "wait_s" in parts else None


def questions(profile: Profile, coded: str, versus_ddp: Sequence[str]) -> List[Dict[str, Any]]:
    """Answer the coded-path questions with the model: relay against direct delivery of the `coded` scheme, and
    each of `versus_ddp` (with one backup worker where it takes them) against DDP under a stop-go worker."""
    shm, tcp = profile.links["shm"], profile.links.get("tcp", profile.links["shm"])
    rows = []
    for n in QUESTION_COUNTS:
        for link in ("none", "1"):
            cluster = _core_per_rank(n, link, shm, tcp)
            for d in ("direct", "relay"):
                rows.append(_answer("relay", n, link, _best(profile, cluster, [Setup(coded, n, k, dissemination=d)
                                                                               for k in code_sizes(n)])))
        stopgo = _core_per_rank(n, "10", shm, tcp).with_straggler(Straggler("stopgo", 0.8))
        rows.append(_answer("stop-go", n, "10", predict(profile, Setup(DDP, n, n), stopgo)))
        for name in versus_ddp:
            rows.append(_answer("stop-go", n, "10", _best(profile, stopgo, [
                s for s in shapes(get_scheme(name), n, 1) if s.dissemination == "direct" and s.backup <= 1])))
    return rows


def _best(profile: Profile, cluster: Cluster, candidates: Sequence[Setup]) -> Prediction:
    return min((predict(profile, s, cluster) for s in candidates), key=lambda p: p.iteration_s)


def _core_per_rank(n: int, link: str, shm: Any, tcp: Any) -> Cluster:
    rate = math.inf if link == "none" else float(link) * 1e9 / 8
    return Cluster(hosts=n + 1, cores_per_host=1.0, link_Bps=rate, latency_s=5e-6, local=shm, remote=tcp)


def _answer(question: str, n: int, link: str, p: Prediction) -> Dict[str, Any]:
    s = p.setup
    return {"question": question, "n": n, "link": link, "scheme": s.scheme, "k": s.k,
            "dissemination": s.dissemination, "backup_workers": s.backup, "iteration_s": p.iteration_s}


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return plan.md from the report."""
    cases, s = report["cases"], summary(report["cases"])
    lines = ["# The cost model of `psf plan` against measured runs", "",
             f"Command: `{report['command']}`.", f"Machine: {report['machine']}. Date: {report['date']}.", "",
             "Each case trains as `psf bench peers` does (10 iterations, the first and last left out) and is predicted "
             "by `psf plan`'s model for the same machine: every rank on one pool of its cores (processor sharing), "
             "emulated links (comm.emulate: each rank's sends queue on a link of its own) or the real shaped links "
             "of a cluster of hosts made on this machine (a link per host, incast at the receiver). The profiles "
             "were taken by `psf plan calibrate` in the same run, each piece alone in one process. Error: "
             "predicted / measured - 1.", ""]
    lines += _summary_lines(s)
    lines += ["", "![predicted against measured](plan.png)", "", "## Cases", "",
              "| case | measured ms | predicted ms | error | CPU ms measured / predicted | held out |",
              "|---|---|---|---|---|---|"]
    for c in cases:
        lines.append(f"| {c['label']} | {c['measured_s'] * 1e3:.1f} | {c['predicted_s'] * 1e3:.1f} | "
                     f"{c['error']:+.0%} | {c['measured_cpu_s'] * 1e3:.0f} / {c['predicted_cpu_s'] * 1e3:.0f} | "
                     f"{c['held_out']} |")
    lines += critical_path_lines([c for c in cases if c.get("core_per_rank")])
    misses = [c for c in cases if abs(c["error"]) > WORST_BOUND]
    if misses:
        lines += ["", f"## Cases missed by more than {WORST_BOUND:.0%}", ""]
        lines += [f"- {c['label']} ({c['error']:+.0%}): {missed_term(c)}" for c in misses]
    lines += ["", "## The coded-path questions, answered by the model", ""] + question_lines(report["questions"], s)
    return "\n".join(lines) + "\n"


def critical_path_lines(cases: Sequence[Mapping[str, Any]]) -> List[str]:
    """Return the table of the cases run with a core per rank: their time is the critical path, not a sum."""
    if not cases:
        return []
    out = ["", "## A core per rank: the critical path", "",
           "Each rank bound to a core of its own (mpiexec -bind-to core; taskset on a cluster of hosts), so that the "
           "time per iteration is the job's critical path; waits poll without pausing, so processor time counts "
           "them too. Rank 0 busy: its time per iteration but the waits for replies; a worker's compute: "
           "its convolutions and updates. Ranks busy at once: their sum over the time per iteration (1: the "
           "ranks take turns; the rank count: all of them work all the time).", "",
           "| case | ms / iteration | rank 0 busy ms | worker compute ms | ranks busy at once | CPU ms, all ranks | "
           "predicted ms | error |", "|---|---|---|---|---|---|---|---|"]
    for c in cases:
        busy, worker = c["rank0_busy_s"], c["worker_compute_s"]
        together = "" if busy is None or worker is None else \
            f"{(busy + worker * (c['ranks'] - 1)) / c['measured_s']:.2f} of {c['ranks']}"
        out.append(f"| {c['label']} | {c['measured_s'] * 1e3:.1f} | {_ms(busy)} | {_ms(worker)} | {together} | "
                   f"{c['measured_cpu_s'] * 1e3:.1f} | {c['predicted_s'] * 1e3:.1f} | {c['error']:+.0%} |")
    return out


def _ms(seconds: Optional[float]) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.1f}"


def _summary_lines(s: Mapping[str, Any]) -> List[str]:
    pairs = s["pairs"]
    verdict = lambda ok: "within" if ok else "NOT within"  # noqa: E731
    median, worst = s["median_error"], s["worst_error"]
    out = ["## Summary", "",
           f"- {s['cases']} validation cases: median absolute error {median:.1%} ({verdict(median <= MEDIAN_BOUND)} "
           f"the {MEDIAN_BOUND:.0%} bound), worst {worst:.1%} ({verdict(worst <= WORST_BOUND)} the "
           f"{WORST_BOUND:.0%} bound).",
           f"- Rankings: of {pairs['compared']} pairs of schemes in one setting whose measured times differ by more "
           f"than {RANK_GAP:.0%}, the model orders {pairs['agree']} alike."]
    if pairs["disagree"]:
        out.append(f"- Ordered otherwise: {'; '.join(pairs['disagree'])}.")
    if s["held_out"]:
        worst_held = s["held_out_worst"]
        out.append(f"- {s['held_out']} held-out cases: worst error {worst_held:.1%} "
                   f"({verdict(worst_held <= HELD_OUT_BOUND)} the {HELD_OUT_BOUND:.0%} bound).")
    return out


def question_lines(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> List[str]:
    """Return the answers as tables: relay over direct, and each scheme over DDP under a stop-go worker."""
    relay = [r for r in rows if r["question"] == "relay"]
    coded = relay[0]["scheme"]
    out = [f"A cluster with a core per rank (n + 1 hosts, 5 us latency; the profile of vgg-small, batch 64). The "
           f"model's median error on this machine: {s['median_error']:.0%}.", "",
           f"Relay against direct delivery ({coded}, the best k of each): milliseconds per iteration", "",
           "| n | link | direct ms | relay ms | relay / direct |", "|---|---|---|---|---|"]
    by = {(r["question"], r["n"], r["link"], r["scheme"], r["dissemination"]): r for r in rows}
    for n in QUESTION_COUNTS:
        for link in ("none", "1"):
            d, r = by[("relay", n, link, coded, "direct")], by[("relay", n, link, coded, "relay")]
            words = "no limit" if link == "none" else f"{link} Gb/s"
            out.append(f"| {n} | {words} | {d['iteration_s'] * 1e3:.1f} (k={d['k']}) | {r['iteration_s'] * 1e3:.1f} "
                       f"(k={r['k']}) | {r['iteration_s'] / d['iteration_s']:.2f} |")
    names = list(dict.fromkeys(r["scheme"] for r in rows if r["question"] == "stop-go" and r["scheme"] != DDP))
    out += ["", "A worker stopped 80% of the time (0.4 s stopped, 0.1 s running), 10 Gb/s links: milliseconds per "
            "iteration, and DDP's time over the scheme's", "",
            "| n | DDP ms | " + " | ".join(f"{name} ms (DDP / {name})" for name in names) + " |",
            "|---|---|" + "---|" * len(names)]
    for n in QUESTION_COUNTS:
        ddp = by[("stop-go", n, "10", DDP, "direct")]["iteration_s"]
        cells = [by[("stop-go", n, "10", name, "direct")]["iteration_s"] for name in names]
        out.append(f"| {n} | {ddp * 1e3:.1f} | " + " | ".join(f"{c * 1e3:.1f} ({ddp / c:.2f})" for c in cells) + " |")
    return out


def scatter(cases: Sequence[Mapping[str, Any]], path: str) -> None:
    """Draw predicted against measured seconds per iteration, held-out cases apart (PNG, written atomically)."""
    from psframework.report_plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for held, marker, name in ((False, "o", "validation"), (True, "^", "held out")):
        chosen = [c for c in cases if bool(c["held_out"]) == held]
        ax.scatter([c["measured_s"] * 1e3 for c in chosen], [c["predicted_s"] * 1e3 for c in chosen], marker=marker,
                   label=name, alpha=0.7)
    top = max([c["measured_s"] for c in cases] + [c["predicted_s"] for c in cases]) * 1e3 * 1.1
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.plot([0, top], [0, top * 1.25], color="grey", linewidth=0.5, linestyle="--")
    ax.plot([0, top], [0, top * 0.75], color="grey", linewidth=0.5, linestyle="--")
    ax.set_xlabel("measured ms per iteration")
    ax.set_ylabel("predicted ms per iteration")
    ax.legend()
    save_figure(plt, ax, path)
