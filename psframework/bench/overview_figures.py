"""The headline figures of each committed benchmark report, read from its JSON alone, for docs/benchmarks.md.

Each function takes one report (the dict of NAME.json) and returns Markdown lines: bullets and small
tables whose every number is read from the report. Paths into a report use the language of the
expectations file (psframework.bench.expectations), so a figure that is missing raises OverviewError
naming the path.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psframework.bench import cases as casefile
from psframework.bench import expectations as expect
from psframework.bench.peers_links import EMULATED, NETCLUSTER, SLOW_LINK, link_words, per_pass
from psframework.bench.runs import setting_text

Report = Mapping[str, Any]
BASELINE = "ddp"  # torch DDP, which the plan report's questions answer beside the schemes
NETWORK_WORDS = {EMULATED: "emulated", NETCLUSTER: "real"}
MACHINE = re.compile(r"^(?P<cpu>[^,]+), (?P<cores>\d+) cores\b")
# What a case-file ratio divides, in words (a field list not named here is shown as its field names).
FIELD_WORDS = {
    ("mean_iteration_s",): "iteration time",
    ("server_bytes_sent_per_iteration",): "rank 0 bytes sent",
    ("server_bytes_sent_per_iteration", "server_bytes_received_per_iteration"): "rank 0 bytes sent and received",
}


class OverviewError(ValueError):
    """A committed report that lacks a figure the overview quotes."""


def found(report: Report, path: str) -> List[Any]:
    """Return every value other than null that `path` reaches in the report."""
    return [value for _, value in expect.resolve(report, path) if value is not None]


def one(report: Report, path: str) -> Any:
    """Return the one value `path` reaches; OverviewError when it reaches none or several."""
    values = found(report, path)
    if len(values) != 1:
        raise OverviewError(f"the {report.get('benchmark')!r} report: {path!r} reaches {len(values)} values, "
                            "expected one")
    return values[0]


def span(report: Report, *paths: str, spec: str = ".2f") -> str:
    """Return the least and the greatest value the paths reach, as 'LOW to HIGH' (one figure when equal)."""
    values = [value for path in paths for value in found(report, path)]
    if not values:
        raise OverviewError(f"the {report.get('benchmark')!r} report: nothing at {' or '.join(paths)!r}, "
                            "expected figures")
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low} to {high}"


def machine_text(machine: Any) -> str:
    """Return a report's machine in words (the JSON holds a description, or a dict of its parts)."""
    if isinstance(machine, Mapping):
        return (f"{machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, torch {machine['torch']}, "
                f"{machine['platform']}")
    return str(machine)


def cpu_and_cores(machine: Any) -> Tuple[str, int]:
    """Return a report's CPU and its core count."""
    if isinstance(machine, Mapping):
        return str(machine["cpu"]), int(machine["cores"])
    match = MACHINE.match(str(machine))
    if not match:
        raise OverviewError(f"machine {machine!r}: expected 'CPU, N cores, ...'")
    return match.group("cpu"), int(match.group("cores"))


def ranks(report: Report) -> List[int]:
    """Return how many processes each job of a report ran (none for a single-process benchmark)."""
    counts = found(report, "cases.*.ranks") + found(report, "inputs.cases.*.ranks")
    world = (report.get("machine") or {}).get("world_size") if isinstance(report.get("machine"), Mapping) else None
    return [int(c) for c in counts] + ([int(world)] if world else [])


def settings(report: Report) -> str:
    """Return the models and data a training benchmark's cases train, with their iterations, in words."""
    cases = (report.get("inputs") or {}).get("cases") or {}
    return "; ".join(dict.fromkeys(f"{setting_text(case['setting'])}, {report['cases'][label]['iterations']} "
                                   "iterations" for label, case in cases.items()))


def threads(count: int) -> str:
    """Return a thread count in words."""
    return f"{count} thread" + ("" if count == 1 else "s")


# ---------------------------------------------------------------- codec


