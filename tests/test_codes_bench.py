"""Benchmark reports: the expectations evaluator, rendering from JSON, re-rendering, and a quick codec run."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shlex

import pytest
import yaml

from psframework.bench import cases, codec, comm, peers_render, precision, runs, scaleout, schemes, stragglers
from psframework.bench import expectations as expect
from psframework.bench import report as rep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "benchmarks")
REPORTS = {"codec.json": codec.render, "one-thread/codec.json": codec.render, "comm.json": comm.render,
           "peers.json": peers_render.render, "netcluster/peers.json": peers_render.render,
           "scaleout.json": scaleout.render, "schemes.json": schemes.render, "stragglers.json": stragglers.render}


def block(**entries) -> dict:
    """Return an expectations block: name=(field, min, max)."""
    return {name: {"field": field, "min": low, "max": high} for name, (field, low, high) in entries.items()}


# The expectations evaluator.

def test_bounds_decide_met_and_not_met():
    report = {"ratios": {"bytes": 12.4, "time": 1.2}}
    verdicts = expect.evaluate(report, block(
        bytes=("ratios.bytes", 10, None), slow=("ratios.time", 1.34, None), fast=("ratios.time", None, 1.3),
        band=("ratios.time", 1.0, 1.1)))
    assert [v.status for v in verdicts] == ["met", "NOT met", "met", "NOT met"]
    assert [v.value for v in verdicts] == [12.4, 1.2, 1.2, 1.2]
    assert verdicts[1].line() == "- slow (at least 1.34): 1.2, **NOT met**"
    assert verdicts[3].line() == "- band (between 1 and 1.1): 1.2, **NOT met**"
    assert expect.evaluate(report, {"x": {"field": "ratios.bytes", "max": 12.4}})[0].status == "met"  # bounds inclusive


def test_missing_and_null_fields_are_not_measured():
    report = {"ratios": {"time": None}, "rows": []}
    verdicts = expect.evaluate(report, block(absent=("ratios.nothing", 1, None), null=("ratios.time", 1, None),
                                             empty=("rows.*.x", None, 2), deep=("ratios.time.x", 1, None)))
    assert [v.status for v in verdicts] == ["not measured"] * 4
    assert verdicts[0].line() == "- absent (at least 1): not measured (nothing at `ratios.nothing`)"


def test_selectors_and_globs_reach_every_value_and_judge_the_worst():
    report = {"rows": [{"bytes": 1024, "r": 0.1, "code": "Poly chebyshev"}, {"bytes": 4 << 20, "r": 0.9},
                       {"bytes": 8 << 20, "r": 0.85, "code": "Poly chebyshev"}],
              "cases": {"first 4 dropped": {"x": 3.0}, "worst of 4 dropped": {"x": 5.0}, "all": {"x": 9.0}}}
    (v,) = expect.evaluate(report, block(large=("rows[bytes>=4194304].r", 0.8, None)))
    assert (v.status, v.value, v.count, v.where) == ("met", 0.85, 2, "rows[bytes=8388608].r")
    assert "(worst of 2: `rows[bytes=8388608].r`)" in v.line()
    (v,) = expect.evaluate(report, block(large=("rows[bytes>=4194304].r", 0.86, None)))
    assert (v.status, v.value) == ("NOT met", 0.85)
    (v,) = expect.evaluate(report, block(named=("rows[code=Poly chebyshev,bytes<4194304].r", None, 0.05)))
    assert (v.status, v.value, v.count) == ("NOT met", 0.1, 1)
    (v,) = expect.evaluate(report, block(glob=("cases.* 4 dropped.x", None, 4)))
    assert (v.status, v.value, v.count, v.where) == ("NOT met", 5.0, 2, "cases.worst of 4 dropped.x")
    (v,) = expect.evaluate(report, block(band=("cases.*.x", 4, 10)))  # least margin: 3 is below, 9 is inside
    assert (v.status, v.value, v.count) == ("NOT met", 3.0, 3)
    assert expect.resolve(report, "rows.1.r") == [("rows.1.r", 0.9)]
    assert expect.resolve({"a": [{"v": 0.5}]}, "a[v>=0.25].v") == [("a[v=0.5].v", 0.5)]  # dots inside brackets


@pytest.mark.parametrize("entry, message", [
    ({"field": "a"}, "give min, max or both"),
    ({"field": "a", "min": 1, "bound": 2}, "unknown key 'bound'"),
    ({"field": "a", "min": "ten"}, "min must be a number"),
    ({"min": 1}, "field must be a dotted path"),
    ("a >= 1", "expected a mapping"),
])
def test_bad_expectations_are_rejected(entry, message):
    with pytest.raises(expect.ExpectationError, match=message):
        expect.parse_block({"x": entry})


def test_a_field_that_is_not_a_number_or_a_bad_selector_is_an_error():
    with pytest.raises(expect.ExpectationError, match="'fast', not a number"):
        expect.evaluate({"a": "fast"}, block(x=("a", 1, None)))
    with pytest.raises(expect.ExpectationError, match="expected FIELD OP VALUE"):
        expect.evaluate({"a": [{"b": 1}]}, block(x=("a[b].b", 1, None)))
    assert expect.section({"a": 1}, None) == []  # no block, no section


def test_load_reads_one_benchmark_block(tmp_path):
    path = tmp_path / "expect.yaml"
    path.write_text("codec:\n  err: {field: a.b, max: 1.0e-5}\ncomm: {}\n")
    assert expect.load(str(path), "codec") == {"err": {"field": "a.b", "max": 1e-5}}
    assert expect.load(str(path), "schemes") is None
    path.write_text("codec:\n  err: {field: a.b}\n")
    with pytest.raises(expect.ExpectationError, match="expect.yaml: codec: err: give min, max or both"):
        expect.load(str(path), "codec")
    with pytest.raises(expect.ExpectationError, match="cannot read expectations"):
        expect.load(str(tmp_path / "absent.yaml"), "codec")


def test_the_project_expectations_file_parses_and_covers_every_benchmark():
    with open(os.path.join(DOCS, "expectations.yaml")) as fh:
        data = yaml.safe_load(fh)
    assert set(data) == {"codec", "comm", "peers", "scaleout", "schemes", "stragglers"}
    for name in data:
        assert expect.parse_block(expect.load(os.path.join(DOCS, "expectations.yaml"), name))


# Rendering each report type from a small hand-made report.

def codec_report() -> dict:
    case = {"packets": [0, 1, 2], "operations": 3, "symbol_operations": 48, "levels": 1, "compile_s": 2.5e-5,
            "decode_s": 0.00123, "numpy_sum_s": 0.0005, "decode_min_s": 0.0011, "numpy_sum_min_s": 0.0004,
            "decode_reused_out_s": 0.001, "ratio_to_numpy_sum": 2.46, "reused_out_ratio_to_numpy_sum": 2.0,
            "poly_over_sazd_decode": 0.5}
    return {"benchmark": "codec", "command": "psf bench codec --pairs 5,3", "date": "2030-01-02T03:04:05+00:00",
            "machine": {"cpu": "Test CPU", "cores": 3, "platform": "TestOS", "numpy": "9", "torch": "9",
                        "python": "3.99", "openblas_coretype": None, "decode_threads": 3, "blas_threads": 3,
                        "blas": {"library": "openblas", "version": "1", "default_threads": 3}},
            "inputs": {"pairs": [[5, 3]], "repeats": 7, "mib": 0.5, "limit": 10, "seed": 0, "quick": False,
                       "symbol_width": 64, "min_stripe_symbol_bytes": 49152},
            "accuracy": [{"code": "SAZD", "n": 5, "k": 3, "L": 8, "worst_rel_error": 1.2e-7, "worst_packets": [2, 3, 4],
                          "arrival_sets": 10, "exhaustive": True, "seconds": 0.1},
                         {"code": "Poly integers", "n": 5, "k": 3, "L": 8, "worst_rel_error": 3.1e-3,
                          "worst_packets": [2, 3, 4], "arrival_sets": 10, "exhaustive": True, "seconds": 0.1,
                          "error_over_sazd": 3.1e-3 / 1.2e-7}],
            "speed": [{"n": 5, "k": 3, "L": 16, "block_set_MiB": 0.5, "decode_stripes": 1, "packet_symbols": 19,
                       "sazd_encode_s": 0.002, "poly_encode_s": 0.003, "poly_decode_s": 0.000615,
                       "poly_decode_min_s": 0.0006, "poly_decode_packets": [2, 3, 4], "numpy_sum_blocks_s": 0.0004,
                       "sazd_decode": {"all systematic": case}}],
            "threads": [{"n": 5, "k": 3, "block_set_MiB": 2.0, "packets": [2, 3, 4], "symbol_KiB": 4.0, "stripes": 1,
                         "one_thread_s": 0.004, "threads_s": 0.002, "speedup": 2.0}]}


def mixed_precision_row(code: str, own: float, worst: float, **extra) -> dict:
    row = {"code": code, "precision": "bf16", "n": 5, "k": 3, "L": 11, "subsets": 10, "own_rel_error": own,
           "worst_vs_same": worst, "median_vs_same": worst / 2, "worst_packets_vs_same": [2, 3, 4],
           "worst_vs_same_over_own": worst / own if own else None, "worst_vs_fp32": worst, "median_vs_fp32": worst / 2,
           "worst_packets_vs_fp32": [2, 3, 4], "worst_vs_fp32_over_own": worst / own if own else None, "seconds": 0.1}
    return dict(row, **extra)


def mixed_precision_report() -> dict:
    return {"layer": {"in_channels": 16, "out_channels": 32, "kernel": 3, "padding": 1, "input_shape": [8, 16, 8, 8],
                      "symbol_size": 1, "seed": 0},
            "conv_modes": {"bf16": "native", "fp16": "emulated"}, "torch_threads": 1,
            "rows": [mixed_precision_row("SAZD", 0.004, 0.01), mixed_precision_row("Poly chebyshev", 0.004, 0.6),
                     mixed_precision_row("SAZD", 0.0, 1e-7, precision="fp16")]}


def test_codec_report_renders_its_mixed_precision_table_and_bound():
    report = dict(codec_report(), mixed_precision=mixed_precision_report())
    md = codec.render(report, None)
    assert "## Mixed precision: workers convolve in bf16 or fp16, the server decodes in fp32" in md
    assert "| SAZD | bf16 | (5,3) | 11 | 10 | 0.004 | 0.01 (0.005) | 2.50 | 0.01 (0.005) | 2.50 |" in md
    assert "| Poly chebyshev | bf16 | (5,3) | 11 | 10 | 0.004 | 0.6 (0.3) | 150 | 0.6 (0.3) | 150 |" in md
    assert "| SAZD | fp16 | (5,3) | 11 | 10 | 0 | 1e-07 (5e-08) | n/a | 1e-07 (5e-08) | n/a |" in md  # no rounding
    assert ("Observed bound: SAZD decoding adds at most 2.50x the precision's own rounding (worst over every "
            "subset, bf16 and fp16, (n,k) in (5,3)); Poly chebyshev up to 150x.") in md
    assert "bf16: torch's CPU convolution in bf16" in md and "fp16: emulated" in md and "(1 torch thread)" in md
    assert md.index("## Accuracy") < md.index("## Mixed precision") < md.index("## Speed")
    assert "Mixed precision" not in codec.render(codec_report(), None)  # older reports render without the table


def test_mixed_precision_sazd_stays_near_the_rounding_where_poly_does_not():
    table = precision.precision_table([(12, 8)], seed=0)
    rows = {(r["code"], r["precision"]): r for r in table["rows"]}
    assert set(rows) == {(c, p) for c, _ in precision.CODES for p in precision.PRECISIONS}
    for p in precision.PRECISIONS:
        sazd, poly = rows[("SAZD", p)], rows[("Poly chebyshev", p)]
        assert sazd["subsets"] == poly["subsets"] == math.comb(12, 8)
        assert sazd["worst_vs_same_over_own"] < 50 and sazd["worst_vs_fp32_over_own"] < 50
        assert poly["worst_vs_same"] > 100 * sazd["worst_vs_same"]  # measured: about 800x in bf16 and in fp16


def test_mixed_precision_emulates_a_precision_the_cpu_cannot_convolve_in():
    import torch

    threads = torch.get_num_threads()
    table = precision.precision_table([(4, 3)], seed=0, modes={"fp16": precision.EMULATED})
    assert torch.get_num_threads() == threads  # the table's own thread count is undone
    assert table["conv_modes"] == {"bf16": precision.conv_mode(torch.bfloat16), "fp16": precision.EMULATED}
    fp16 = [row for row in table["rows"] if row["precision"] == "fp16"]
    assert len(fp16) == len(precision.CODES)
    for row in fp16:  # rounded like fp16: relative error about its unit roundoff 2**-11
        assert 0 < row["own_rel_error"] < 2 ** -10 and row["worst_vs_same_over_own"] < 50


def test_codec_report_renders_its_figures_and_verdicts():
    report = codec_report()
    md = codec.render(report, None)
    assert "## Expectations" not in md and "met**" not in md
    assert "| (5,3) | 8 | 10 | 1.2e-07 | 0.0031 |" in md  # the codes are the report's, not a fixed list
    assert "| SAZD | Poly integers |" in md and "Poly chebyshev" not in md
    assert ("| (5,3) | all systematic (0, 1, 2) | 3 | 48 | 0.025 | 1.230 (1.100) | 0.500 (0.400) | 2.46 | "
            "1.000, 2.00 | 0.50 |") in md
    assert "| (5,3) | 2 | 4 | 1 | 4.000 | 2.000 | 2.00 |" in md and "| 3 threads |" in md
    assert "at least 48 KiB of every symbol" in md and "16 symbols per block" in md and "7 timed repeats" in md
    assert "psf bench codec --pairs 5,3" in md and "2030-01-02T03:04:05+00:00" in md
    md = codec.render(report, block(decode=("speed[n=5,k=3].sazd_decode.*.ratio_to_numpy_sum", None, 2),
                                    error=("accuracy[code=SAZD,n=5,k=3,L=8].worst_rel_error", None, 2e-5),
                                    big=("accuracy[n=20].worst_rel_error", None, 2e-5)))
    assert md.endswith("## Expectations\n\nBounds from the expectations file, judged against the figures above:\n\n"
                       "- decode (at most 2): 2.46, **NOT met**\n- error (at most 2e-05): 1.2e-07, **met**\n"
                       "- big (at most 2e-05): not measured (nothing at `accuracy[n=20].worst_rel_error`)\n")
    del report["inputs"]["min_stripe_symbol_bytes"], report["inputs"]["symbol_width"]
    md = codec.render(report, None)  # older reports without these inputs still render, without the clauses
    assert "KiB of every symbol" not in md and "values each" not in md


def comm_report() -> dict:
    row = {"pingpong_s": 1e-6, "pingpong_MBps": 1000.0, "sendrecv_pingpong_MBps": 1100.0,
           "transport_pingpong_s": 1e-5, "transport_pingpong_MBps": 100.0, "server_to_worker_MBps": 90.0,
           "worker_to_server_MBps": 80.0, "ratio_transport_pingpong": 0.1, "ratio_transport_vs_sendrecv": 0.09,
           "ratio_server_to_worker": 0.09, "ratio_worker_to_server": 0.08}
    large = dict(row, bytes=4 << 20, ratio_transport_pingpong=0.97, ratio_server_to_worker=0.5)
    fk = {"bytes": 1024, "workers": 3, "rounds": 5, "repeats": 2, "raw_s": 1e-5, "plain_s": 2e-5,
          "first-3-of-3_s": 3e-5, "first-2-of-3_s": 2.5e-5, "overhead_s": 1e-5, "overhead_pct": 50.0,
          "overhead_vs_raw_s": 2e-5, "overhead_vs_raw_pct": 200.0}
    return {"benchmark": "comm", "command": "mpiexec -n 4 python -m mpi4py -m psframework bench comm",
            "date": "2030-01-02", "inputs": {"sizes": [1024, 4 << 20], "repeats": 3, "timeout_s": 60.0,
                                             "quick": False, "header_bytes": 128},
            "machine": {"host": "h", "cpu": "Test CPU", "cores": 2, "platform": "TestOS", "mpi_library": "MPI 9",
                        "mpi4py": "9", "torch": "9", "python": "3.99", "world_size": 4, "load_average_1min": 1.5},
            "bandwidth": [dict(row, bytes=1024), large],
            "memory": {"bytes": 4 << 20, "numpy_backed_MBps": 2000.0, "torch_allocator_MBps": 1000.0,
                       "THP_MEM_ALLOC_ENABLE": "1"},
            "first_k": [fk]}


def test_comm_report_renders_its_figures_and_verdicts():
    report = comm_report()
    md = comm.render(report, None)
    assert "| 4 MiB | 1000.0 | 1100.0 | 100.0 | 0.97 | 0.09 | 90.0 | 0.50 | 80.0 | 0.08 |" in md
    assert "a 128-byte header" in md and "Medians over 3 interleaved" in md and "timeout 60 s" in md
    assert "ranks 1..3 workers" in md and "more processes than cores" in md  # 4 processes on 2 cores
    assert "| 1 KiB | 10.0 | 20.0 | 30.0 | 25.0 | +10.0 us (+50.0%) | +20.0 us (+200.0%) |" in md
    assert "first-2-of-3 stops at the first 2 replies" in md and "THP_MEM_ALLOC_ENABLE=1" in md
    assert "## Expectations" not in md
    md = comm.render(report, block(pingpong=("bandwidth[bytes>=4194304].ratio_transport_pingpong", 0.8, None),
                                   s2w=("bandwidth[bytes>=4194304].ratio_server_to_worker", 0.8, None),
                                   huge=("bandwidth[bytes>=1073741824].ratio_server_to_worker", 0.8, None)))
    assert "- pingpong (at least 0.8): 0.97, **met**" in md
    assert "- s2w (at least 0.8): 0.5, **NOT met**" in md
    assert "- huge (at least 0.8): not measured" in md


def training_summary(scheme: str, n: int, k, mean_s: float, sent: float, received: float, **extra) -> dict:
    workers = {str(r): {"replies_sent": 20.0, "replies_skipped": 0.0, "max_behind": 0.0, "compute_s": 0.1,
                        "delay_s": 0.0, "updates": 40.0} for r in range(1, n + 1)}
    return dict({"scheme": scheme, "n": n, "k": k, "iterations": 20, "mean_iteration_s": mean_s,
                 "mean_wait_s": mean_s / 2, "server_bytes_sent_per_iteration": sent,
                 "server_bytes_received_per_iteration": received, "final_test_accuracy": 0.5,
                 "worker_compute_share": 0.75, "workers": workers, "analytic_bytes": [sent, received]}, **extra)


def training_report(module, spec: cases.CaseFile, summaries: dict, extra: list) -> dict:
    """Return a report as the benchmark's measure() builds it, from hand-made summaries {role: summary} (no MPI)."""
    plan = runs.plan(spec, extra)
    inputs = {c.label: runs.case_inputs(c, extra) for c in plan}
    report = {"benchmark": module.BENCHMARK.name, "command": f"psf bench {module.BENCHMARK.name} x=1",
              "machine": "Test machine", "date": "2030-01-02"}
    report.update(module.BENCHMARK.results(spec, plan, inputs, {c.label: summaries[c.role] for c in plan},
                                           overrides=extra))
    return json.loads(json.dumps(report))  # as read back from NAME.json


