"""Benchmarks made of training jobs under mpiexec (schemes, stragglers): options, runs, report and its prose.

Which jobs run, under which labels, and which ratios are reported come from a case file (see cases.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from psframework.bench import cases as casefile
from psframework.bench import report as rep
from psframework.bench.machine import cpu_model
from psframework.launch import run_mpi

MIB = 2.0 ** 20


def mib(count: Optional[float]) -> str:
    """Return a byte count in MiB with two decimals ("" for none)."""
    return "" if count is None else f"{count / MIB:.2f}"


@dataclass(frozen=True)
class Case:
    """One training job: its role in the ratios and text, its label in the table, its config and overrides."""

    role: str
    label: str
    config: str
    overrides: Tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainingBenchmark:
    """A benchmark that trains the cases of a case file one after another and reports their summaries."""

    name: str
    description: str
    render: rep.Renderer
    annotate: Optional[Callable[[str, List[str], Dict[str, Any]], None]] = None  # adds figures to a summary
    figures: Optional[Callable[[Mapping[str, Dict[str, Any]]], Dict[str, Any]]] = None  # {label: summary} -> entries

    @property
    def prog(self) -> str:
        """Return the command that runs the benchmark."""
        return f"psf bench {self.name}"

    @property
    def cases_file(self) -> str:
        """Return the default case file."""
        return os.path.join("configs", "bench", f"{self.name}.yaml")

    def parser(self) -> argparse.ArgumentParser:
        """Return the benchmark's argument parser."""
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description)
        rep.add_report_options(parser, self.name)
        parser.add_argument("--cases", default=self.cases_file, metavar="FILE",
                            help=f"case file: the jobs to train and the ratios to report (default {self.cases_file})")
        parser.add_argument("--config", action="append", default=[], metavar="NAME=PATH",
                            help="train the case file's config NAME from PATH instead (repeatable)")
        parser.add_argument("--iterations", type=int, default=None, help="override train.max_iterations")
        parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per case")
        parser.add_argument("--repeat", type=int, default=1, metavar="R",
                            help="train every case R times (passes over all cases); report each case's median run")
        parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every case")
        return parser

    def measure(self, args: argparse.Namespace, argv: List[str]) -> Union[Dict[str, Any], int]:
        """Train every case and return the report, or exit status 2 on bad options, case file or configs."""
        from psframework.errors import ConfigError

        if args.iterations is not None and args.iterations < 2:
            return rep.fail(self.prog, f"--iterations got {args.iterations}, expected at least 2")
        if args.repeat < 1:
            return rep.fail(self.prog, f"--repeat got {args.repeat}, expected at least 1")
        iterations = [f"train.max_iterations={args.iterations}", f"train.eval_every={args.iterations}"]
        extra = list(args.overrides) + (iterations if args.iterations else [])
        try:
            spec = casefile.load(args.cases, args.config)
            cases = plan(spec, extra)
            inputs = {c.label: case_inputs(c, extra) for c in cases}
        except (ConfigError, casefile.CaseFileError) as exc:
            return rep.fail(self.prog, str(exc))
        if len(inputs) < len(cases):
            return rep.fail(self.prog, f"two cases share a label: {[c.label for c in cases]}; give them labels "
                            f"that differ in {args.cases}")
        summaries = run_cases(self.prog, cases, inputs, extra, args.timeout, self.annotate, args.repeat)
        report = {"benchmark": self.name, "command": rep.command_line(self.prog, argv), "machine": machine(),
                  "date": rep.today()}
        report.update(self.results(spec, cases, inputs, summaries, args.iterations, args.overrides))
        return report

    def results(self, spec: casefile.CaseFile, cases: Sequence[Case], inputs: Dict[str, Dict[str, Any]],
                summaries: Dict[str, Dict[str, Any]], iterations: Optional[int] = None,
                overrides: Sequence[str] = ()) -> Dict[str, Any]:
        """Return the report's inputs, ratios, further figures and cases from the cases' summaries {label: summary}."""
        emulated = any(case["setting"]["link"] for case in inputs.values())
        body: Dict[str, Any] = {"inputs": {
            "cases_file": spec.path, "configs": dict(spec.configs), "iterations": iterations,
            "overrides": list(overrides), "cases": inputs, "ratios": [dict(r) for r in spec.ratios],
            "text": dict(spec.text)}}
        body["ratios"] = casefile.ratio_values(spec.ratios, {c.role: summaries[c.label] for c in cases}, emulated)
        if self.figures is not None:
            body.update(self.figures(summaries))
        body["cases"] = summaries
        return body

    def main(self, argv: Optional[Sequence[str]] = None) -> int:
        """Run the benchmark (or re-render a report) as the command line says; return the exit status."""
        return rep.main(self.name, self.parser(), argv, self.measure, self.render)


