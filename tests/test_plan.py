"""The cost model of `psf plan`: the simulation on graphs whose answer is known, the schemes' graphs
against their byte models, the plan's rows and recommendation, and its command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from psframework.plan.choose import code_sizes, plan_names, recommend, row_json, rows, setups
from psframework.plan.cluster import Cluster, PlanError, Straggler, parse_rate, parse_time
from psframework.plan.graphs import FLOAT, Setup
from psframework.plan.predict import predict
from psframework.plan.profile import Fit, Link, load, save
from psframework.plan.sim import Graph, Machine, simulate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FREE = Link(0.0, math.inf, 0.0)


def machine(cores=1.0, bandwidth=math.inf, latency=0.0, share_ingress=True, **kw):
    """Every rank on one pool of `cores`, each on a host of its own."""
    return Machine(pool_of=lambda r: 0, cores=lambda p: cores, host_of=lambda r: r, bandwidth_Bps=lambda h: bandwidth,
                   latency_s=latency, share_ingress=share_ingress, **kw)


# ---------------------------------------------------------------------------- the simulation

def test_ranks_sharing_cores_advance_at_their_share():
    g = Graph()
    a, b = g.compute(0, 1.0), g.compute(1, 1.0)
    assert simulate(g, machine(cores=1))[a] == pytest.approx(2.0)
    assert simulate(g, machine(cores=2))[b] == pytest.approx(1.0)
    g.compute(2, 0.5)  # three on two cores: each at 2/3 until the short one ends at 0.75, then at 1
    done = simulate(g, machine(cores=2))
    assert done[a] == pytest.approx(0.75 + 0.5 / 1.0)


def test_a_rank_runs_its_computations_in_order():
    g = Graph()
    first, second = g.compute(0, 1.0), g.compute(0, 2.0)
    done = simulate(g, machine(cores=4))
    assert (done[first], done[second]) == (pytest.approx(1.0), pytest.approx(3.0))


def test_messages_into_one_receiver_share_its_link_and_the_emulation_does_not():
    g = Graph()
    one, two = g.send(1, 0, 1_000_000), g.send(2, 0, 1_000_000)
    real = simulate(g, machine(bandwidth=1e6, latency=0.01))  # two flows share host 0's ingress fairly
    assert [real[one], real[two]] == [pytest.approx(2.01), pytest.approx(2.01)]
    emulated = simulate(g, machine(bandwidth=1e6, latency=0.01, share_ingress=False))
    assert [emulated[one], emulated[two]] == [pytest.approx(1.01), pytest.approx(1.01)]
    g.send(0, 3, 1_000_000)  # out of host 0 while the two come in: its egress is free
    assert simulate(g, machine(bandwidth=1e6, latency=0.01))[one] == pytest.approx(2.01)


def test_a_flow_goes_no_faster_than_its_polling_ranks_move_it():
    g = Graph()
    msg = g.send(1, 0, 1_000_000)
    assert simulate(g, machine(bandwidth=1e7, polled_Bps=1e6))[msg] == pytest.approx(1.0)
    g.send(2, 0, 500_000)  # a second flow halves the first one's share only while it lasts
    assert simulate(g, machine(bandwidth=1e6))[msg] == pytest.approx(1.5)


def test_a_first_k_join_takes_the_kth_arrival():
    g = Graph()
    sends = [g.send(j + 1, 0, size) for j, size in enumerate((3_000, 1_000, 2_000))]
    second = g.first(2, sends)
    done = simulate(g, machine(bandwidth=1e3, share_ingress=False))
    assert done[second] == pytest.approx(2.0)


def test_copies_and_the_transport_cost_processor_time_at_both_ends():
    g = Graph()
    msg = g.send(0, 1, 1000)
    m = machine(cpu_s_per_byte=lambda s, d: 1e-3, overhead_s=0.25)
    assert simulate(g, m)[msg] == pytest.approx(2 * (0.25 + 0.5))


def test_a_stop_go_rank_works_only_while_it_runs_and_a_slow_one_takes_longer():
    g = Graph()
    task = g.compute(1, 1.0)
    other = g.compute(2, 1.0)
    done = simulate(g, machine(cores=2, stop_go=(1, 0.5, 0.5, 0.0)))  # stopped 0-0.5, 1-1.5, ...
    assert done[task] == pytest.approx(2.0) and done[other] == pytest.approx(1.0)
    assert simulate(g, machine(cores=2, slow=(1, 3.0)))[task] == pytest.approx(3.0)


def test_a_fit_goes_through_its_points_and_never_below_zero():
    fit = Fit.of([(1, 3.0), (2, 5.0), (4, 9.0)])
    assert (fit.a, fit.b) == (pytest.approx(1.0), pytest.approx(2.0))
    assert Fit(-5.0, 1.0)(1.0) == 0.0


# ---------------------------------------------------------------------------- the schemes' graphs

@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """A quick profile of lenet5 on the digits config (one repeat; the tests use its shapes, not its times)."""
    from psframework.plan.calibrate import calibrate
    from psframework.plan.cli import settings_of

    made = calibrate(settings_of("configs/digits_sazd.yaml", []), "configs/digits_sazd.yaml",
                     {"shm": Link(1e-5, 1e9, 1e-9, 1e-5)}, repeats=1, say=lambda t: None)
    path = tmp_path_factory.mktemp("plan") / "profile.json"
    save(made, str(path))
    return load(str(path))


def cluster(**kw):
    base = dict(hosts=64, cores_per_host=1.0, link_Bps=1.25e9, latency_s=5e-6, local=FREE, remote=FREE)
    return Cluster(**{**base, **kw})


@pytest.mark.parametrize("scheme,overrides", [
    ("ps", []), ("stanza", []), ("sazd", []), ("sazd", ["comm.dissemination=relay"]), ("uncoded", [])])
def test_rank0s_bytes_in_the_graphs_are_the_schemes_byte_models(profile, scheme, overrides):
    from psframework.schemes.common import analytic_server_bytes
    from psframework.schemes.validate import load_run, make_settings

    n, k = 4, (4 if scheme == "uncoded" else 3)
    settings = make_settings(load_run("configs/digits_sazd.yaml", [f"scheme={scheme}", f"code.n={n}", f"code.k={k}"]
                                      + overrides))
    sent, received = analytic_server_bytes(settings)
    dissemination = "relay" if overrides else "direct"
    setup = Setup(scheme, n, k, dissemination=dissemination)
    got = predict(profile, setup, cluster()).rank0_bytes
    if scheme == "stanza":
        # the model sends feature gradients to every worker (n - b of them in a run with backup workers)
        assert got == pytest.approx(sent + received, rel=1e-9)
    elif scheme == "sazd" and dissemination == "relay":
        assert got == pytest.approx(sent + received, rel=0.01)  # packets rounded up to whole values
    else:
        assert got == pytest.approx(sent + received, rel=1e-9)


def test_ddp_is_compute_then_a_ring_allreduce_on_the_wire(profile):
    bandwidth = 1e8
    slow = predict(profile, Setup("ddp", 2, 2), cluster(link_Bps=bandwidth, latency_s=0.0))
    fast = predict(profile, Setup("ddp", 2, 2), cluster(link_Bps=math.inf, latency_s=0.0))
    ring = 2 * (2 - 1) / 2 * FLOAT * profile.params / bandwidth  # one bucket: nothing to overlap it with
    assert slow.iteration_s - fast.iteration_s == pytest.approx(ring, rel=0.05)


def test_a_stopped_worker_holds_ddp_up_and_not_a_first_k_round(profile):
    calm, stopped = cluster(), cluster(straggler=Straggler("stopgo", 0.8))

    def slowdown(setup):
        return predict(profile, setup, stopped).iteration_s / predict(profile, setup, calm).iteration_s
    ddp, sazd = slowdown(Setup("ddp", 4, 4)), slowdown(Setup("sazd", 4, 3))
    assert ddp > 2.0 and sazd < 1.2


def test_the_plan_tries_what_fits_and_recommends_its_fastest_real_choice(profile):
    candidates = setups(9, plan_names(), (2, 4, 8))
    assert all(s.ranks <= 9 for s in candidates) and {s.scheme for s in candidates} == {"ps", "stanza", "sazd", "ddp"}
    assert code_sizes(8) == [6, 7] and code_sizes(16) == [12, 14, 15]
    predictions, _ = rows(profile, cluster(), candidates)
    rec = recommend(profile, cluster(), predictions)
    fastest = max((p for p in predictions if p.setup.scheme != "ddp"), key=lambda p: p.images_per_s)
    ddp = max((p for p in predictions if p.setup.scheme == "ddp"), key=lambda p: p.images_per_s)
    assert rec.best == fastest and rec.ddp == ddp
    # The profile's times are measured here, so which side wins is the machine's; the verdict must follow it.
    assert rec.stay_on_ddp == (ddp.images_per_s > fastest.images_per_s)
    if rec.stay_on_ddp:
        assert rec.reason.startswith(f"stay on DDP (n={ddp.setup.n}): ")
        assert f"psframework's best, {fastest.setup.scheme} (" in rec.reason
    else:
        assert rec.reason.endswith(f"DDP's speed at n={ddp.setup.n}")
    assert set(row_json(fastest)) == {"scheme", "n", "k", "servers", "dissemination", "backup_workers",
                                      "iteration_s", "images_per_s", "rank0_bytes"}


def test_the_plan_leaves_out_only_setups_that_cannot_win(profile):
    from psframework.plan.predict import predict, work_bound_s

    crowded = cluster(hosts=1, cores_per_host=2.0, one_pool=True)  # many workers on one host's 2 cores
    candidates = setups(34, plan_names(), (2, 4, 8, 16))
    predictions, skipped = rows(profile, crowded, candidates)
    assert skipped and len(predictions) + len(skipped) == len(candidates)
    assert "ddp" in {p.setup.scheme for p in predictions}
    best = min(p.iteration_s for p in predictions if p.setup.scheme != "ddp")
    for setup in skipped[-3:]:  # the largest: replayed anyway, each is slower than the best, as its bound said
        replayed = predict(profile, setup, crowded).iteration_s
        assert work_bound_s(profile, setup, crowded) <= replayed * 1.05 and replayed > best


def test_the_plan_says_stay_on_ddp_where_ddp_is_predicted_faster(profile):
    predictions, _ = rows(profile, cluster(), setups(9, plan_names(), (2, 4, 8)))
    best = max((p for p in predictions if p.setup.scheme != "ddp"), key=lambda p: p.images_per_s)
    ddp = max((p for p in predictions if p.setup.scheme == "ddp"), key=lambda p: p.images_per_s)
    slower = replace(ddp, iteration_s=best.iteration_s * 1.25)
    faster = replace(ddp, iteration_s=best.iteration_s / 1.25)
    others = [p for p in predictions if p.setup.scheme != "ddp"]
    kept = recommend(profile, cluster(), others + [slower])
    assert not kept.stay_on_ddp and kept.reason.endswith(f"; 1.25x DDP's speed at n={ddp.setup.n}")
    stay = recommend(profile, cluster(), others + [faster])
    assert stay.best == best and stay.stay_on_ddp and stay.to_json()["stay_on_ddp"] is True
    assert stay.reason.startswith(f"stay on DDP (n={ddp.setup.n}): it is predicted 1.25x as fast as "
                                  f"psframework's best, {best.setup.scheme} (")


def test_rates_times_and_stragglers_are_read_or_refused_in_one_line():
    assert parse_rate("10gbit") == pytest.approx(1.25e9) and parse_rate("800mbit") == pytest.approx(1e8)
    assert parse_time("5us") == pytest.approx(5e-6) and parse_time("0.1ms") == pytest.approx(1e-4)
    assert Straggler.parse("stopgo:0.8") == Straggler("stopgo", 0.8)
    for bad, what in (("fast", parse_rate), ("5 parsecs", parse_time)):
        with pytest.raises(PlanError, match="got"):
            what(bad)
    with pytest.raises(PlanError, match=r"--straggler: got 'stopgo:2'"):
        Straggler.parse("stopgo:2")


# ---------------------------------------------------------------------------- the command line

def psf_plan(*args):
    return subprocess.run([sys.executable, "-m", "psframework", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (["--hosts", "0", "--link", "1gbit"], "--hosts: got 0, expected a positive number of nodes"),
    (["--hosts", "9", "--link", "fast"], "--link: got 'fast', expected a rate"),
    (["--hosts", "9", "--link", "1gbit", "--straggler", "late"], "--straggler: got 'late'"),
    (["--hosts", "9", "--link", "1gbit", "--schemes", "ps,magic"], "--schemes: got 'ps,magic'"),
    (["--hosts", "9", "--link", "1gbit", "--schemes", "ddp"], "(one scheme at least)"),
])
def test_bad_plan_inputs_are_one_line_errors(args, message):
    done = psf_plan("configs/bench_stanza.yaml", *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_plan_of_the_shipped_profile_prints_stable_json_up_to_n_32():
    done = psf_plan("configs/bench_stanza.yaml", "--hosts", "33", "--link", "1gbit", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert max(r["n"] for r in out["rows"]) == 32 and all(r["servers"] * (r["n"] + 1) <= 33 for r in out["rows"]
                                                          if r["scheme"] != "ddp")
    assert {"scheme", "n", "k", "servers", "dissemination", "reason"} <= set(out["recommendation"])


def test_the_validation_report_renders_errors_rankings_and_the_terms_it_misses():
    from psframework.plan.validation_report import render, summary

    def case(contender, measured, predicted, held="", cpu=(0.2, 0.2)):
        return {"label": f"m: {contender}", "workload": "m", "contender": contender, "n": 4, "k": 3, "link": "1",
                "network": "emulated", "held_out": held, "measured_s": measured, "predicted_s": predicted,
                "error": predicted / measured - 1, "measured_cpu_s": cpu[0], "predicted_cpu_s": cpu[1]}
    cases = [case("a", 1.0, 1.05), case("b", 2.0, 1.9), case("c", 3.0, 1.5, cpu=(0.4, 0.2)),
             case("d", 1.0, 1.1, held="another n")]
    s = summary(cases)
    assert s["cases"] == 3 and s["median_error"] == pytest.approx(0.05) and s["worst_error"] == pytest.approx(0.5)
    assert s["pairs"] == {"compared": 3, "agree": 2, "disagree": ["m: b / c"]}
    questions = [{"question": "relay", "n": n, "link": link, "scheme": "x", "k": n - 1, "dissemination": d,
                  "backup_workers": 0, "iteration_s": 0.1} for n in (4, 8, 32, 128) for link in ("none", "1")
                 for d in ("direct", "relay")]
    questions += [{"question": "stop-go", "n": n, "link": "10", "scheme": name, "k": n, "dissemination": "direct",
                   "backup_workers": 0, "iteration_s": 0.2} for n in (4, 8, 32, 128) for name in ("ddp", "x")]
    text = render({"command": "psf bench plan", "machine": "m", "date": "d", "cases": cases,
                   "questions": questions})
    assert "median absolute error 5.0% (within the 10% bound), worst 50.0% (NOT within the 25% bound)" in text
    assert "m: c (-50%): the pieces' cost: processor time 200 ms predicted, 400 ms measured" in text
    assert "| 4 | 200.0 | 200.0 (1.00) |" in text


class KilledAtProgress:
    """A stderr that takes the process down (as a kill would) at the first progress line."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        if " setups weighed " in text:
            raise KeyboardInterrupt
        return len(text)

    def flush(self) -> None:
        pass


def test_a_long_plan_says_how_far_it_has_got_and_a_killed_one_leaves_no_json(monkeypatch, capsys):
    """The slowest plan of its issue: progress on stderr as it goes, and nothing on stdout but the whole JSON."""
    from psframework.cli import main
    from psframework.plan import choose

    monkeypatch.setattr(choose, "PROGRESS_EVERY_S", 0.0)
    stderr = KilledAtProgress()
    monkeypatch.setattr(sys, "stderr", stderr)
    with pytest.raises(KeyboardInterrupt):
        main(["plan", os.path.join(ROOT, "configs", "bench_sazd.yaml"), "code.n=6", "code.k=4",
              "comm.emulate.bandwidth_gbps=null", "comm.emulate.latency_us=0", "--hosts", "1", "--link", "10gbit",
              "--cores-per-host", "2", "--json"])
    assert "psf plan: 0 of 190 setups weighed (0 left out), now ps n=2" in stderr.text
    assert capsys.readouterr().out == ""