@pytest.fixture
def in_root(monkeypatch):
    """Run in the project root, where the case files' config paths lead."""
    monkeypatch.chdir(ROOT)


def test_the_scheme_case_file_plans_its_cases_from_the_configs(in_root):
    spec = cases.load(schemes.BENCHMARK.cases_file)
    plan = runs.plan(spec, ["code.n=6"])
    assert [c.label for c in plan] == ["ps, 10 Gb/s", "stanza, 10 Gb/s", "sazd (k=5), 10 Gb/s",
                                       "uncoded (k=6), 10 Gb/s", "ps, no emulation", "stanza, no emulation"]
    assert [c.overrides for c in plan][2:4] == [("scheme=sazd", "code.k=5"), ("scheme=uncoded", "code.k=6")]
    assert [runs.case_inputs(c, ["code.n=6"])["ranks"] for c in plan] == [7] * 6
    local = runs.plan(spec, ["comm.emulate.bandwidth_gbps=null"])
    assert [c.role for c in local] == ["ps", "stanza", "sazd", "uncoded"]  # nothing to compare with emulation
    assert local[0].label == "ps, no emulation"
    swapped = cases.load(schemes.BENCHMARK.cases_file, ["ps=configs/bench_sazd.yaml"])
    assert swapped.configs["ps"] == "configs/bench_sazd.yaml"
    assert runs.plan(swapped, [])[0].label == "sazd, no emulation"