def plan(spec: casefile.CaseFile, extra: Sequence[str]) -> List[Case]:
    """Return the jobs of a case file under the `extra` overrides, with their fields filled.

    The cases marked if_emulated are kept only when one of the other cases emulates its links.
    """
    base: Dict[str, Dict[str, Any]] = {}  # config name: its setting under `extra`
    planned, emulated = [], False
    for spec_case in spec.cases:
        config = spec.configs[spec_case.config]
        if spec_case.config not in base:
            base[spec_case.config] = setting(config, extra)
        overrides = tuple(_filled(spec, spec_case, text, base[spec_case.config]) for text in spec_case.overrides)
        resolved = setting(config, list(overrides) + list(extra))
        case = Case(spec_case.role, _filled(spec, spec_case, spec_case.label, resolved), config, overrides)
        planned.append((spec_case.if_emulated, case))
        emulated = emulated or (not spec_case.if_emulated and resolved["link"] is not None)
    return [case for if_emulated, case in planned if emulated or not if_emulated]


def _filled(spec: casefile.CaseFile, case: casefile.CaseSpec, text: str, resolved: Mapping[str, Any]) -> str:
    """Return a case's override or label with the fields of a setting filled (the link in words)."""
    try:
        return casefile.fill(text, dict(resolved, link=link_text(resolved["link"])))
    except (KeyError, TypeError, ValueError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) else exc
        raise casefile.CaseFileError(f"{spec.path}: case {case.role}: {text!r}: {reason}") from None


def setting(config: str, overrides: Sequence[str]) -> Dict[str, Any]:
    """Return what a case trains: scheme, model, data, workers, links and stragglers of its resolved config."""
    from psframework.schemes.validate import load_run

    return setting_of(load_run(config, overrides))


def setting_of(cfg: Any) -> Dict[str, Any]:
    """Return the scheme, model, data, workers, links and stragglers of a loaded config."""
    from psframework.data import dataset_shape, image_shape
    from psframework.imports import is_import_path
    from psframework.models import input_size_of, model_defaults

    defaults = {} if is_import_path(cfg.model.name) else model_defaults(cfg.model.name)
    channels, classes = dataset_shape(cfg.data)
    size = input_size_of(cfg.model)
    shape = [channels, size, size] if size is not None else list(image_shape(cfg.data))
    link = cfg.comm.emulate
    return {"scheme": cfg.scheme, "model": cfg.model.name, "model_args": cfg.model.args,
            "conv_channels": cfg.model.channels or defaults.get("channels"),
            "fc": cfg.model.fc if cfg.model.fc is not None else defaults.get("fc"), "classes": classes,
            "dataset": cfg.data.dataset, "input": shape, "batch_size": cfg.data.batch_size,
            "n": cfg.code.n, "k": cfg.code.k,
            "link": None if link.bandwidth_gbps is None else {"bandwidth_gbps": link.bandwidth_gbps,
                                                              "latency_us": link.latency_us},
            "stragglers": {"model": cfg.stragglers.model, "ranks": list(cfg.stragglers.ranks),
                           "factor": cfg.stragglers.factor, "responsive": cfg.stragglers.responsive,
                           "pause_s": cfg.stragglers.pause_s, "duty": cfg.stragglers.duty}}


def case_inputs(case: Case, extra: Sequence[str]) -> Dict[str, Any]:
    """Return what a case ran with: role, config, MPI ranks, its own overrides and the resolved setting."""
    from psframework.schemes.registry import world_size_of
    from psframework.schemes.validate import load_run

    cfg = load_run(case.config, list(case.overrides) + list(extra))
    return {"role": case.role, "config": case.config, "ranks": world_size_of(cfg),
            "overrides": list(case.overrides), "setting": setting_of(cfg)}


