"""psf bench peers on real links (--network netcluster): the running order, the pairing with DDP, the
report, the options' errors, and one tiny run across the hosts of a cluster the benchmark makes."""

from __future__ import annotations

import json
import os

import pytest

from netclusterutil import require_namespaces
from psframework.bench import peers, peers_cases, peers_render
from psframework.bench import peers_links as links
from psframework.bench.contenders import load as load_contenders
from psframework.cli import main
from psframework.netcluster import hosts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTENDERS = load_contenders(os.path.join(ROOT, peers.DEFAULT_CONTENDERS), "stanza")
DDP, PS, SAZD = (CONTENDERS.named(name) for name in ("ddp", "ps", "sazd"))


def test_each_group_runs_as_ddp_case_ddp_case_in_every_pass():
    cases = [peers_cases.Case(c, 4, "1", "none", net) for net in links.NETWORKS for c in (DDP, PS, SAZD)]
    cases += [peers_cases.Case(c, 4, "10", links.SLOW_LINK, links.NETCLUSTER) for c in (DDP, SAZD)]
    order = links.schedule(cases, 2, "ddp", interleave=True)
    names = [(p, c.contender.name, c.network, c.straggler) for p, c in order]
    one_pass = [("ddp", "emulated", "none"), ("ps", "emulated", "none"), ("ddp", "emulated", "none"),
                ("sazd", "emulated", "none"), ("ddp", "netcluster", "none"), ("ps", "netcluster", "none"),
                ("ddp", "netcluster", "none"), ("sazd", "netcluster", "none"),
                ("ddp", "netcluster", "slow-link"), ("sazd", "netcluster", "slow-link")]
    assert names == [(p, *entry) for p in range(2) for entry in one_pass]
    assert links.schedule(cases, 2, "ddp", interleave=False) == [(p, c) for p in range(2) for c in cases]


def record(scheme, time, p=0, network="netcluster", straggler="none", **extra):
    return {"scheme": scheme, "label": f"{scheme}, {network}, {straggler}", "n": 4, "link_gbps": 1.0,
            "network": network, "straggler": straggler, "iteration_s": time, "pass": p, "load": 2.0,
            "ranks": 4 if scheme == "ddp" else 5, **extra}


def test_a_case_is_divided_by_the_ddp_runs_beside_it_and_reported_with_its_spread():
    records = [record("ddp", 0.1), record("ps", 0.3), record("ddp", 0.2), record("sazd", 0.4),
               record("ddp", 0.1, network="emulated"),  # another group: not beside sazd
               record("ddp", 0.2, p=1), record("ps", 0.2, p=1), record("ddp", 0.2, p=1), record("sazd", 0.3, p=1),
               record("ddp", 0.2, p=2), record("ps", 0.5, p=2)]
    links.pair(records, "ddp")
    assert records[1]["over_baseline"] == pytest.approx(0.3 / 0.15)  # both neighbours
    assert records[3]["over_baseline"] == pytest.approx(0.4 / 0.2)  # the one before it only
    assert records[0].get("over_baseline") is None
    cases = {c["scheme"]: c for c in links.aggregate([r for r in records if r["network"] == "netcluster"])}
    ps = cases["ps"]
    assert ps["iteration_s"] == 0.3 and ps["repeat_iteration_s"] == [0.3, 0.2, 0.5]
    assert ps["spread"]["iteration_s"] == {"median": 0.3, "min": 0.2, "max": 0.5}
    assert ps["spread"]["over_baseline"]["min"] == pytest.approx(1.0)
    assert ps["spread"]["over_baseline"]["max"] == pytest.approx(2.5) and "pass" not in ps


def test_a_slow_link_run_is_timed_before_and_after_its_fault():
    rows = [{"iteration": i, "iteration_s": t} for i, t in enumerate([9.0, 0.1, 0.1, 0.1, 0.5, 0.7, 9.0], 1)]
    got = links.before_fault(rows, 4)
    assert got["before_s"] == pytest.approx(0.1) and got["slowdown"] == pytest.approx(6.0)
    assert links.before_fault(rows, 7)["slowdown"] is None  # the run ended before the fault