def test_the_straggler_case_file_plans_its_cases_from_the_configs(in_root):
    plan = runs.plan(cases.load(stragglers.BENCHMARK.cases_file), [])
    assert [c.label for c in plan] == ["sazd, none", "sazd, 5x slow", "sazd, frozen 80%", "uncoded, none",
                                       "uncoded, 5x slow", "uncoded, frozen 80%", "sazd-naive, none",
                                       "sazd digits, none", "sazd digits, 5x slow"]
    assert [runs.case_inputs(c, [])["ranks"] for c in plan] == [5, 5, 5, 4, 4, 4, 5, 5, 5]


def test_scheme_report_renders_figures_derived_from_its_inputs(in_root):
    spec = cases.load(schemes.BENCHMARK.cases_file)
    extra = ["code.n=6", "model.channels=[8,16,16,16]"]
    mib = 2 ** 20
    summaries = {"ps": training_summary("ps", 6, None, 0.2, 30 * mib, 30 * mib),
                 "stanza": training_summary("stanza", 6, None, 0.1, 2 * mib, 1 * mib),
                 "sazd": training_summary("sazd", 6, 5, 0.3, 10 * mib, 5 * mib),
                 "uncoded": training_summary("uncoded", 6, 6, 0.25, 9 * mib, 4 * mib, analytic_bytes=[mib, mib]),
                 "ps_local": training_summary("ps", 6, None, 0.15, 30 * mib, 30 * mib),
                 "stanza_local": training_summary("stanza", 6, None, 0.12, 2 * mib, 1 * mib)}
    report = training_report(schemes, spec, summaries, extra)
    assert report["ratios"] == {"ps_over_stanza_bytes": 20.0, "ps_over_stanza_bytes_sent": 15.0,
                                "ps_over_stanza_time_emulated": 2.0, "ps_over_stanza_time_local": 1.25}
    assert report["analytic_bytes_mismatches"] == 1
    assert report["inputs"]["cases_file"] == spec.path and report["inputs"]["text"] == spec.text
    md = schemes.render(report, None)
    assert "vgg-small (conv 8-16-16-16, FC 1024-1024-10) on synthetic 3x32x32 images, global batch 64" in md
    assert "- overrides for every case: `code.n=6 model.channels=[8,16,16,16]`" in md
    assert ("Coded cases: sazd (k=5), 10 Gb/s: `configs/bench_stanza.yaml` with `scheme=sazd code.k=5`; "
            "uncoded (k=6), 10 Gb/s: `configs/bench_stanza.yaml` with `scheme=uncoded code.k=6`.") in md
    assert "| sazd (k=5), 10 Gb/s | 6 | 5 | 10 Gb/s and 50 us | 300.0 | 10.00 | 10.00 | 5.00 | 5.00 |" in md
    assert "| uncoded (k=6), 10 Gb/s | 6 | 6 | 10 Gb/s and 50 us | 250.0 | 9.00 | 1.00 | 4.00 | 1.00 |" in md
    assert "## Ratios (ps over stanza)" in md and "**20.0x** (sent alone 15.0x)" in md
    assert "emulated links: **2.00x**" in md and "without emulation: 1.25x" in md
    assert "rank 0 no longer needs): 1." in md and "n = 4" not in md and "k = 3" not in md
    md = schemes.render(report, block(analytic=("analytic_bytes_mismatches", None, 0),
                                      time=("ratios.ps_over_stanza_time_emulated", 1.34, None)))
    assert "- analytic (at most 0): 1, **NOT met**" in md and "- time (at least 1.34): 2, **met**" in md
    # Without emulated links the no-emulation cases are not trained and the time ratio falls back to ps / stanza.
    local = training_report(schemes, spec, summaries, ["comm.emulate.bandwidth_gbps=null"])
    assert local["ratios"] == {"ps_over_stanza_bytes": 20.0, "ps_over_stanza_bytes_sent": 15.0,
                               "ps_over_stanza_time_local": 2.0}
    md = schemes.render(local, None)
    assert "emulated links" not in md and "without emulation: 2.00x" in md


