"""Scale-out benchmark: iteration time with G = 1, 2 and 4 servers at one global batch, next to the prediction.

Trains the cases of a case file (configs/bench/scaleout.yaml by default) under mpiexec, one after
another in one invocation: each scheme and server count with the servers' links emulated, and again
without emulation. The predicted iteration time of a case is its time without emulation plus the
analytic link time of its busiest server: the bytes it sends to its workers and sums with the other
servers (`expected_server_bytes`, `expected_sync_bytes`) over the emulated bandwidth. Reports each
case's measured and analytic bytes per server, and per scheme the measured speed-up over G = 1 next
to the predicted one. Writes scaleout.json and scaleout.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from psframework.bench import cases as casefile
from psframework.bench import expectations as expect
from psframework.bench.runs import TrainingBenchmark, header, mib


def analytic_servers(config: str, overrides: Sequence[str]) -> List[Dict[str, Any]]:
    """Return every server's analytic payload bytes per iteration: {group, sent, received, sync}."""
    from psframework.schemes.common import meta_model, placement_of
    from psframework.schemes.registry import get_scheme
    from psframework.schemes.validate import load_run, make_settings

    settings = make_settings(load_run(config, list(overrides)))
    scheme = get_scheme(settings.run.scheme)
    model = meta_model(settings)
    placement = placement_of(settings, model)
    sync = scheme.expected_sync_bytes(settings, model, placement)
    out = []
    for group in range(settings.run.servers):
        sent, received = scheme.expected_server_bytes(settings, model, placement, group)
        out.append({"group": group, "sent": sent, "received": received, "sync": sync})
    return out


def link_seconds(servers: Sequence[Mapping[str, Any]], bandwidth_gbps: Optional[float]) -> float:
    """Return how long the busiest server's sends (messages and sums) take on the emulated link."""
    if bandwidth_gbps is None:
        return 0.0
    return max(8.0 * (s["sent"] + s["sync"]) / (bandwidth_gbps * 1e9) for s in servers)


def _annotate(config: str, overrides: List[str], summary: Dict[str, Any]) -> None:
    summary["analytic_servers"] = analytic_servers(config, overrides)
    link = summary.get("emulation") or {}
    summary["analytic_link_s"] = link_seconds(summary["analytic_servers"], link.get("bandwidth_gbps"))


def servers_of(summary: Mapping[str, Any]) -> int:
    """Return how many servers a case ran with."""
    return len(summary.get("servers") or [None])


def figures(summaries: Mapping[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Return per scheme and server count: measured, local and predicted time, speed-ups over G = 1, their gap."""
    emulated = {(s["scheme"], servers_of(s)): s for s in summaries.values() if s.get("emulation")}
    local = {(s["scheme"], servers_of(s)): s for s in summaries.values() if not s.get("emulation")}
    rows = []
    for (scheme, g), s in emulated.items():
        twin = local.get((scheme, g))
        predicted = None if twin is None else twin["mean_iteration_s"] + s["analytic_link_s"]
        rows.append({"scheme": scheme, "servers": g, "n": s["n"], "measured_s": s["mean_iteration_s"],
                     "local_s": None if twin is None else twin["mean_iteration_s"],
                     "link_s": s["analytic_link_s"], "predicted_s": predicted})
    for row in rows:
        base = next((r for r in rows if r["scheme"] == row["scheme"] and r["servers"] == 1), None)
        row["speedup"] = None if base is None else base["measured_s"] / row["measured_s"]
        known = base is not None and base["predicted_s"] and row["predicted_s"]
        row["predicted_speedup"] = base["predicted_s"] / row["predicted_s"] if known else None
        row["gap"] = row["speedup"] / row["predicted_speedup"] - 1.0 if known else None
    return {"scaleout": sorted(rows, key=lambda r: (r["scheme"], r["servers"]))}


def _case_row(label: str, s: Mapping[str, Any]) -> str:
    """Return one case's row: time and, per server, measured and analytic bytes."""
    servers = s.get("servers") or [{"group": 0, "bytes_sent_per_iteration": s["server_bytes_sent_per_iteration"],
                                    "bytes_received_per_iteration": s["server_bytes_received_per_iteration"],
                                    "sync_bytes_per_iteration": 0.0}]
    analytic = {a["group"]: a for a in s["analytic_servers"]}
    cells = []
    for server in servers:
        a = analytic[server["group"]]
        cells.append(f"{mib(server['bytes_sent_per_iteration'])} ({mib(a['sent'])}) / "
                     f"{mib(server['bytes_received_per_iteration'])} ({mib(a['received'])}) / "
                     f"{mib(server['sync_bytes_per_iteration'])} ({mib(a['sync'])})")
    runs = s.get("repeat_iteration_s")
    each = f" ({', '.join(f'{t * 1e3:.1f}' for t in runs)})" if runs else ""
    return f"| {label} | {s['world_size']} | {s['mean_iteration_s'] * 1e3:.1f}{each} | {'<br>'.join(cells)} |"


def _speedup_row(r: Mapping[str, Any]) -> str:
    def fmt(value: Optional[float], spec: str) -> str:
        return "" if value is None else format(value, spec)

    return (f"| {r['scheme']} | {r['servers']} | {r['n']} | {r['measured_s'] * 1e3:.1f} | "
            f"{fmt(r['local_s'] and r['local_s'] * 1e3, '.1f')} | {r['link_s'] * 1e3:.1f} | "
            f"{fmt(r['predicted_s'] and r['predicted_s'] * 1e3, '.1f')} | {fmt(r['speedup'], '.2f')} | "
            f"{fmt(r['predicted_speedup'], '.2f')} | {fmt(r['gap'] and 100 * r['gap'], '+.1f')} |")


def render(report: Dict[str, Any], expectations: Optional[Dict[str, Any]] = None) -> str:
    """Return the scale-out benchmark report as Markdown."""
    ctx = casefile.context(report)
    lines = header(report, "Scale-out benchmark") + casefile.paragraph(report, "intro", ctx) + [
        "Per case, per server (one line each): MiB sent to its workers / received from them / summed with the "
        "other servers per iteration, measured (analytic). Mean iteration time excludes the first iteration; with "
        "repeats (`--repeat`), the median run's, every run's in brackets.",
        "",
        "| case | ranks | mean iteration (ms) | per server: sent / received / summed MiB per iteration |",
        "|---|---:|---:|---|",
        *[_case_row(label, s) for label, s in report["cases"].items()],
        "",
        "## Speed-up over one server",
        "",
        "Predicted iteration time: the case's time without emulation plus the busiest server's analytic "
        "link time (bytes sent and summed over the emulated bandwidth), as if no link time overlapped "
        "compute: where it does (the Stanza servers sum the head's gradients while their workers "
        "backpropagate) a case beats its prediction by up to the overlapped compute. Gap: measured "
        "speed-up over predicted speed-up, minus 1.",
        "",
        "| scheme | servers | n per group | measured (ms) | without emulation (ms) | analytic link (ms) | "
        "predicted (ms) | speed-up | predicted speed-up | gap (%) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[_speedup_row(r) for r in report["scaleout"]],
        "",
    ]
    return "\n".join(lines + expect.section(report, expectations))


BENCHMARK = TrainingBenchmark(name="scaleout", description=__doc__, render=render, annotate=_annotate,
                              figures=figures)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the scale-out benchmark and write scaleout.json and scaleout.md (or re-render with --render)."""
    return BENCHMARK.main(argv)
