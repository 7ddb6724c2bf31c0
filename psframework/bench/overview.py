"""docs/benchmarks.md, written from the committed reports' JSON alone: `python -m psframework.bench.overview`.

Reads every report the page summarises (docs/benchmarks/NAME.json, and those under one-thread/ and
netcluster/), and writes the overview: what each benchmark measures, the command, machine and date
of its committed run with its headline figures, and every bound the committed runs do not meet, each
judged by the code its report uses (psframework.bench.expectations with docs/benchmarks/expectations.yaml;
the plan report's own bounds). The prose is fixed here; every number comes from a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from psframework.bench import expectations as expect
from psframework.bench import overview_figures as figs
from psframework.bench import plan_errors
from psframework.bench.overview_figures import OverviewError, Report
from psframework.bench.peers_links import EMULATED
from psframework.bench.report import DEFAULT_EXPECTATIONS, DEFAULT_OUT
from psframework.fileio import atomic_write_text

PROG = "python -m psframework.bench.overview"
DEFAULT_PAGE = os.path.join("docs", "benchmarks.md")
README = "README.md"
README_SOURCE = os.path.join("netcluster", "peers.json")  # the report the README's example comes from
BEGIN, END = "<!-- figures from the committed reports: begin -->", "<!-- figures from the committed reports: end -->"
LINK_BASE = "benchmarks"  # where the reports are, seen from the page
MEASURES, REAL_LINKS, COST_MODEL = "measures", "real links", "cost model"


@dataclass(frozen=True)
class Entry:
    """A committed report the page summarises."""

    path: str  # its JSON, relative to the reports' directory
    title: str
    measures: str  # what it measures, in words
    figures: Callable[[Report], List[str]]  # its headline, from the JSON
    section: str = MEASURES


@dataclass(frozen=True)
class Loaded:
    """A report read from its JSON."""

    entry: Entry
    report: Dict[str, Any]

    def link(self, text: str = "") -> str:
        """Return a Markdown link to the report's page."""
        page = self.entry.path[:-len(".json")] + ".md"
        return f"[{text or self.entry.title}]({LINK_BASE}/{page})"


def plan_figures(report: Report) -> List[str]:
    """Return the plan report's headline: its summary and the model's answers."""
    return figs.plan(report, plan_errors.summary(report["cases"])) + figs.plan_questions(report)


def critical_path_figures(report: Report) -> List[str]:
    """Return the headline of the plan report with a core per rank: the model's error and the ranks busy at once."""
    s = plan_errors.summary(report["cases"])
    return [f"* {s['cases']} cases, each rank on a core of its own (rank 0 and one worker, or two DDP processes): "
            f"the model's median absolute error {s['median_error']:.1%}, worst {s['worst_error']:.1%}."]


ENTRIES = (
    Entry("codec.json", "codec", "decoding error of SAZD against polynomial codes over every arrival set, with "
          "workers in bf16 or fp16 too; encode and decode speed next to a NumPy sum", figs.codec),
    Entry("one-thread/codec.json", "codec, one thread", "the codec's decode speed with one thread each",
          figs.codec_threads),
    Entry("comm.json", "comm", "transport bandwidth next to mpi4py's pingpong measured in the same run, and the "
          "cost of first-k-of-n receives", figs.comm),
    Entry("stragglers.json", "stragglers", "slowdown of coded and uncoded training with one worker slow "
          "(unresponsive while it sleeps) or stopped (SIGSTOP)", figs.stragglers),
    Entry("scaleout.json", "scaleout", "one, two and four servers at one global batch, the servers' links emulated, "
          "against the speed-up their analytic bytes predict", figs.scaleout),
    Entry("peers.json", "peers", "torch DDP (gloo, one process per worker) against the schemes on emulated links, "
          "undisturbed and with one worker in stop-go (stopped and let go, over and over); ps and stanza with one "
          "backup worker", figs.peers),
    Entry("schemes.json", "schemes", "bytes and time per iteration of each scheme on the benchmark pair, next to "
          "each scheme's analytic bytes", figs.schemes),
    Entry("netcluster/peers.json", "peers, real links", "the peers cases on a cluster of hosts the benchmark makes "
          "on the machine (kernel-shaped links, MPI and gloo over TCP), next to the emulated links; one worker's "
          "link slowed half-way through a run", figs.peers_links, REAL_LINKS),
    Entry("plan.json", "plan", "`psf plan`'s cost model against measured runs (emulated and real links, held-out "
          "cases), and the coded-path questions it answers", plan_figures, COST_MODEL),
    Entry("pinned/plan.json", "plan, a core per rank", "`psf plan`'s cost model against jobs whose every rank has "
          "a core of its own: their critical path, and how many ranks work at once", critical_path_figures,
          COST_MODEL),
)