def test_straggler_report_describes_the_straggler_it_recorded(in_root, tmp_path):
    with open(stragglers.BENCHMARK.cases_file) as fh:
        data = yaml.safe_load(fh)
    for case in data["cases"]:  # every straggler becomes rank 3, 3x slow
        others = [o for o in case.get("overrides", []) if not o.startswith("stragglers.")]
        if len(others) < len(case.get("overrides", [])):
            case["overrides"] = others + ["stragglers.model=fixed", "stragglers.ranks=[3]", "stragglers.factor=3"]
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(data))
    spec = cases.load(str(tmp_path / "cases.yaml"))
    slow = training_summary("sazd", 4, 3, 0.5, 40.0, 10.0)
    slow["workers"]["3"].update(replies_sent=2.0, replies_skipped=18.0, max_behind=17.0)
    slow["membership"] = [{"rank": 3, "detached_at": 4, "readmitted_at": 9}]
    summaries = {"sazd": training_summary("sazd", 4, 3, 0.4, 40.0, 10.0), "sazd_straggler": slow,
                 "sazd_frozen": training_summary("sazd", 4, 3, 0.2, 40.0, 10.0),
                 "uncoded": training_summary("uncoded", 3, 3, 0.3, 30.0, 10.0),
                 "uncoded_straggler": training_summary("uncoded", 3, 3, 0.9, 30.0, 10.0),
                 "uncoded_frozen": training_summary("uncoded", 3, 3, 1.2, 30.0, 10.0),
                 "naive": training_summary("sazd-naive", 4, 3, 0.6, 100.0, 10.0),
                 "digits": training_summary("sazd", 4, 3, 0.01, 4.0, 1.0),
                 "digits_straggler": training_summary("sazd", 4, 3, 0.011, 4.0, 1.0)}
    report = training_report(stragglers, spec, summaries, ["train.lr=0.1"])
    assert report["ratios"] == pytest.approx({"sazd_straggler_over_none": 1.25, "uncoded_straggler_over_none": 3.0,
                                              "sazd_frozen_over_none": 0.5, "uncoded_frozen_over_none": 4.0,
                                              "digits_straggler_over_none": 1.1,
                                              "naive_over_sazd_time": 1.5, "naive_over_sazd_bytes": 2.5})
    md = stragglers.render(report, None)
    assert "(worker rank(s) 3 sleep 2x their own compute time after every reply they compute" in md
    assert "take 3x as long, making no MPI progress while they sleep" in md
    assert "first 3 of 4 replies; rank 3 skipped 18 of 20 replies and fell up to 17 commands behind" in md
    assert "rank 3 was detached 1 time(s) for falling behind and readmitted 1 time(s)" in md
    assert "rank 2" not in md and "5x" not in md  # the slowed rank and the factor come from the settings
    assert "| sazd, 3x slow | 4 | 3 | 500.0 | 250.0 |" in md and "**1.25**" in md and "**3.00**" in md
    assert "`uncoded, 3x slow` over `uncoded, none`: **3.00** (rank 0 waits for 3 of 3 replies every round)" in md
    assert ("`sazd-naive, none` over `sazd, none`: iteration time **1.50x**, server bytes sent per iteration "
            "**2.50x**") in md
    md = stragglers.render(report, block(sazd=("ratios.sazd_straggler_over_none", None, 1.3),
                                         uncoded=("ratios.uncoded_straggler_over_none", 3.5, None)))
    assert "- sazd (at most 1.3): 1.25, **met**" in md and "- uncoded (at least 3.5): 3, **NOT met**" in md


