"""Scheme benchmark: training jobs of several schemes on one model, with the configs' (emulated) links.

Trains the cases of a case file (configs/bench/schemes.yaml by default, --cases FILE for another)
under mpiexec, one after another in one invocation. Reports each case's mean iteration time, the
bytes rank 0 sent and received per iteration next to the analytic count of its scheme, and the
ratios the case file lists. Writes schemes.json and schemes.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psframework.bench import cases as casefile
from psframework.bench import expectations as expect
from psframework.bench.runs import TrainingBenchmark, case_rows, header, link_text, mib


def analytic_bytes(config: str, overrides: Sequence[str]) -> Optional[Tuple[int, int]]:
    """Return the analytic (sent, received) payload bytes per iteration of rank 0 for a case (None: no model)."""
    from psframework.schemes.common import analytic_server_bytes
    from psframework.schemes.validate import load_run, make_settings

    return analytic_server_bytes(make_settings(load_run(config, overrides)))


def figures(summaries: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Return how many cases' measured bytes contradict their analytic count (cases without one: none).

    Sent bytes must match exactly. Received bytes may fall short, never exceed: a lagging worker skips a
    reply rank 0 no longer needs (summary.json counts them per worker as replies_skipped).
    """
    def contradicts(s: Mapping[str, Any]) -> bool:
        sent, received = s["analytic_bytes"]
        return (round(s["server_bytes_sent_per_iteration"]) != sent
                or round(s["server_bytes_received_per_iteration"]) > received)

    return {"analytic_bytes_mismatches": sum(s.get("analytic_bytes") is not None and contradicts(s)
                                             for s in summaries.values())}


def _row(label: str, s: Mapping[str, Any], case: Mapping[str, Any]) -> str:
    """Return one case's table row."""
    sent, received = s.get("analytic_bytes") or (None, None)
    link = link_text((case.get("setting") or {}).get("link"), latency=True) if case else ""
    wait = (s.get("emulation") or {}).get("server_send_delay_s", 0.0) / max(1, s["iterations"])
    return (f"| {label} | {s['n']} | {'' if s['k'] is None else s['k']} | {link} | "
            f"{s['mean_iteration_s'] * 1e3:.1f} | {mib(s['server_bytes_sent_per_iteration'])} | "
            f"{mib(sent)} | {mib(s['server_bytes_received_per_iteration'])} | {mib(received)} | "
            f"{s['final_test_accuracy']:.3f} | {wait * 1e3:.1f} |")


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the scheme benchmark report as Markdown."""
    ctx = casefile.context(report)
    lines = header(report, "Scheme benchmark") + casefile.paragraph(report, "intro", ctx) + [
        "Links given a bandwidth are emulated (`comm.emulate`): every rank waits bytes / bandwidth + latency "
        "before posting each message; messages a rank sends queue on its own link, contention at the receiver "
        "is not modelled. Byte counts are the payload bytes rank 0 really sent and received; the analytic "
        "columns come from each scheme's `expected_server_bytes`. Mean iteration time excludes the first "
        "iteration. All cases start from the same seed and see the same batches.",
        "",
        "| case | n | k | link | mean iteration (ms) | rank 0 MiB sent / it | analytic | rank 0 MiB received / it | "
        "analytic | test accuracy | rank 0 emulated send wait / it (ms) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *case_rows(report, _row),
        "",
        f"## {casefile.ratios_title(report)}",
        "",
        *casefile.ratio_lines(report, ctx),
        f"- cases whose measured bytes contradict the analytic count (sent bytes differ, or more bytes received; "
        f"fewer are received when a lagging worker skips a reply rank 0 no longer needs): "
        f"{report['analytic_bytes_mismatches']}.",
        "",
        *casefile.paragraph(report, "closing", ctx),
    ]
    return "\n".join(lines + expect.section(report, expectations))


def _annotate(config: str, overrides: List[str], summary: Dict[str, Any]) -> None:
    summary["analytic_bytes"] = analytic_bytes(config, overrides)


BENCHMARK = TrainingBenchmark(name="schemes", description=__doc__, render=render, annotate=_annotate,
                              figures=figures)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the scheme benchmark and write schemes.json and schemes.md (or re-render with --render)."""
    return BENCHMARK.main(argv)
