"""What every benchmark shares: report options, NAME.json and NAME.md, re-rendering and expectations.

A benchmark measures into a JSON-ready dict (its figures, the command, machine, date and inputs),
which is written as NAME.json; NAME.md is rendered from that dict alone by the benchmark's
`render(report, expectations)`, so `--render NAME.json` rebuilds it later without measuring.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from psframework.bench import expectations as expect
from psframework.fileio import atomic_write_json, atomic_write_text

DEFAULT_OUT = os.path.join("docs", "benchmarks")
DEFAULT_EXPECTATIONS = os.path.join(DEFAULT_OUT, "expectations.yaml")
Report = Dict[str, Any]
Renderer = Callable[[Report, Optional[Dict[str, Any]]], str]
# A measurement returns the report to write, or an exit status when there is nothing to write.
Measure = Callable[[argparse.Namespace, List[str]], Union[Report, int]]


def add_report_options(parser: argparse.ArgumentParser, name: str) -> None:
    """Add --out, --render and --expectations to a benchmark's parser."""
    parser.add_argument("--out", default=None, help=f"directory for {name}.json and {name}.md (default "
                        f"{DEFAULT_OUT}; with --render, the directory of the JSON file)")
    parser.add_argument("--render", default=None, metavar="JSON", help=f"measure nothing: render {name}.md from "
                        f"an existing {name}.json")
    parser.add_argument("--expectations", default=None, metavar="FILE", help=f"YAML file whose '{name}' block "
                        f"the report is judged against; 'none' for no Expectations section (default "
                        f"{DEFAULT_EXPECTATIONS} when it exists)")


def fail(prog: str, message: str) -> int:
    """Print one error line and return the usage exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return 2


def load_expectations(name: str, option: Optional[str]) -> Optional[Dict[str, Any]]:
    """Return the benchmark's expectations block as --expectations says (None: no section)."""
    if option is not None and option.lower() == "none":
        return None
    if option is None and not os.path.isfile(DEFAULT_EXPECTATIONS):
        return None
    return expect.load(option or DEFAULT_EXPECTATIONS, name)


def command_line(prog: str, argv: Sequence[str]) -> str:
    """Return the shell command that reruns a benchmark with the same options."""
    return " ".join([prog] + [shlex.quote(arg) for arg in argv])


def today() -> str:
    """Return the date and time now, in UTC."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def render_file(prog: str, name: str, path: str, out: Optional[str], render: Renderer,
                block: Optional[Dict[str, Any]]) -> int:
    """Render NAME.md from the report at `path` into `out` (default: beside it); return the exit status."""
    try:
        with open(path) as fh:
            report = json.load(fh)
    except (OSError, ValueError) as exc:
        return fail(prog, f"--render: cannot read {path!r}: {exc}")
    if not isinstance(report, dict) or report.get("benchmark", name) != name:
        found = report.get("benchmark") if isinstance(report, dict) else type(report).__name__
        return fail(prog, f"--render: {path!r} is a {found!r} report, expected {name!r}")
    try:
        markdown = render(report, block)
    except (KeyError, TypeError, IndexError, expect.ExpectationError) as exc:
        return fail(prog, f"--render: cannot render {path!r}: {type(exc).__name__} {exc}")
    target = os.path.join(out or os.path.dirname(os.path.abspath(path)), name + ".md")
    atomic_write_text(target, markdown)
    print(f"wrote {target}")
    return 0


def write(out: str, name: str, report: Report, render: Renderer, block: Optional[Dict[str, Any]]) -> None:
    """Write NAME.json and the NAME.md rendered from it into `out`, then print the verdicts."""
    markdown = render(report, block)  # before writing, so that a rendering error leaves no half report
    atomic_write_json(os.path.join(out, name + ".json"), report)
    atomic_write_text(os.path.join(out, name + ".md"), markdown)
    for verdict in expect.evaluate(report, block):
        print(f"{verdict.status}: {verdict.line()[2:]}")
    print(f"wrote {os.path.join(out, name + '.md')} and {name}.json", flush=True)


def main(name: str, parser: argparse.ArgumentParser, argv: Optional[Sequence[str]], measure: Measure,
         render: Renderer) -> int:
    """Parse the options, then render --render's report or measure and write a new one; return the status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        block = load_expectations(name, args.expectations)
    except expect.ExpectationError as exc:
        return fail(parser.prog, str(exc))
    if args.render is not None:
        return render_file(parser.prog, name, args.render, args.out, render, block)
    report = measure(args, argv)
    if isinstance(report, int):
        return report
    write(args.out or DEFAULT_OUT, name, report, render, block)
    return 0