# Case files.

def test_fields_fill_strings_from_a_context():
    ctx = {"n": 4, "link": "10 Gb/s", "ps": {"label": "a", "k": 3}, "r": 1.23456}
    assert cases.fill("code.k={n-1} {n+2} {n}", ctx) == "code.k=3 6 4"
    assert cases.fill("`{ps.label}` k={ps.k}: **{r:.2f}x** {{n}}", ctx) == "`a` k=3: **1.23x** {n}"
    assert cases.fields("{a.b} {{c}} {d-1:.1f}") == ["a.b", "d"]
    with pytest.raises(KeyError, match="no field 'ps.n'"):
        cases.fill("{ps.n}", ctx)


CASE_FILE = {"configs": {"a": "configs/bench_sazd.yaml"},
             "cases": [{"role": "one", "config": "a", "label": "{scheme}"},
                       {"role": "two", "config": "a", "label": "{scheme} k={k}", "overrides": ["code.k={k-1}"]},
                       {"role": "three", "config": "a", "label": "{scheme} 3", "if_emulated": True}],
             "ratios": [{"name": "r", "numerator": {"case": "two", "field": "x"},
                         "denominator": {"case": ["three", "one"], "field": ["x", "y"]}, "text": "{value}"}],
             "text": {"intro": "{one.label} {r}"}}


@pytest.mark.parametrize("change, message", [
    ({"extra": 1}, "the case file: unknown key 'extra'"),
    ({"cases": []}, "cases: expected a non-empty list"),
    ({"configs": {}}, "configs: expected a mapping"),
    ({"cases": [{"role": "one", "config": "b", "label": "x"}]}, "case one: config 'b' is not one of a"),
    ({"cases": [{"role": "1x", "config": "a", "label": "x"}]}, "cases[0]: role: got '1x'"),
    ({"cases": [{"role": "value", "config": "a", "label": "x"}]}, "cases[0]: role: got 'value'"),
    ({"cases": [{"role": "one", "config": "a", "label": "x", "overrides": ["k"]}]}, "got 'k', expected KEY=VALUE"),
    ({"cases": [{"role": "one", "config": "a", "label": "x", "when": 1}]}, "cases[0]: unknown key 'when'"),
    ({"cases": [{"role": "one", "config": "a"}]}, "case one: label: expected a non-empty string"),
    ({"cases": [{"role": "one", "config": "a", "label": "x", "if_emulated": "yes"}]}, "expected true or false"),
    ({"ratios": [{"name": "one", "numerator": {"case": "one", "field": "x"},
                  "denominator": {"case": "one", "field": "x"}}]}, "two entries share the role or ratio name 'one'"),
    ({"ratios": [{"name": "r", "numerator": {"case": "four", "field": "x"},
                  "denominator": {"case": "one", "field": "x"}}]}, "ratio r: numerator: no case has the role 'four'"),
    ({"ratios": [{"name": "r", "numerator": {"case": "one"}, "denominator": {"case": "one", "field": "x"}}]},
     "ratio r: numerator: field: expected a string or a non-empty list"),
    ({"text": {"intro": "{four.label}"}}, "text: intro: {four.label} names no case, ratio"),
    ({"text": {"outro": "x"}}, "text: unknown key 'outro'"),
])
def test_bad_case_files_are_rejected(change, message):
    with pytest.raises(cases.CaseFileError, match=re.escape(message)):
        cases.parse("cases.yaml", dict(CASE_FILE, **change))


