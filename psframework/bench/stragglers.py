"""Straggler benchmark: training jobs with and without a slowed worker, and the ratios between them.

Trains the cases of a case file (configs/bench/stragglers.yaml by default, --cases FILE for another)
under mpiexec, one after another in one invocation. Reports each case's mean iteration time, the
time rank 0 waits for the k-th reply, server bytes per iteration, the share of the iteration the
workers spend computing, and the ratios the case file lists (for a straggler case, how far its
slowed workers fell behind). Writes stragglers.json and stragglers.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from psframework.bench import cases as casefile
from psframework.bench import expectations as expect
from psframework.bench.runs import MIB, TrainingBenchmark, case_rows, header


def _row(label: str, s: Mapping[str, Any], case: Mapping[str, Any]) -> str:
    """Return one case's table row."""
    share = s["worker_compute_share"]
    return (f"| {label} | {s['n']} | {s['k']} | {s['mean_iteration_s'] * 1e3:.1f} | {s['mean_wait_s'] * 1e3:.1f} | "
            f"{s['server_bytes_sent_per_iteration'] / MIB:.2f} | "
            f"{s.get('server_bytes_received_per_iteration', 0) / MIB:.2f} | "
            f"{'' if share is None else f'{100 * share:.0f}%'} |")


def _straggler_text(report: Mapping[str, Any]) -> str:
    """Return what the straggler cases add, in words, from their recorded overrides and settings."""
    cases = (report.get("inputs") or {}).get("cases") or {}
    described: Dict[str, str] = {}
    for case in cases.values():
        s = case["setting"]["stragglers"]
        if s["model"] == "none":
            continue
        ranks = ", ".join(str(r) for r in s["ranks"])
        if s["model"] == "fixed":
            words = (f"worker rank(s) {ranks} sleep {s['factor'] - 1:g}x their own compute time after every reply "
                     f"they compute, so that they take {s['factor']:g}x as long, "
                     f"{'serving MPI' if s.get('responsive') else 'making no MPI progress'} while they sleep")
        elif s["model"] == "freeze":
            words = (f"worker rank(s) {ranks} are stopped (SIGSTOP) for {s['pause_s']:g} s at a time, "
                     f"{100 * s['duty']:.0f}% of the time, whatever they are doing")
        else:
            words = f"stragglers.model={s['model']}"
        described.setdefault(" ".join(o for o in case["overrides"] if o.startswith("stragglers.")), words)
    if not described:
        return ""
    return "The straggler cases add " + "; ".join(f"`{o}` ({words})" for o, words in described.items()) + ". "


def _lag(summary: Mapping[str, Any], ranks: Sequence[int]) -> str:
    """Return how far each slowed worker fell behind, from its counters and the detach log."""
    parts = []
    for rank in ranks:
        w = (summary.get("workers") or {}).get(str(rank))
        if w and not w["replies_sent"] + w["replies_skipped"]:
            parts.append(f"rank {rank} answered no command")
        elif w:
            parts.append(f"rank {rank} skipped {w['replies_skipped']:.0f} of "
                         f"{w['replies_sent'] + w['replies_skipped']:.0f} replies and fell up to "
                         f"{w['max_behind']:.0f} commands behind, applying {w['updates']:.0f} updates")
        detaches = [e for e in summary.get("membership") or [] if e["rank"] == rank]
        if detaches:
            parts.append(f"rank {rank} was detached {len(detaches)} time(s) for falling behind and readmitted "
                         f"{sum(e['readmitted_at'] is not None for e in detaches)} time(s)")
    return "; ".join(parts)


def case_fields(summary: Mapping[str, Any], case: Mapping[str, Any]) -> Dict[str, Any]:
    """Return the fields the case file's text sees beside a case's summary: `lag`, how far its slowed
    workers fell behind, as '; rank R skipped ...' (empty without a straggler)."""
    lag = _lag(summary, case["setting"]["stragglers"]["ranks"])
    return {"lag": f"; {lag}" if lag else ""}


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the straggler benchmark report as Markdown."""
    ctx = casefile.context(report, case_fields)
    lines = header(report, "Straggler benchmark") + casefile.paragraph(report, "intro", ctx) + [
        _straggler_text(report) + "Mean iteration time excludes the first iteration (warm-up).",
        "",
        "| case | n | k | mean iteration (ms) | mean wait for k-th reply (ms) | server MiB sent / it | "
        "server MiB received / it | worker compute share |",
        "|---|---|---|---|---|---|---|---|",
        *case_rows(report, _row),
        "",
        f"## {casefile.ratios_title(report)}",
        "",
        *casefile.ratio_lines(report, ctx),
        "",
        *casefile.paragraph(report, "closing", ctx),
        "The worker compute share is the workers' mean compute time per iteration (wall time of their "
        "convolutions and updates) over the run's mean iteration time: the setting is compute-bound when it "
        "is high.",
        "",
    ]
    return "\n".join(lines + expect.section(report, expectations))


BENCHMARK = TrainingBenchmark(name="stragglers", description=__doc__, render=render)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the straggler benchmark and write stragglers.json and stragglers.md (or re-render with --render)."""
    return BENCHMARK.main(argv)