def load(reports: str, entries: Sequence[Entry] = ENTRIES) -> List[Loaded]:
    """Read every report's JSON; OverviewError names one that cannot be read."""
    loaded = []
    for entry in entries:
        path = os.path.join(reports, entry.path)
        try:
            with open(path, encoding="utf-8") as fh:
                report = json.load(fh)
        except (OSError, ValueError) as exc:
            raise OverviewError(f"cannot read report {path!r}: {exc}") from None
        if not isinstance(report, dict) or "benchmark" not in report:
            raise OverviewError(f"{path}: expected a benchmark report (a JSON object with 'benchmark')")
        loaded.append(Loaded(entry, report))
    return loaded


# ---------------------------------------------------------------- bounds


def plan_verdicts(report: Report) -> List[expect.Verdict]:
    """Return the plan report's own bounds (its error bounds), judged against its summary."""
    s = plan_errors.summary(report["cases"])
    bounds = [
        expect.Expectation("median_error", "median_error", f"median absolute error of the {s['cases']} validation "
                           "cases", max=plan_errors.MEDIAN_BOUND),
        expect.Expectation("worst_error", "worst_error", f"worst absolute error of the {s['cases']} validation cases",
                           max=plan_errors.WORST_BOUND),
        expect.Expectation("held_out_worst", "held_out_worst", f"worst absolute error of the {s['held_out']} "
                           "held-out cases", max=plan_errors.HELD_OUT_BOUND)]
    return [expect.judge(s, bound) for bound in bounds]


def verdicts(item: Loaded, expectations: str) -> List[expect.Verdict]:
    """Return every bound of a report judged as its own page judges it."""
    benchmark = item.report["benchmark"]
    block = expect.load(expectations, benchmark) if os.path.isfile(expectations) else None
    found = expect.evaluate(item.report, block)
    return found + (plan_verdicts(item.report) if benchmark == "plan" else [])


def plan_misses(report: Report) -> str:
    """Return the plan report's misses by the term its page names for each."""
    misses = [c for c in report["cases"] if abs(c["error"]) > plan_errors.WORST_BOUND]
    terms: Dict[str, int] = {}
    for case in misses:
        term = plan_errors.missed_term(case).split(":")[0]
        terms[term] = terms.get(term, 0) + 1
    named = "; ".join(f"{term} in {count}" for term, count in terms.items())
    return (f"Why: {len(misses)} of the {len(report['cases'])} cases miss by more than {plan_errors.WORST_BOUND:.0%}, "
            f"and the report names the term that misses each: {named}.")


def reasons(item: Loaded, verdict: expect.Verdict, loaded: Sequence[Loaded]) -> List[str]:
    """Return what the reports say about a bound that is not met."""
    out = []
    for other in loaded:
        if other is not item and other.report["benchmark"] == item.report["benchmark"]:
            there = expect.judge(other.report, verdict.expectation)
            if there.status == expect.MET:
                out.append(f"met in {other.link()}: {there.value:.3g}")
    if verdict.where.startswith("speed["):
        block = figs.found(item.report, verdict.where.split(".")[0])
        if len(block) == 1 and "packet_symbols" in block[0]:
            out.append(f"SAZD's packets there are {block[0]['packet_symbols']} symbols long, its blocks "
                       f"{block[0]['L']}")
    return out + peers_reasons(item.report, verdict)