def test_a_case_file_fills_its_cases_and_computes_its_ratios(in_root):
    spec = cases.parse("cases.yaml", CASE_FILE)
    assert spec.ratios[0]["denominator"] == {"case": ["three", "one"], "field": ["x", "y"]}
    plan = runs.plan(spec, [])  # no case emulates links: three is left out
    assert [(c.label, c.overrides) for c in plan] == [("sazd", ()), ("sazd k=2", ("code.k=2",))]
    emulated = runs.plan(spec, ["comm.emulate.bandwidth_gbps=1"])
    assert [c.label for c in emulated] == ["sazd", "sazd k=2", "sazd 3"]
    unknown = dict(CASE_FILE, cases=[dict(CASE_FILE["cases"][0], label="{nothing}")] + CASE_FILE["cases"][1:])
    with pytest.raises(cases.CaseFileError, match=r"cases.yaml: case one: '\{nothing\}': no field 'nothing'$"):
        runs.plan(cases.parse("cases.yaml", unknown), [])
    with pytest.raises(cases.CaseFileError, match="--config 'b=x.yaml': expected NAME=PATH with NAME one of a"):
        cases.parse("cases.yaml", CASE_FILE, ["b=x.yaml"])
    ratios = spec.ratios
    assert cases.ratio_values(ratios, {"one": {"x": 1, "y": 3}, "two": {"x": 2}}, False) == {"r": 0.5}
    assert cases.ratio_values(ratios, {"one": {"x": 0, "y": 0}, "two": {"x": 2}}, False) == {"r": None}
    assert cases.ratio_values(ratios, {"one": {"x": 1}, "two": {"x": 2}}, False) == {"r": None}  # no field y
    assert cases.ratio_values(ratios, {"two": {"x": 2}}, False) == {}  # no denominator case ran
    assert cases.ratio_values(ratios, {"one": {"x": 1, "y": 3}, "two": {"x": 2}, "three": {"x": 3, "y": 5}},
                              True) == {"r": 0.25}  # the first listed case that ran
    emulated = [dict(ratios[0], if_emulated=True)]
    assert cases.ratio_values(emulated, {"one": {"x": 1, "y": 3}, "two": {"x": 2}}, False) == {}
    assert cases.ratio_values(emulated, {"one": {"x": 1, "y": 3}, "two": {"x": 2}}, True) == {"r": 0.5}