def codec(report: Report) -> List[str]:
    """Return the codec report's headline: decoding error, mixed precision, decode speed."""
    n, k = report["inputs"]["pairs"][-1]
    size = one(report, f"speed[n={n},k={k}].L")
    sazd = one(report, f"accuracy[code=SAZD,n={n},k={k},L={size}].worst_rel_error")
    poly = one(report, f"accuracy[code=Poly chebyshev,n={n},k={k},L={size}].worst_rel_error")
    error = (f"Worst float32 decoding error over every arrival set at (n,k) = ({n},{k}), L = {size}: SAZD "
             f"{sazd:.2g}, polynomial code (Chebyshev nodes) {poly:.2g}.")
    if report.get("mixed_precision"):
        pn, pk = report["inputs"]["precision_pairs"][-1]
        own = "mixed_precision.rows[code={}].worst_vs_same_over_own"
        error += (f" Workers in bf16 or fp16, up to ({pn},{pk}): SAZD's decoding adds at most "
                  f"{max(found(report, own.format('SAZD'))):.2f}x the precision's own rounding, Poly (Chebyshev) "
                  f"up to {max(found(report, own.format('Poly chebyshev'))):.0f}x.")
    return [f"* {error}", f"* {_decode_speed(report)}"]


def _decode_speed(report: Report) -> str:
    """Return the codec report's decode speed: against NumPy's sum and against polynomial decoding."""
    machine = report["machine"]
    each = (f"{threads(machine['decode_threads'])} each" if machine["decode_threads"] == machine["blas_threads"]
            else f"SAZD {threads(machine['decode_threads'])}, Poly {threads(machine['blas_threads'])}")
    decode = "speed[k>=8].sazd_decode.{}.poly_over_sazd_decode"
    text = ""
    middle = found(report, "speed[n=12,k=8]")
    if middle:
        text = (f"Cached SAZD decode of {middle[0]['block_set_MiB']:.0f} MiB block sets at ({middle[0]['n']},"
                f"{middle[0]['k']}) over NumPy's sum of the same k packets: "
                f"{span(report, 'speed[n=12,k=8].sazd_decode.*.ratio_to_numpy_sum')} over the arrival sets. ")
    lost = span(report, decode.format("first * systematic dropped"), decode.format("worst of * systematic dropped"))
    return text + (f"Poly decode time over SAZD's, k >= 8, {each}: {span(report, decode.format('all systematic'))}"
                   f" with every systematic packet, {span(report, decode.format('1 systematic dropped'))} with one "
                   f"lost, {lost} with n - k lost.")


def codec_threads(report: Report) -> List[str]:
    """Return the headline of a codec report measured with fewer threads: decode speed only."""
    return [f"* {_decode_speed(report)}"]


# ---------------------------------------------------------------- comm


def comm(report: Report) -> List[str]:
    """Return the comm report's headline: transport over mpi4py bandwidth for large messages, its fixed cost."""
    large = found(report, "bandwidth[bytes>=4194304]")
    if not large:
        raise OverviewError("the 'comm' report: no message of 4 MiB or more in 'bandwidth'")
    sizes = [row["bytes"] / 2**20 for row in large]
    spread = {key: span(report, f"bandwidth[bytes>=4194304].ratio_{key}") for key in
              ("transport_pingpong", "server_to_worker", "worker_to_server")}
    small = report["bandwidth"][0]
    return [f"* Transport over mpi4py's pingpong bandwidth, messages of {min(sizes):g} to {max(sizes):g} MiB, "
            f"{report['machine']['world_size']} ranks: pingpong {spread['transport_pingpong']}, server -> worker "
            f"{spread['server_to_worker']}, worker -> server {spread['worker_to_server']}.",
            f"* Its fixed cost: {small['bytes'] / 1024:g} KiB takes {small['transport_pingpong_s'] * 1e6:.1f} us one "
            f"way through the transport, {small['pingpong_s'] * 1e6:.1f} us through mpi4py's pingpong."]


# ---------------------------------------------------------------- the training benchmarks with case files