def peers_reasons(report: Report, verdict: expect.Verdict) -> List[str]:
    """Return the figures behind an unmet peers ratio: each side's stop-go slowdown, or a pair's processor time."""
    prefix, _, key = verdict.expectation.field.rpartition(".")
    entries = figs.found(report, prefix) if prefix.startswith("ratios") else []
    if len(entries) != 1 or "baseline" not in report.get("inputs", {}):
        return []
    at = entries[0]
    cases = figs.peer_cases(report, at["n"], at["link_gbps"], at.get("network", EMULATED))
    base = report["inputs"]["baseline"]
    ddp, ddp_go = cases.get((base, "none")), cases.get((base, "stop-go"))
    for (name, straggler), go in cases.items():
        calm = cases.get((name, "none"))
        if straggler == "stop-go" and key == f"{base}_over_{name.replace('-', '_')}_stop_go" and calm and ddp \
                and ddp_go:
            return [f"in stop-go {base} slows {ddp_go['iteration_s'] / ddp['iteration_s']:.2f}x and {name} "
                    f"{go['iteration_s'] / calm['iteration_s']:.2f}x; undisturbed, {name} takes "
                    f"{calm['iteration_s'] / ddp['iteration_s']:.2f}x {base}'s time"]
    pair = (report["inputs"].get("pairs") or {}).get(key)
    if not pair or (pair[0], "none") not in cases or (pair[1], "none") not in cases:
        return []
    top, bottom = cases[(pair[0], "none")], cases[(pair[1], "none")]
    others = [f"at n = {r['n']} on the same link: {r[key]:.2f}" for r in report["ratios"]
              if r["link_gbps"] == at["link_gbps"] and r["n"] != at["n"] and r.get(key) is not None]
    return [f"processor time, all {top['ranks']} ranks, {pair[0]} over {pair[1]}: "
            f"{top['cpu_s_per_iteration'] / bottom['cpu_s_per_iteration']:.2f}", *others]


def bounds(loaded: Sequence[Loaded], expectations: str) -> List[str]:
    """Return the section listing every bound the committed runs do not meet, and those they cannot judge."""
    lines = ["## Bounds not met", "",
             "Each report's bounds, judged against its committed JSON by the code its page uses: the blocks of "
             "[docs/benchmarks/expectations.yaml](benchmarks/expectations.yaml) and the plan report's own error "
             "bounds.", ""]
    met, unmeasured = [], []
    for item in loaded:
        judged = verdicts(item, expectations)
        failed = [v for v in judged if v.status == expect.NOT_MET]
        missing = [f"`{v.expectation.name}`" for v in judged if v.status == expect.NOT_MEASURED]
        unmeasured += [f"{item.link()} {', '.join(missing)}"] if missing else []
        if not failed:
            count = sum(v.status == expect.MET for v in judged)
            met += [f"{item.link()} ({count} of {len(judged)})"] if judged else []
            continue
        lines.append(f"* {item.link()}, {len(failed)} of {len(judged)} bounds not met:")
        for verdict in failed:
            why = reasons(item, verdict, loaded)
            lines.append(f"    {verdict.line()}" + (f"; {'; '.join(why)}." if why else ""))
        if item.report["benchmark"] == "plan":
            lines.append(f"    - {plan_misses(item.report)}")
    if met:
        lines.append(f"* Every bound measured is met: {', '.join(met)}.")
    if unmeasured:
        lines.append(f"* Not measured (the run has nothing at the bound's field): {'; '.join(unmeasured)}.")
    return lines + [""]


# ---------------------------------------------------------------- the page