def test_training_benchmarks_refuse_bad_case_files_before_training(in_root, tmp_path, capsys):
    out = tmp_path / "out"
    assert stragglers.main(["--out", str(out), "--cases", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read case file" in capsys.readouterr().err
    assert schemes.main(["--out", str(out), "--config", "nothing=x.yaml"]) == 2
    assert "--config 'nothing=x.yaml': expected NAME=PATH" in capsys.readouterr().err
    same = dict(CASE_FILE, cases=[dict(c, label="same") for c in CASE_FILE["cases"]])
    (tmp_path / "same.yaml").write_text(yaml.safe_dump(same))
    assert stragglers.main(["--out", str(out), "--cases", str(tmp_path / "same.yaml")]) == 2
    assert "two cases share a label" in capsys.readouterr().err
    assert not out.exists()
    help_text = schemes.BENCHMARK.parser().format_help()
    assert "--cases FILE" in help_text and "configs/bench/schemes.yaml" in help_text


@pytest.mark.parametrize("name", ["schemes.json", "stragglers.json"])
def test_checked_in_ratios_follow_their_recorded_case_file(name):
    with open(os.path.join(DOCS, name)) as fh:
        report = json.load(fh)
    inputs = report["inputs"]
    summaries = {case["role"]: report["cases"][label] for label, case in inputs["cases"].items()}
    emulated = any(case["setting"]["link"] for case in inputs["cases"].values())
    assert cases.ratio_values(inputs["ratios"], summaries, emulated) == report["ratios"]
    spec = cases.load(os.path.join(ROOT, inputs["cases_file"]))
    assert [dict(r) for r in spec.ratios] == inputs["ratios"] and spec.text == inputs["text"]


# The reports under docs/benchmarks and re-rendering them.

@pytest.mark.parametrize("name", sorted(REPORTS))
def test_checked_in_markdown_is_rendered_from_its_json(name):
    with open(os.path.join(DOCS, name)) as fh:
        report = json.load(fh)
    with open(os.path.join(DOCS, name[:-5] + ".md")) as fh:
        markdown = fh.read()
    expectations = expect.load(os.path.join(DOCS, "expectations.yaml"), report["benchmark"])
    assert REPORTS[name](report, expectations) == markdown
    assert f"`{report['command']}`" in markdown or f"\n{report['command']}\n" in markdown


def test_render_option_rewrites_markdown_only(tmp_path, capsys):
    source = tmp_path / "codec.json"
    source.write_text(json.dumps(codec_report()))
    before = source.read_bytes()
    assert codec.main(["--render", str(source), "--expectations", "none"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["codec.json", "codec.md"] and source.read_bytes() == before
    assert "## Expectations" not in (tmp_path / "codec.md").read_text()
    rules = tmp_path / "rules.yaml"
    rules.write_text("codec:\n  error: {field: 'accuracy[code=SAZD].worst_rel_error', max: 1.0e-9}\n")
    assert codec.main(["--render", str(source), "--expectations", str(rules), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "codec.md").read_text()
    assert md.endswith("- error (at most 1e-09): 1.2e-07, **NOT met**\n")
    assert f"wrote {tmp_path / 'out' / 'codec.md'}" in capsys.readouterr().out


def test_render_option_refuses_other_reports_and_bad_expectations(tmp_path, capsys):
    source = tmp_path / "comm.json"
    source.write_text(json.dumps(comm_report()))
    assert codec.main(["--render", str(source)]) == 2
    assert "is a 'comm' report, expected 'codec'" in capsys.readouterr().err
    rules = tmp_path / "rules.yaml"
    rules.write_text("comm:\n  worst: {field: bandwidth.0.ratio_transport_pingpong}\n")
    assert comm.main(["--render", str(source), "--expectations", str(rules)]) == 2
    assert "rules.yaml: comm: worst: give min, max or both" in capsys.readouterr().err
    broken = copy.deepcopy(comm_report())
    del broken["inputs"]
    source.write_text(json.dumps(broken))
    assert comm.main(["--render", str(source), "--expectations", "none"]) == 2
    assert "cannot render" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["comm.json", "rules.yaml"]


# The codec benchmark end to end, on a tiny problem.

def test_quick_codec_benchmark_writes_a_report_that_renders_back(tmp_path, capsys):
    out = tmp_path / "bench"
    rules = tmp_path / "rules.yaml"
    rules.write_text("codec:\n"
                     "  sets: {field: 'accuracy[code=SAZD,n=5,k=3,L=8].arrival_sets', min: 11}\n"
                     "  error: {field: 'accuracy[code=SAZD].worst_rel_error', max: 1.0e-5}\n")
    argv = ["--out", str(out), "--quick", "--pairs", "5,3", "--mib", "0.05", "--repeats", "2", "--limit", "10",
            "--threads", "2", "--expectations", str(rules)]
    assert codec.main(argv) == 0
    assert sorted(os.listdir(out)) == ["codec.json", "codec.md"]  # no temporary files left behind
    report = json.loads((out / "codec.json").read_text())
    # The recorded command reruns the same measurement.
    prog, rest = shlex.split(report["command"])[:3], shlex.split(report["command"])[3:]
    assert prog == ["psf", "bench", "codec"]
    rerun = codec.build_parser().parse_args(rest)
    assert (rerun.pairs, rerun.mib, rerun.repeats, rerun.limit, rerun.threads) == (["5,3"], 0.05, 2, 10, 2)
    assert report["inputs"]["pairs"] == [[5, 3]] and report["machine"]["decode_threads"] == 2
    # Accuracy: every 3 of 5 packets tried, the worst set is one of them, SAZD far better than integer nodes.
    cells = {(r["code"], r["L"]): r for r in report["accuracy"]}
    assert len(cells) == 4 * len(codec.SYMBOLS)
    sazd = cells[("SAZD", 8)]
    assert sazd["exhaustive"] and sazd["arrival_sets"] == math.comb(5, 3)
    assert len(set(sazd["worst_packets"])) == 3 and set(sazd["worst_packets"]) <= set(range(5))
    assert sazd["worst_rel_error"] < 1e-5 < cells[("Poly integers", 8)]["worst_rel_error"]
    # Speed: the block set has the size asked for, each arrival set uses the packets its label says.
    (row,) = report["speed"]
    assert row["block_set_MiB"] == pytest.approx(0.05, rel=0.01) and row["decode_stripes"] == 1
    cases = row["sazd_decode"]
    assert [cases[label]["packets"] for label in ("all systematic", "1 systematic dropped",
                                                  "first 2 systematic dropped")] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    worst = cases["worst of 2 systematic dropped"]["packets"]
    assert len(worst) == 3 and {3, 4} <= set(worst) and row["poly_decode_packets"] == [2, 3, 4]
    ops = [cases[label]["symbol_operations"] for label in ("all systematic", "1 systematic dropped",
                                                           "first 2 systematic dropped")]
    assert 0 < ops[0] < ops[1] < ops[2]  # losing systematic packets costs decoding work
    for case in cases.values():
        assert 0 < case["decode_min_s"] <= case["decode_s"] < 1 and 0 < case["numpy_sum_min_s"] <= case["numpy_sum_s"]
        assert 0.01 < case["ratio_to_numpy_sum"] < 1000  # a wrong unit or an empty timing falls outside
    assert [t["block_set_MiB"] for t in report["threads"]] == pytest.approx([0.05, 0.1, 0.2], rel=0.01)
    # The Markdown shows the JSON's figures and verdicts, and is what rendering the JSON gives.
    md = (out / "codec.md").read_text()
    for label, case in cases.items():
        assert f"| (5,3) | {label} {tuple(case['packets'])} | {case['operations']} |" in md
        assert f"| {case['decode_s'] * 1e3:.3f} ({case['decode_min_s'] * 1e3:.3f}) |" in md
    assert f"| (5,3) | 8 | 10 | {sazd['worst_rel_error']:.2g} |" in md
    assert "- sets (at least 11): 10, **NOT met**" in md
    worst_error = max(r["worst_rel_error"] for r in report["accuracy"] if r["code"] == "SAZD")
    assert f"- error (at most 1e-05): {worst_error:.3g}" in md
    assert md == codec.render(report, expect.load(str(rules), "codec"))
    printed = capsys.readouterr().out
    assert "NOT met: sets (at least 11): 10, **NOT met**" in printed and "wrote" in printed
    check_quick_mixed_precision(report, md)


def check_quick_mixed_precision(report: dict, md: str) -> None:
    """The quick run's mixed-precision table: every cell, every subset, SAZD near the precision's own rounding."""
    pairs = precision.PAIRS[:precision.QUICK_PAIRS]
    assert report["inputs"]["precision_pairs"] == [list(p) for p in pairs]
    rows = {(r["code"], r["precision"], r["n"], r["k"]): r for r in report["mixed_precision"]["rows"]}
    assert set(rows) == {("SAZD", p, n, k) for p in ("bf16", "fp16") for n, k in pairs} | {
        ("Poly chebyshev", p, n, k) for p in ("bf16", "fp16") for n, k in pairs}
    own = {}
    for (code, p, n, k), row in rows.items():
        assert row["subsets"] == math.comb(n, k) and len(set(row["worst_packets_vs_same"])) == k
        assert all(math.isfinite(row[key]) for key in ("worst_vs_same", "median_vs_same", "worst_vs_fp32",
                                                       "median_vs_fp32", "own_rel_error"))
        assert 0 <= row["median_vs_same"] <= row["worst_vs_same"] and 0 < row["own_rel_error"]
        own.setdefault(p, row["own_rel_error"])
        assert row["own_rel_error"] == own[p]  # the same uncoded convolution for every code and (n, k)
        if code == "SAZD":  # measured: at most about 4.2x the rounding in either precision
            assert row["worst_vs_same_over_own"] < 50 and row["worst_vs_fp32_over_own"] < 50
    assert own["fp16"] < 2 ** -10 < own["bf16"] < 2 ** -7  # about the unit roundoffs 2**-11 and 2**-8
    n, k = pairs[-1]
    for p in ("bf16", "fp16"):  # measured: Poly about 3.5x worse at (6,4), growing with k (800x at (12,8))
        assert 2 * rows[("SAZD", p, n, k)]["worst_vs_same"] < rows[("Poly chebyshev", p, n, k)]["worst_vs_same"]
    sazd = rows[("SAZD", "bf16", n, k)]
    assert f"| SAZD | bf16 | ({n},{k}) | {sazd['L']} | {sazd['subsets']} | {sazd['own_rel_error']:.2g} |" in md
    bound = max(r["worst_vs_same_over_own"] for r in rows.values() if r["code"] == "SAZD")
    assert f"Observed bound: SAZD decoding adds at most {bound:.2f}x the precision's own rounding" in md


def test_bad_options_exit_with_status_2(tmp_path, capsys):
    assert codec.main(["--out", str(tmp_path), "--pairs", "3,5"]) == 2
    assert "--pairs: '3,5' needs 1 <= k <= n" in capsys.readouterr().err
    assert codec.main(["--out", str(tmp_path), "--repeats", "0"]) == 2
    assert codec.main(["--out", str(tmp_path), "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1, got 0" in capsys.readouterr().err
    assert codec.main(["--out", str(tmp_path), "--expectations", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read expectations" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
    assert rep.command_line("psf bench codec", ["--out", "a b"]) == "psf bench codec --out 'a b'"


def test_fewer_received_bytes_than_counted_are_no_contradiction_more_are():
    def case(sent, received):
        return {"analytic_bytes": [100, 50], "server_bytes_sent_per_iteration": sent,
                "server_bytes_received_per_iteration": received}

    assert schemes.figures({"a": case(100, 50), "b": case(100, 40)}) == {"analytic_bytes_mismatches": 0}
    assert schemes.figures({"a": case(100, 51)}) == {"analytic_bytes_mismatches": 1}
    assert schemes.figures({"a": case(99, 50)}) == {"analytic_bytes_mismatches": 1}
    assert schemes.figures({"a": {"analytic_bytes": None}}) == {"analytic_bytes_mismatches": 0}


def test_the_scaleout_case_file_plans_every_scheme_and_server_count(in_root):
    plan = runs.plan(cases.load(scaleout.BENCHMARK.cases_file), [])
    labels = [c.label for c in plan]
    assert labels[:3] == ["ps, G=1, 1 Gb/s", "ps, G=2, 1 Gb/s", "ps, G=4, 1 Gb/s"] and len(labels) == 18
    assert labels[9] == "ps, G=1, no emulation"
    assert [runs.case_inputs(c, [])["ranks"] for c in plan][:9] == [5, 6, 8, 5, 6, 8, 4, 8, 16]


def scaleout_summary(scheme: str, servers: int, mean_s: float, emulated: bool) -> dict:
    per_server = [{"group": g, "bytes_sent_per_iteration": 8e6 / servers, "bytes_received_per_iteration": 4e6,
                   "sync_bytes_per_iteration": 1e6 if servers > 1 else 0.0} for g in range(servers)]
    analytic = [{"group": g, "sent": 8e6 / servers, "received": 4e6, "sync": 1e6 if servers > 1 else 0}
                for g in range(servers)]
    link = analytic and scaleout.link_seconds(analytic, 1.0 if emulated else None)
    return dict(training_summary(scheme, 4, None, mean_s, 8e6, 4e6), servers=per_server if servers > 1 else None,
                world_size=5 * servers, analytic_servers=analytic, analytic_link_s=link,
                emulation={"bandwidth_gbps": 1.0} if emulated else None)


def test_scaleout_predicts_each_speedup_from_the_local_time_and_the_busiest_link():
    assert scaleout.link_seconds([{"sent": 1e9, "sync": 0}, {"sent": 5e8, "sync": 5e8 + 125e6}], 8.0) == 1.125
    assert scaleout.link_seconds([{"sent": 1e9, "sync": 0}], None) == 0.0
    summaries = {"a": scaleout_summary("ps", 1, 0.164, True), "b": scaleout_summary("ps", 2, 0.1, True),
                 "c": scaleout_summary("ps", 1, 0.1, False), "d": scaleout_summary("ps", 2, 0.05, False)}
    rows = scaleout.figures(summaries)["scaleout"]
    assert [(r["servers"], r["link_s"]) for r in rows] == [(1, 0.064), (2, 0.04)]
    two = rows[1]
    assert two["predicted_s"] == pytest.approx(0.09) and two["speedup"] == pytest.approx(1.64)
    assert two["predicted_speedup"] == pytest.approx(0.164 / 0.09)
    assert two["gap"] == pytest.approx(1.64 / (0.164 / 0.09) - 1)
    report = {"benchmark": "scaleout", "command": "psf bench scaleout", "machine": "Test machine", "date": "x",
              "inputs": {"cases": {}, "text": {}}, "cases": {k: dict(v, label=k) for k, v in summaries.items()},
              **scaleout.figures(summaries)}
    md = scaleout.render(report, block(ps=("scaleout[scheme=ps,servers=2].speedup", 1.4, None)))
    assert "| ps | 2 | 4 | 100.0 | 50.0 | 40.0 | 90.0 | 1.64 | 1.82 | -10.0 |" in md
    server = "3.81 (3.81) / 3.81 (3.81) / 0.95 (0.95)"
    assert f"| b | 10 | 100.0 | {server}<br>{server} |" in md
    assert "(at least 1.4): 1.64, **met**" in md


def test_repeated_cases_report_their_median_run():
    runs_ = [{"mean_iteration_s": t, "run": i} for i, t in enumerate([0.3, 0.1, 0.2])]
    chosen = runs.median_run(runs_)
    assert chosen["run"] == 2 and chosen["repeat_iteration_s"] == [0.3, 0.1, 0.2]
    assert runs.median_run(runs_[:2])["run"] == 1  # an even count: the lower of the two middle runs