def report():
    emu = dict(record("sazd", 0.2, network="emulated"), k=3, coded=True, rank0_bytes_per_iteration=2 ** 20,
               detached=0, spread={"iteration_s": {"median": 0.2, "min": 0.19, "max": 0.25},
                                   "over_baseline": {"median": 1.5, "min": 1.4, "max": 1.6},
                                   "load": {"median": 2.0, "min": 2.0, "max": 2.0}})
    real = dict(emu, network="netcluster", iteration_s=0.3, rank0_link_rx_per_iteration=2e6,
                rank0_link_tx_per_iteration=1e6,
                spread={"iteration_s": {"median": 0.3, "min": 0.3, "max": 0.3},
                        "load": {"median": 3.0, "min": 3.0, "max": 3.0}})
    slow = dict(real, straggler=links.SLOW_LINK, link_gbps=10.0, before_s=0.3, slowdown=1.1,
                spread={"slowdown": {"median": 1.1, "min": 1.0, "max": 1.2}})
    runs = [emu, real]  # one pass
    return {"benchmark": "peers", "command": "psf bench peers --network emulated,netcluster",
            "machine": "Test CPU, 2 cores", "date": "2030-01-02T03:04:05+00:00",
            "inputs": {"config": "configs/bench_stanza.yaml", "overrides": [], "iterations": 10, "stop_s": 0.4,
                       "go_s": 0.1, "repeat": 3, "latency_us": 50, "baseline": "ddp", "hosts": 5,
                       "networks": ["emulated", "netcluster"], "slow_link": {"fraction": 0.01, "rank": 2},
                       "setting": {"model": "vgg-small", "conv_channels": [32, 64], "fc": [1024], "classes": 10,
                                   "dataset": "synthetic", "input": [3, 32, 32], "batch_size": 64}},
            "pingpong": [{"link_gbps": 1.0, "latency_s": 4e-5, "bandwidth_bps": 9.4e8, "size_bytes": 64 << 20,
                          "repeats": 5, "message_s": 0.6, "load": 1.0}],
            "cases": [emu, real, slow], "ratios": [], "runs": links.run_rows(runs)}


def test_the_report_puts_emulated_and_real_links_side_by_side():
    markdown = peers_render.render(report(), None)
    assert "| real 1 Gb/s | 40 | 0.940 | 0.94 | 64 | 1.0 |" in markdown
    assert ("| sazd | 200.0 (190.0-250.0) | 1.50 (1.40-1.60) | 300.0 (300.0-300.0) |  | 1.50 (1.50-1.50) | 1.0 | "
            "2.0 / 1.0 | 16.0 | 2.0 / 3.0 |") in markdown
    fault = markdown.split("## One worker's link slowed to 1% of its rate")[1]
    assert "| sazd |  |  | 1.10 (1.00-1.20) |  | 0 |  |" in fault
    assert "this kernel has no netem" in markdown and "Incast at rank 0" in markdown
    assert "what rank 0's host receives per iteration takes, at the line rate, sazd 16 ms" in markdown


@pytest.mark.parametrize("option,message", [
    (["--network", "wan"], "--network: got 'wan', expected a comma-separated list of emulated, netcluster"),
    (["--slow-link", "sazd"], "--slow-link: got 'sazd', but only real links can be slowed: add --network netcluster"),
    (["--network", "netcluster", "--slow-link", "horovod"], "--slow-link: got 'horovod', expected"),
    (["--network", "netcluster", "--slow-link", "sazd", "--slow-fraction", "1"], "--slow-fraction: got 1.0"),
    (["--network", "netcluster", "--slow-link", "sazd", "--slow-link-at", "fast"], "--slow-link-at: got 'fast'"),
    (["--network", "netcluster", "--pingpong-mib", "0"], "--pingpong-mib: got 0, expected at least 1"),
])
def test_bad_network_options_are_one_line(tmp_path, capsys, option, message):
    assert main(["bench", "peers", "--out", str(tmp_path), *option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not os.listdir(tmp_path)


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_tiny_run_crosses_the_hosts_links_and_leaves_no_cluster(tmp_path, capsys, monkeypatch):
    require_namespaces()
    monkeypatch.setenv("MPIEXEC_TIMEOUT", "120")
    code = main(["bench", "peers", "--config", os.path.join(ROOT, "configs", "digits_sazd.yaml"), "--schemes",
                 "ddp,sazd", "--workers", "2", "--links", "none", "--network", "netcluster", "--stragglers", "none",
                 "--iterations", "4", "--pingpong-mib", "1", "--timeout", "90", "--out", str(tmp_path),
                 "--expectations", "none", "data.batch_size=32"])
    assert code == 0, capsys.readouterr()
    data = json.loads((tmp_path / "peers.json").read_text())
    got = {c["scheme"]: c for c in data["cases"]}
    assert set(got) == {"ddp", "sazd"} and all(c["network"] == "netcluster" for c in got.values())
    for c in got.values():
        # Rank 0's host link carried at least what rank 0 sent and received: the job ran over it.
        moved = c["rank0_link_rx_per_iteration"] + c["rank0_link_tx_per_iteration"]
        assert moved >= c["rank0_bytes_per_iteration"] > 0
    assert got["sazd"]["spread"]["over_baseline"]["median"] > 0
    assert data["pingpong"][0]["link_gbps"] is None and data["pingpong"][0]["bandwidth_bps"] > 0
    assert (tmp_path / "peers.md").read_text() == peers_render.render(data, None)
    assert not hosts.leftover_namespaces(f"pb{os.getpid() % 10**8}")