def case_file_ratios(report: Report) -> List[str]:
    """Return a table of the ratios a case-file benchmark reports: which cases, of what, the value."""
    ctx = casefile.context(report)
    values = report.get("ratios") or {}
    rows = ["| ratio | of | value |", "|---|---|---:|"]
    for ratio in (report.get("inputs") or {}).get("ratios") or []:
        value = values.get(ratio["name"])
        if value is None:
            continue
        numerator, denominator = (casefile.first_of(ctx, ratio[side]["case"]) for side in casefile.SIDES)
        fields = tuple(ratio["numerator"]["field"])
        what = FIELD_WORDS.get(fields, " + ".join(fields))
        rows.append(f"| `{numerator['label']}` over `{denominator['label']}` | {what} | {value:.2f} |")
    return rows if len(rows) > 2 else []


def stragglers(report: Report) -> List[str]:
    """Return the stragglers report's headline: its settings and its ratios."""
    return [f"* Cases: {settings(report)}.", "", *case_file_ratios(report)]


def schemes(report: Report) -> List[str]:
    """Return the schemes report's headline: its setting, its ratios, the bytes against the analytic counts."""
    mismatches = report["analytic_bytes_mismatches"]
    return [f"* Cases: {settings(report)}. Measured bytes contradict the analytic count in {mismatches} of "
            f"{len(report['cases'])} cases.", "", *case_file_ratios(report)]


def scaleout(report: Report) -> List[str]:
    """Return the scale-out report's headline: each scheme's speed-up over one server, measured and predicted."""
    rates = sorted({s["emulation"]["bandwidth_gbps"] for s in report["cases"].values() if s.get("emulation")})
    parts = []
    for scheme in dict.fromkeys(row["scheme"] for row in report["scaleout"]):
        rows = [r for r in report["scaleout"] if r["scheme"] == scheme and r["servers"] > 1]
        measured = ", ".join(f"{r['speedup']:.2f}x with {r['servers']}" for r in rows)
        predicted = ", ".join(f"{r['predicted_speedup']:.2f}x" for r in rows)
        parts.append(f"`{scheme}` {measured} (predicted {predicted})")
    return [f"* Cases: {settings(report)}.",
            f"* Speed-up over one server, the servers' links emulated at {' and '.join(f'{g:g}' for g in rates)} "
            f"Gb/s, against the one the analytic bytes predict: {'; '.join(parts)}."]


# ---------------------------------------------------------------- peers


def peer_cases(report: Report, n: int, link: Optional[float], network: str = EMULATED) -> Dict[tuple, Any]:
    """Return {(scheme, straggler): case} of one worker count, link and network."""
    return {(c["scheme"], c["straggler"]): c for c in report["cases"]
            if (c["n"], c["link_gbps"], c.get("network", EMULATED)) == (n, link, network)}


def peers(report: Report) -> List[str]:
    """Return the peers report's headline: against DDP undisturbed and in stop-go, relay over direct."""
    base, n = report["inputs"]["baseline"], min(c["n"] for c in report["cases"])
    cases = peer_cases(report, n, None)
    ddp, ddp_stopped = cases[(base, "none")], cases.get((base, "stop-go"))
    rows = [f"| scheme | ms / iteration (x {base}) | processor time (x {base}) | {base} / scheme in stop-go |",
            "|---|---|---|---|"]
    for (scheme, straggler), case in cases.items():
        if straggler != "none":
            continue
        stopped = cases.get((scheme, "stop-go"))
        versus = (f"{ddp_stopped['iteration_s'] / stopped['iteration_s']:.2f}" if stopped and ddp_stopped
                  and scheme != base else "")
        rows.append(f"| {scheme} | {case['iteration_s'] * 1e3:.1f} ({case['iteration_s'] / ddp['iteration_s']:.2f}x) "
                    f"| {case['cpu_s_per_iteration'] / ddp['cpu_s_per_iteration']:.2f}x | {versus} |")
    return [f"* Cases: `{report['inputs']['config']}`, {setting_text(report['inputs']['setting'])}.",
            f"* n = {n} workers, no emulation, {report['inputs']['iterations']} iterations per case; stop-go "
            f"({report['inputs']['stop_s']:g} s stopped, {report['inputs']['go_s']:g} s running): {base} takes "
            f"{ddp_stopped['iteration_s'] * 1e3:.1f} ms per iteration.", "", *rows, "", *_relay(report)]


