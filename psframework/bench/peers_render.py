"""The Markdown report of psf bench peers (peers.md): a table per worker count and link, rank 0's time, ratios."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from psframework.bench import expectations as expect
from psframework.bench import peers_links as links_report
from psframework.bench.peers_cases import RANK0_PARTS, indexed
from psframework.bench.peers_links import EMULATED, link_words
from psframework.bench.runs import MIB, setting_text


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