def intro(loaded: Sequence[Loaded]) -> List[str]:
    """Return the page's opening: where its figures come from, the machine, the dates."""
    machines: Dict[tuple, List[str]] = {}
    for item in loaded:
        machines.setdefault(figs.cpu_and_cores(item.report["machine"]), []).append(item.entry.title)
    where = "; ".join(f"{cpu} with {cores} cores" + (f" ({', '.join(names)})" if len(machines) > 1 else "")
                      for (cpu, cores), names in machines.items())
    counts = [c for item in loaded for c in figs.ranks(item.report)]
    cores = min(cores for _, cores in machines)
    dates = sorted(item.report["date"][:10] for item in loaded)
    return ["`python -m psframework.bench.overview` writes this page: every figure on it is read from the JSON of a "
            "committed report, every bound from the file or code that judges it. The reports are listed [at the "
            "end](#reports).", "",
            f"* Machine: the {len(loaded)} reports ran on {where} (each JSON's `machine` field), from {dates[0]} to "
            f"{dates[-1]}.",
            f"* Their MPI and DDP jobs run {figs.counts_of(counts)} processes on those {cores} cores: with more "
            "processes than cores a wall time is the sum of all ranks' work, and the processor-time figures "
            "compare the schemes' cost.", ""]


RERUN = [
    "## Rerunning a benchmark", "",
    "* `psf bench NAME` measures and writes `docs/benchmarks/NAME.json` (figures, inputs, command, machine, "
    "date) and `NAME.md`, rendered from the JSON alone.",
    "* `psf bench NAME --render docs/benchmarks/NAME.json` rebuilds the Markdown without measuring; `python -m "
    "psframework.bench.overview` then rewrites this page.",
    "* Bounds are not in the code: `docs/benchmarks/expectations.yaml` holds one block per benchmark (a field of "
    "the JSON and its `min`/`max`), judged into the report's Expectations section (`--expectations FILE` for "
    "other bounds, `--expectations none` for none).",
    "* `psf bench schemes`, `stragglers` and `scaleout` read their cases and ratios from "
    "`configs/bench/<name>.yaml`, `psf bench peers` its contenders from `configs/bench/peers.yaml` (`--cases FILE` "
    "for another list, `--config NAME=PATH` to swap one config, `KEY=VALUE` overrides for every case, `--repeat "
    "R` to train every case R times and report its median run).", "",
]


def report_lines(item: Loaded) -> List[str]:
    """Return one report's part of the page: what it measures, its run, its headline figures."""
    r = item.report
    return [f"### {item.entry.title.capitalize()}", "",
            f"* {item.link(item.entry.path[:-len('.json')] + '.md')}: {item.entry.measures}.",
            f"* Run: `{r['command']}` on {figs.machine_text(r['machine'])}, {r['date'][:10]}.",
            *item.entry.figures(r), ""]


def render_page(loaded: Sequence[Loaded], expectations: str = DEFAULT_EXPECTATIONS) -> str:
    """Return docs/benchmarks.md from the loaded reports."""
    lines = ["# Benchmarks", "", *intro(loaded), *RERUN, *bounds(loaded, expectations),
             "## What each benchmark measures", ""]
    for item in loaded:
        lines += report_lines(item) if item.entry.section == MEASURES else []
    lines += ["## Real links", ""]
    for item in loaded:
        lines += report_lines(item)[2:] if item.entry.section == REAL_LINKS else []
    lines += ["## The cost model of `psf plan`", ""]
    for item in loaded:
        lines += report_lines(item)[2:] if item.entry.section == COST_MODEL else []
    lines += COST_MODEL_TEXT + AUGMENTATION + reports_table(loaded)
    return "\n".join(lines).rstrip("\n") + "\n"


COST_MODEL_TEXT = [
    "The answers above are the model's, for a cluster with a core per rank: read them as predictions, not "
    "measurements. [Choosing a scheme](choosing.md) turns them into recommendations.", "",
]