def _relay(report: Report) -> List[str]:
    """Return the peers report's pair ratios (relay over direct) in every setting, and the detached workers."""
    lines = []
    for name, (numerator, denominator) in (report["inputs"].get("pairs") or {}).items():
        parts = [f"n = {r['n']}, {link_words(r['link_gbps'])}: {r[name]:.2f}" for r in report["ratios"]
                 if r.get(name) is not None]
        lines.append(f"* `{numerator}` over `{denominator}`, iteration time: {'; '.join(parts)}.")
    calm = [c["detached"] for c in report["cases"] if c["straggler"] == "none"]
    lines.append(f"* Workers detached in the {len(calm)} undisturbed cases: {sum(calm)}.")
    return lines


def peers_links(report: Report) -> List[str]:
    """Return the real-links report's headline: the links, real over emulated time, a slowed link."""
    pings = "; ".join(f"{link_words(p['link_gbps'], NETCLUSTER)} {p['bandwidth_bps'] / 1e9:.2f} Gb/s, "
                      f"{p['latency_s'] * 1e6:.0f} us one way" for p in report.get("pingpong") or [])
    lines = [f"* Cases: `{report['inputs']['config']}`, {setting_text(report['inputs']['setting'])}; "
             f"{report['inputs']['iterations']} iterations per run, on {report['inputs']['hosts']} hosts.",
             f"* The links, by ping-pong ({report['pingpong'][0]['size_bytes'] / 2**20:g} MiB messages): {pings}.",
             f"* Real over emulated time in the same pass, median (min-max) of {report['inputs']['repeat']} passes, "
             f"n = {report['cases'][0]['n']}:", "", "| scheme | " +
             " | ".join(link_words(link) for link in _links(report)) + " |", "|---|" + "---|" * len(_links(report))]
    for scheme in dict.fromkeys(c["scheme"] for c in report["cases"] if c["straggler"] == "none"):
        cells = [_spread(per_pass(report, scheme, report["cases"][0]["n"], link)) for link in _links(report)]
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return lines + ["", *_incast(report), *_slow_link(report)]


def _links(report: Report) -> List[float]:
    return list(dict.fromkeys(c["link_gbps"] for c in report["cases"] if c["straggler"] == "none"))


def _spread(spread: Optional[Mapping[str, float]]) -> str:
    return "" if not spread else f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})"


def _incast(report: Report) -> List[str]:
    """Return what rank 0's one real link receives per iteration, where a server gathers the replies."""
    parts = [f"`{c['scheme']}` {c['rank0_link_rx_per_iteration'] / 1e6:.1f} MB, "
             f"{c['rank0_link_rx_per_iteration'] * 8 / (c['link_gbps'] * 1e9) * 1e3:.0f} ms at the line rate"
             for c in report["cases"] if c.get("network") == NETCLUSTER and c["straggler"] == "none"
             and c["link_gbps"] == min(_links(report)) and c["ranks"] > c["n"] and "rank0_link_rx_per_iteration" in c]
    return [f"* Rank 0's real {min(_links(report)):g} Gb/s link receives per iteration: {'; '.join(parts)} (the "
            "emulation lets every worker's reply cross a link of its own)."] if parts else []


def slowed_link_cases(report: Report) -> List[Mapping[str, Any]]:
    """Return the cases whose worker's link was slowed half-way through the run."""
    return [c for c in report["cases"] if c["straggler"] == SLOW_LINK]


def _slow_link(report: Report) -> List[str]:
    """Return the cases whose worker's link was slowed half-way: each one's slowdown."""
    cases = slowed_link_cases(report)
    if not cases:
        return []
    slow = report["inputs"]["slow_link"]
    parts = [f"`{c['scheme']}` {_spread(c['spread'].get('slowdown'))} ({c['detached']} detached)" for c in cases]
    return [f"* One worker's real {cases[0]['link_gbps']:g} Gb/s link slowed to {slow['fraction'] * 100:g}% of its "
            f"rate half-way through each run, time after over before: {'; '.join(parts)}."]