def run_case(prog: str, label: str, config: str, ranks: int, overrides: Sequence[str], out_dir: str,
             timeout_s: float) -> Dict:
    """Train one case under mpiexec; return its summary with the label and the workers' compute share."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")
    # A benchmark's runs are its own scratch space: a rerun replaces the previous one's.
    args = ["-m", "psframework", "train", config, f"name={name}", f"output.dir={out_dir}",
            "output.progress=off", "output.overwrite=true"] + list(overrides)
    print(f"{prog}: {label}: mpiexec -n {ranks} python -m mpi4py {' '.join(args)}", flush=True)
    proc = run_mpi(ranks, args, timeout_s=timeout_s)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-5:]
        raise RuntimeError(f"case {label!r} failed with exit status {proc.returncode}: {' | '.join(tail)}")
    with open(os.path.join(out_dir, name, "summary.json")) as fh:
        summary = json.load(fh)
    summary["label"] = label
    workers = summary.get("workers") or {}
    iterations = max(1, summary["iterations"] - summary.get("start_iteration", 0))
    compute = [w["compute_s"] / iterations for w in workers.values()]
    summary["worker_compute_share"] = (sum(compute) / len(compute) / summary["mean_iteration_s"]) if compute else None
    return summary


def machine() -> str:
    """Describe the machine a benchmark ran on."""
    import torch

    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
            f"{platform.system()} {platform.release()}")


def run_cases(prog: str, cases: Sequence[Case], inputs: Mapping[str, Dict[str, Any]], extra: Sequence[str],
              timeout_s: float, annotate: Optional[Callable[[str, List[str], Dict], None]] = None,
              repeat: int = 1) -> Dict[str, Dict]:
    """Train every case with the `extra` overrides, all of them `repeat` times in turn; return {label: summary}.

    With repeats a case's summary is that of its run with the median mean iteration time, and
    `repeat_iteration_s` lists every run's (passes over all cases, so that a slow spell of the
    machine falls on every case alike).
    """
    runs: Dict[str, List[Dict]] = {case.label: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="psf-bench-") as tmp:
        for _ in range(repeat):
            for case in cases:
                overrides = list(case.overrides) + list(extra)
                summary = run_case(prog, case.label, case.config, inputs[case.label]["ranks"], overrides, tmp,
                                   timeout_s)
                if annotate is not None:
                    annotate(case.config, overrides, summary)
                runs[case.label].append(summary)
                print(f"  mean iteration {summary['mean_iteration_s'] * 1e3:.1f} ms, rank 0 sent "
                      f"{mib(summary['server_bytes_sent_per_iteration'])} MiB/it", flush=True)
    return {label: median_run(done) if repeat > 1 else done[0] for label, done in runs.items()}


def median_run(summaries: Sequence[Dict]) -> Dict:
    """Return the summary with the median mean iteration time, listing every run's time."""
    ordered = sorted(summaries, key=lambda s: s["mean_iteration_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeat_iteration_s"] = [s["mean_iteration_s"] for s in summaries]
    return chosen


def link_text(link: Optional[Mapping[str, Any]], latency: bool = False) -> str:
    """Return an emulated link's bandwidth (and latency) in words, or 'no emulation'."""
    if not link:
        return "no emulation"
    wait = f" and {link['latency_us']:g} us" if latency and link.get("latency_us") else ""
    return f"{link['bandwidth_gbps']:g} Gb/s{wait}"


def setting_text(s: Mapping[str, Any]) -> str:
    """Return a case's model and data in words."""
    conv = "-".join(str(c) for c in s["conv_channels"])
    fc = "-".join(str(c) for c in list(s["fc"]) + [s["classes"]])
    shape = "x".join(str(d) for d in s["input"])
    return f"{s['model']} (conv {conv}, FC {fc}) on {s['dataset']} {shape} images, global batch {s['batch_size']}"


def header(report: Mapping[str, Any], title: str) -> List[str]:
    """Return a training benchmark report's title, command, machine and configs as Markdown lines."""
    inputs = report.get("inputs") or {}
    extra = " ".join(inputs.get("overrides") or [])
    lines = [f"# {title}", "",
             f"Command: `{report['command']}` (runs each case below under `mpiexec`, one after another).",
             f"Machine: {report['machine']}. Date: {report['date']}.", ""]
    configs: Dict[str, List[str]] = {}  # setting in words: the configs that train it
    cases = list((inputs.get("cases") or {}).values())
    plain = {c["config"] for c in cases if not c["overrides"]}  # configs some case trains as they are
    for case in cases:
        named = configs.setdefault(setting_text(case["setting"]), [])
        if case["config"] not in named and (not case["overrides"] or case["config"] not in plain):
            named.append(case["config"])
    for text, named in configs.items():
        if named:
            lines.append(f"- {', '.join(f'`{c}`' for c in named)}: {text}")
    if extra:
        lines.append(f"- overrides for every case: `{extra}`")
    return lines + ([""] if configs else [])


def case_rows(report: Mapping[str, Any], row: Callable[[str, Mapping[str, Any], Mapping[str, Any]], str]) -> List[str]:
    """Return one table row per case: row(label, summary, inputs of the case)."""
    inputs = (report.get("inputs") or {}).get("cases") or {}
    return [row(label, s, inputs.get(label) or {}) for label, s in report["cases"].items()]