AUGMENTATION = [
    "## What augmentation and the timeline cost", "",
    "* No committed report holds these costs; measure them as pairs of runs of `configs/bench_stanza.yaml`, "
    "each setting in turn with the other, and compare `mean_iteration_s` and `cpu_s_per_iteration` of each "
    "run's `summary.json`:", "",
    "```bash",
    "mpiexec -n 5 python -m mpi4py -m psframework train configs/bench_stanza.yaml data.augment=none name=none1",
    "mpiexec -n 5 python -m mpi4py -m psframework train configs/bench_stanza.yaml data.augment=crop-flip name=crop1",
    "mpiexec -n 5 python -m mpi4py -m psframework train configs/bench_stanza.yaml output.trace=true name=trace1",
    "```", "",
    "* Then `name=none2`, `name=crop2`, ... for the next pair; the median ratio over the pairs is the cost, "
    "and the spread of the ratios shows the machine's noise.", "",
]


def reports_table(loaded: Sequence[Loaded]) -> List[str]:
    """Return the list of reports: each page, its JSON, its date and what it measures."""
    lines = ["## Reports", "", "Each report is rendered from the JSON file next to it, which holds its figures:", "",
             "| report | figures | date | what it measures |", "|---|---|---|---|"]
    for item in loaded:
        name = os.path.basename(item.entry.path)
        lines.append(f"| {item.link()} | [{name}]({LINK_BASE}/{item.entry.path}) | {item.report['date'][:10]} | "
                     f"{item.entry.measures} |")
    lines += ["| [any model](benchmarks/any-model.md) | - | - | iteration time of automatic model placement "
              "against the fixed chain it replaced |", "",
              "The pass/fail bounds of every report are in [docs/benchmarks/expectations.yaml]"
              "(benchmarks/expectations.yaml). `hpc/gpu-check.sh` writes `docs/benchmarks/gpu.md` on a machine "
              "with a GPU (see [GPUs](gpus.md))."]
    return lines


def render(reports: str = DEFAULT_OUT, expectations: str = DEFAULT_EXPECTATIONS) -> str:
    """Return docs/benchmarks.md from the reports under `reports` and the bounds in `expectations`."""
    return render_page(load(reports), expectations)


def readme_figures(reports: str = DEFAULT_OUT) -> List[str]:
    """Return the README's block of figures, from the committed report it names."""
    path = os.path.join(reports, README_SOURCE)
    with open(path, encoding="utf-8") as fh:
        report = json.load(fh)
    return figs.readme_slow_link(report, os.path.join("docs", "benchmarks", README_SOURCE))


def with_figures(readme: str, block: Sequence[str], path: str = README) -> str:
    """Return the README with the text between its markers replaced by `block`."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise OverviewError(f"{path}: expected one {BEGIN!r} line and one {END!r} line after it")
    head, rest = readme.split(BEGIN, 1)
    return head + "\n".join([BEGIN, *block, END]) + rest.split(END, 1)[1]


def outputs(args: argparse.Namespace) -> Dict[str, str]:
    """Return each file the renderer writes and its new text."""
    with open(args.readme, encoding="utf-8") as fh:
        readme = with_figures(fh.read(), readme_figures(args.reports), args.readme)
    return {args.out: render(args.reports, args.expectations), args.readme: readme}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write docs/benchmarks.md (or check that it is current); return the exit status."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--reports", default=DEFAULT_OUT, help=f"the reports' directory (default {DEFAULT_OUT})")
    parser.add_argument("--expectations", default=DEFAULT_EXPECTATIONS,
                        help=f"the bounds file (default {DEFAULT_EXPECTATIONS})")
    parser.add_argument("--out", default=DEFAULT_PAGE, help=f"the page to write (default {DEFAULT_PAGE})")
    parser.add_argument("--readme", default=README, help=f"the README whose figures block to write (default {README})")
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 if a page differs")
    args = parser.parse_args(argv)
    try:
        pages = outputs(args)
    except (OSError, OverviewError, expect.ExpectationError, KeyError, TypeError, IndexError) as exc:
        print(f"{PROG}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    stale = [path for path, text in pages.items()
             if not os.path.isfile(path) or open(path, encoding="utf-8").read() != text]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run `{PROG}` to write it again", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        atomic_write_text(path, pages[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