def readme_slow_link(report: Report, source: str) -> List[str]:
    """Return the README's example: each scheme's time after one worker's real link slowed, over before."""
    cases = slowed_link_cases(report)
    if not cases:
        raise OverviewError(f"{source}: no case with a slowed link, expected the README's example")
    inputs = report["inputs"]
    slow, passes, setting = inputs["slow_link"], inputs.get("repeat", 1), inputs["setting"]
    lines = [f"For example, with one worker's real {cases[0]['link_gbps']:g} Gb/s link slowed to "
             f"{slow['fraction'] * 100:g}% of its rate half-way through a run ({setting['model']}, "
             f"n = {setting['n']}, {report['machine']}, medians of {passes} passes, `{source}`; the contenders of "
             f"`{inputs['cases']}`, where ps has one backup worker):", "",
             "| scheme | time per iteration after the slowdown, over before |", "|---|---|"]
    ordered = sorted(cases, key=lambda c: -c["spread"]["slowdown"]["median"])
    return lines + [f"| {'torch DDP' if c['scheme'] == BASELINE else '`' + c['scheme'] + '`'} | "
                    f"{c['spread']['slowdown']['median']:.2f}x |" for c in ordered]


# ---------------------------------------------------------------- plan


def plan(report: Report, summary: Mapping[str, Any]) -> List[str]:
    """Return the plan report's headline from its summary (psframework.bench.plan_errors.summary)."""
    workloads = "; ".join(w["name"] for w in report["inputs"]["workloads"])
    counts = sorted({c["n"] for c in report["cases"]})
    networks = " and ".join(NETWORK_WORDS.get(c, c) for c in dict.fromkeys(c["network"] for c in report["cases"]))
    pairs = summary["pairs"]
    return [f"* Workloads: {workloads}. Workers: n = {counts[0]} to {counts[-1]}, on {networks} links.",
            f"* {summary['cases']} validation cases: median absolute error {summary['median_error']:.1%}, worst "
            f"{summary['worst_error']:.1%}; {summary['held_out']} held-out cases: worst "
            f"{summary['held_out_worst']:.1%}. Of {pairs['compared']} pairs of schemes in one setting, the model "
            f"orders {pairs['agree']} as measured."]


def plan_questions(report: Report) -> List[str]:
    """Return the model's answers to the coded-path questions: relay over direct, DDP over each scheme in stop-go."""
    rows = report["questions"]
    by = {(r["question"], r["n"], r["link"], r["scheme"], r["dissemination"]): r for r in rows}
    relay = [r for r in rows if r["question"] == "relay" and r["dissemination"] == "relay"]
    links = list(dict.fromkeys(r["link"] for r in relay))
    lines = [f"* Relay over direct delivery of `{relay[0]['scheme']}`, iteration time:", "",
             "| n | " + " | ".join(_limit(link) for link in links) + " |", "|---|" + "---|" * len(links)]
    for n in dict.fromkeys(r["n"] for r in relay):
        cells = [r["iteration_s"] / by[("relay", n, r["link"], r["scheme"], "direct")]["iteration_s"]
                 for link in links for r in relay if (r["n"], r["link"]) == (n, link)]
        lines.append(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    stop = [r for r in rows if r["question"] == "stop-go"]
    names = list(dict.fromkeys(r["scheme"] for r in stop if r["scheme"] != BASELINE))
    lines += ["", f"* {BASELINE} over each scheme under a stop-go worker, {_limit(stop[0]['link'])} links:", "",
              "| n | " + " | ".join(f"`{name}`" for name in names) + " |", "|---|" + "---|" * len(names)]
    for n in dict.fromkeys(r["n"] for r in stop):
        ddp = next(r["iteration_s"] for r in stop if r["n"] == n and r["scheme"] == BASELINE)
        cells = [ddp / r["iteration_s"] for name in names for r in stop if (r["n"], r["scheme"]) == (n, name)]
        lines.append(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return lines


def _limit(link: str) -> str:
    """Return a link of the model's cluster in words ('none': no limit)."""
    return "no link limit" if link == "none" else f"{float(link):g} Gb/s"


def counts_of(values: Sequence[int]) -> str:
    """Return 'LOW to HIGH' of some counts."""
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)} to {max(values)}"
