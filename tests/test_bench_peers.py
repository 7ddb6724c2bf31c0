"""psf bench peers: its cases, ratios and report, and a small run of DDP and sazd with a stop-go worker."""

from __future__ import annotations

import json
import os
import re

import pytest

from psframework.bench import expectations as expect
from psframework.bench import peers, peers_cases, peers_render
from psframework.bench.cases import CaseFileError
from psframework.bench.contenders import load as load_contenders
from psframework.bench.contenders import parse as parse_contenders
from psframework.bench.ddp import ring_bytes
from psframework.bench.peers_links import link_words
from psframework.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "benchmarks")
CONTENDERS = load_contenders(os.path.join(ROOT, peers.DEFAULT_CONTENDERS), "stanza")
CODED = {c.name for c in CONTENDERS.contenders if c.coded}


def case(scheme, n=4, link=None, straggler="none", time=0.1, cpu=0.2, detached=0):
    k = n if scheme == "uncoded" else n - max(1, n // 4)
    return {"scheme": scheme, "coded": scheme in CODED, "n": n, "k": k, "link_gbps": link, "straggler": straggler,
            "ranks": n + 1,
            "label": f"{scheme}, n={n}, {link_words(link)}, {straggler}", "iteration_s": time,
            "timed_iterations": 10, "cpu_s_per_iteration": cpu, "cpu_s_per_iteration_rank0": cpu / 4,
            "rank0_bytes_per_iteration": 2 ** 20, "detached": detached, "worker_compute_s": 0.01,
            "rank0_parts_s": {} if scheme == "ddp" else PARTS}


PARTS = {"wait_s": 0.05, "decode_s": 0.01, "encode_s": 0.01, "comm_s": 0.001, "compute_s": 0.03}


def report(cases):
    return {"benchmark": "peers", "command": "psf bench peers --workers 4", "machine": "Test CPU, 2 cores",
            "date": "2030-01-02T03:04:05+00:00",
            "inputs": {"config": "configs/bench_stanza.yaml", "overrides": [], "iterations": 30, "stop_s": 0.4,
                       "go_s": 0.1, "repeat": 1, "latency_us": 50, "baseline": "ddp",
                       "setting": {"model": "vgg-small", "conv_channels": [32, 64], "fc": [1024], "classes": 10,
                                   "dataset": "synthetic", "input": [3, 32, 32], "batch_size": 64}},
            "cases": cases, "ratios": ratios(cases)}


def ratios(cases):
    return peers.ratios(cases, CONTENDERS.baseline, CONTENDERS.pairs)


def test_ratios_compare_every_scheme_with_ddp_and_relay_with_direct():
    cases = [case("ddp", time=0.1, cpu=0.2), case("ddp", straggler="stop-go", time=0.5),
             case("sazd", time=0.15, cpu=0.3), case("sazd", straggler="stop-go", time=0.125, detached=3),
             case("sazd-relay", time=0.16), case("ps", straggler="stop-go", time=0.1),
             case("sazd", link=1.0, time=0.6), case("sazd-relay", link=1.0, time=0.4)]
    entries = {(e["n"], e["link_gbps"]): e for e in ratios(cases)}
    local = entries[(4, None)]
    assert local["sazd_over_ddp_time"] == pytest.approx(1.5) and local["sazd_over_ddp_cpu"] == pytest.approx(1.5)
    assert local["ddp_over_sazd_stop_go"] == pytest.approx(4.0) and local["ddp_over_ps_stop_go"] == pytest.approx(5)
    assert local["relay_over_direct_time"] == pytest.approx(0.16 / 0.15)
    assert "ps_over_ddp_time" not in local  # no undisturbed ps case
    assert entries[(4, 1.0)] == {"n": 4, "link_gbps": 1.0, "relay_over_direct_time": pytest.approx(0.4 / 0.6)}


def test_the_report_renders_tables_ratios_and_verdicts():
    cases = [case("ddp"), case("ddp", straggler="stop-go", time=0.5), case("sazd", time=0.16, cpu=0.3),
             case("sazd", straggler="stop-go", time=0.2), case("sazd-relay", time=0.17),
             case("stanza", link=10.0, time=0.09)]
    block = expect.load(os.path.join(DOCS, "expectations.yaml"), "peers")
    markdown = peers_render.render(report(cases), block)
    assert "### n = 4 workers, no emulation (coded k = 3)" in markdown and "### n = 4 workers, 10 Gb/s" in markdown
    assert "| sazd | 3 | 160.0 (1.60x) | 300.0 (1.50x) | 200.0 | 1.25x | 2.50x | 1.0 | 0 / 0 |" in markdown
    assert "## Where rank 0's time goes" in markdown and "| sazd, n=4, no emulation, none | 160.0 | 50.0 |" in markdown
    verdicts = {v.expectation.name: v.status for v in expect.evaluate(report(cases), block)}
    assert verdicts["sazd_time"] == expect.NOT_MET and verdicts["sazd_cpu"] == expect.MET
    assert verdicts["sazd_stop_go"] == expect.NOT_MET and verdicts["relay_slow_links"] == expect.NOT_MEASURED


@pytest.mark.parametrize("option,message", [
    (["--schemes", "ddp,horovod"], "--schemes: got 'ddp,horovod'"),
    (["--workers", "1"], "--workers: got '1', expected comma-separated worker counts >= 2"),
    (["--links", "none,fast"], "--links: got 'none,fast'"),
    (["--stragglers", "frozen"], "--stragglers: got 'frozen'"),
    (["--stop-s", "0"], "--stop-s: got 0.0, expected seconds > 0"),
    (["--iterations", "2"], "--iterations: got 2, expected at least 3"),
])
def test_bad_options_are_one_line(tmp_path, capsys, option, message):
    assert main(["bench", "peers", "--out", str(tmp_path), *option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not os.listdir(tmp_path)


def test_the_contender_file_names_ddp_as_baseline_and_takes_k_from_the_registry():
    assert [c.name for c in CONTENDERS.contenders] == ["ddp", "ps", "stanza", "sazd", "sazd-relay", "uncoded"]
    assert CONTENDERS.baseline == "ddp" and CONTENDERS.pairs == {"relay_over_direct_time": ("sazd-relay", "sazd")}
    assert CODED == {"sazd", "sazd-relay", "uncoded"}
    cases = {c.name: peers_cases.Case(c, 8, "none", "none") for c in CONTENDERS.contenders}
    assert cases["sazd"].k == 6 and cases["uncoded"].k == 8 and cases["ddp"].ranks == 8 and cases["ps"].ranks == 9


@pytest.mark.parametrize("data,message", [
    ({"contenders": []}, "contenders: expected a non-empty list"),
    ({"contenders": [{"name": "a b"}], "baseline": "a b"}, "name: got 'a b'"),
    ({"contenders": [{"name": "a", "overrides": ["scheme=sazdd"]}], "baseline": "a"}, "did you mean 'sazd'"),
    ({"contenders": [{"name": "a", "program": "horovod"}], "baseline": "a"}, "program: got 'horovod'"),
    ({"contenders": [{"name": "a"}, {"name": "a"}], "baseline": "a"}, "two contenders share the name 'a'"),
    ({"contenders": [{"name": "a"}], "baseline": "b"}, "baseline: got 'b', expected one of the contenders a"),
    ({"contenders": [{"name": "a"}], "baseline": "a", "pairs": {"x": ["a"]}}, "pairs: x: expected [numerator"),
    ({"contenders": [{"name": "a", "colour": 1}], "baseline": "a"}, "unknown key 'colour'"),
])
def test_a_bad_contender_file_names_what_is_wrong(data, message):
    with pytest.raises(CaseFileError, match=re.escape(message)):
        parse_contenders("peers.yaml", data, "stanza")


def test_ddp_sends_a_ring_allreduce_per_process():
    assert ring_bytes(1000, 4) == 1500 and ring_bytes(1000, 1) == 0


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_small_head_to_head_trains_every_case_and_stops_a_worker(tmp_path, capsys):
    config = os.path.join(ROOT, "configs", "digits_sazd.yaml")
    code = main(["bench", "peers", "--config", config, "--schemes", "ddp,sazd", "--workers", "2",
                 "--links", "none", "--stragglers", "none,stop-go", "--iterations", "40", "--timeout", "120",
                 "--out", str(tmp_path), "--expectations", "none", "data.batch_size=32"])
    assert code == 0, capsys.readouterr()
    data = json.loads((tmp_path / "peers.json").read_text())
    got = {(c["scheme"], c["straggler"]): c for c in data["cases"]}
    assert set(got) == {(s, g) for s in ("ddp", "sazd") for g in ("none", "stop-go")}
    for c in got.values():
        assert c["iteration_s"] > 0 and c["cpu_s_per_iteration"] > 0 and c["timed_iterations"] >= 3
    assert got[("sazd", "none")]["detached"] == 0 and got[("sazd", "none")]["k"] == 1
    # DDP waits for the stopped worker every iteration; sazd (n = 2, k = 1) goes on without it.
    assert got[("ddp", "stop-go")]["iteration_s"] > got[("ddp", "none")]["iteration_s"]
    assert data["ratios"][0]["ddp_over_sazd_stop_go"] > 1
    assert (tmp_path / "peers.md").read_text() == peers_render.render(data, None)
