"""The cluster of hosts on one machine (hpc/netcluster): hosts, links, cleanup, and jobs across hosts.

The unit tests check how links are described to tc. The others make real clusters (root and network
namespaces; they skip with the reason elsewhere) and check what a user relies on: every host reaches
the others only through its own cable, nothing is left behind, a shaped link carries its rate, and a
training job across hosts crosses the links and equals the same job on one host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from mpiutil import describe, run_psf
from netclusterutil import cluster, leftovers, netcluster, require_namespaces, unique_name
from psframework.netcluster import cli, hosts, jobs
from psframework.netcluster.shaping import LinkShape, ShapeError, loss_program, parse_loss, parse_rate, tc_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
SHORT = ["train.max_iterations=24", "output.progress=off", "train.lr_schedule=constant"]


# ---------------------------------------------------------------- links described to tc (no root)

def test_rates_losses_and_their_errors():
    assert parse_rate("1gbit") == 1e9 and parse_rate("100mbit") == 1e8 and parse_rate("2.5gbit") == 2.5e9
    assert parse_loss("5%") == pytest.approx(0.05) and parse_loss("0.01") == pytest.approx(0.01)
    for bad in ("fast", "-1gbit", "0gbit", "1gbps"):
        with pytest.raises(ShapeError, match=f"--rate: got '{bad}', expected a positive rate"):
            parse_rate(bad)
    for bad in ("100%", "-1%", "half"):
        with pytest.raises(ShapeError, match=f"--loss: got '{bad}'"):
            parse_loss(bad)
    with pytest.raises(ShapeError, match="--jitter: got 2ms, expected at most the delay"):
        LinkShape().merged(delay="1ms", jitter="2ms")


def test_a_link_is_a_token_bucket_with_a_loss_filter():
    commands = [" ".join(c) for c in tc_commands("eth0", LinkShape(rate_bps=1e9, loss=0.05))]
    assert commands[0].startswith("tc qdisc add dev eth0 root handle 10: tbf rate 1gbit burst ")
    assert commands[1:] == ["tc qdisc add dev eth0 clsact",
                            f"tc filter add dev eth0 egress bpf da bytecode {loss_program(0.05)}"]
    delayed = [" ".join(c) for c in tc_commands("eth0", LinkShape(rate_bps=1e9, delay_s=1e-4))]
    assert delayed[0] == "tc qdisc add dev eth0 root handle 1: netem limit 100000 delay 100us"
    assert delayed[1].startswith("tc qdisc add dev eth0 parent 1:1 handle 10: tbf")


def test_the_loss_program_keeps_its_constants_below_the_sign_bit():
    # The kernel turns classic BPF into eBPF, where a constant of 2**31 or more is sign-extended and
    # the comparison goes wrong: every constant must stay below it, the threshold included.
    for loss in (0.0, 0.05, 0.5, 0.999):
        count, *program = loss_program(loss).split(",")
        assert int(count) == len(program) == 5
        op, _, _, threshold = program[2].split()
        assert op == "53" and int(threshold) == round(loss * 2**31) < 2**31


# ---------------------------------------------------------------- a cluster's hosts and links

def _namespace_run(namespace, *argv):
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True).stdout


def test_hosts_reach_each_other_only_through_their_cables():
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")
    with cluster(3, "--rate", "1gbit", "--loss", "1%") as made:
        assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n") == root_links
        for host in range(3):
            ns = made.namespace(host)
            assert _namespace_run(ns, "ip", "-o", "-4", "addr", "show", "dev", "eth0").split()[3] == \
                f"{hosts.host_address(host)}/15"
            assert sorted(line.split(":")[1].split("@")[0].strip()
                          for line in _namespace_run(ns, "ip", "-o", "link").splitlines()) == ["eth0", "lo"]
            assert _namespace_run(ns, "ip", "route", "show", "default") == ""  # no route out of the cluster
            assert "tbf" in _namespace_run(ns, "tc", "qdisc", "show", "dev", "eth0")
            assert "bpf" in _namespace_run(ns, "tc", "filter", "show", "dev", "eth0", "egress")
            assert "tbf" in _namespace_run(made.switch, "tc", "qdisc", "show", "dev", made.port(host))
            assert _namespace_run(ns, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "0"
        assert _namespace_run(made.switch, "ip", "route", "show", "default") == ""
        outside = subprocess.run(["ip", "netns", "exec", made.namespace(0), sys.executable, "-c",
                                  "import socket; socket.create_connection(('8.8.8.8', 53), timeout=2)"],
                                 capture_output=True, text=True)
        assert outside.returncode != 0 and "unreachable" in outside.stderr.lower()
        status = json.loads(netcluster("status", "--name", made.name, "--json").stdout)
        assert [h["shape"] for h in status["hosts"]] == ["1gbit, loss 1%"] * 3


def test_a_link_changes_while_the_cluster_runs_and_bad_requests_are_one_line():
    with cluster(2) as made:
        changed = netcluster("link", "1", "--rate", "10mbit", "--loss", "5%", "--name", made.name)
        assert changed.returncode == 0, changed.stderr
        assert "rate 10mbit" in _namespace_run(made.namespace(1), "tc", "qdisc", "show", "dev", "eth0").lower()
        assert "rate 10mbit" in _namespace_run(made.switch, "tc", "qdisc", "show", "dev", made.port(1)).lower()
        assert netcluster("link", "1", "--down", "--name", made.name).returncode == 0
        assert "NO-CARRIER" in _namespace_run(made.namespace(1), "ip", "link", "show", "eth0")
        assert hosts.Cluster.load(made.name).cut == [1]
        assert netcluster("link", "1", "--up", "--rate", "none", "--loss", "0", "--name", made.name).returncode == 0
        assert hosts.Cluster.load(made.name).cut == []
        assert "tbf" not in _namespace_run(made.namespace(1), "tc", "qdisc", "show", "dev", "eth0")
        for args, line in ((["link", "2", "--rate", "1gbit"], "host: got 2, expected 0..1"),
                           (["link", "0", "--rate", "fast"], "--rate: got 'fast'"),
                           (["link", "0"], "nothing to change"),
                           (["up", "--hosts", "2"], f"a cluster named '{made.name}' is up already")):
            done = netcluster(*args, "--name", made.name)
            assert done.returncode == 2 and line in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert netcluster("status", "--name", made.name).returncode == 2


def test_down_removes_a_half_made_cluster_and_is_safe_twice():
    require_namespaces()
    name = unique_name()
    subprocess.run(["ip", "netns", "add", f"{name}-h0"], check=True)  # as an `up` killed part way leaves it
    subprocess.run(["ip", "netns", "add", f"{name}-sw"], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"{name}-h0", "sleep", "300"])
    try:
        for _ in range(2):
            done = netcluster("down", "--name", name)
            assert done.returncode == 0, done.stderr
        assert leftovers(name) == []
        assert sleeper.wait(timeout=10) != 0  # the process inside the host was ended
    finally:
        sleeper.kill()
        hosts.down(name)


def test_a_cluster_goes_when_the_process_that_made_it_is_killed():
    require_namespaces()
    name = unique_name()
    owner = subprocess.Popen(["sleep", "300"])
    try:
        made = netcluster("up", "--name", name, "--hosts", "2", "--watch-pid", str(owner.pid))
        assert made.returncode == 0, made.stderr
        assert leftovers(name)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 20
        while leftovers(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leftovers(name) == []
    finally:
        owner.kill()
        hosts.down(name)


def test_without_root_every_verb_says_why_and_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "platform", "linux")
    assert cli.main(["up", "--hosts", "2", "--name", unique_name()]) == 3
    assert capsys.readouterr().err == "netcluster: unavailable: network namespaces and tc need root (run as root " \
                                      "or with sudo)\n"


def test_a_delay_on_a_kernel_without_netem_is_refused_in_one_line():
    require_namespaces()
    name = unique_name()
    try:
        done = netcluster("up", "--hosts", "2", "--delay", "100us", "--name", name)
        if done.returncode == 0:
            pytest.skip("this kernel has netem: links are delayed")
        assert done.returncode == 3 and "--delay: this kernel has no netem" in done.stderr, done.stderr
        assert leftovers(name) == []
    finally:
        hosts.down(name)


# ---------------------------------------------------------------- jobs across hosts

@pytest.mark.mpi
def test_a_one_gigabit_link_carries_one_gigabit():
    with cluster(2, "--rate", "1gbit") as made:
        done = netcluster("pingpong", "0", "1", "--json", "--name", made.name, timeout=300)
        assert done.returncode == 0, describe(done)
        figures = json.loads(done.stdout)
        assert figures["hosts"] == [made.hostname(0), made.hostname(1)]
        assert 0.9e9 <= figures["bandwidth_bps"] <= 1.0e9, figures


def _summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def five_hosts():
    with cluster(5, "--rate", "1gbit") as made:
        yield made


def _across_hosts(made, out, config, *overrides):
    program = jobs.psf_program(["train", os.path.join(CONFIGS, config), "name=run", f"output.dir={out}",
                                *SHORT, *overrides])
    done, moved = jobs.run_job(made, 5, program, timeout_s=180, env={"OMP_NUM_THREADS": "1"}, capture=True)
    assert done.returncode == 0, describe(done)
    return os.path.join(out, "run"), moved


def _on_one_host(out, config, *overrides):
    done = run_psf(5, ["train", os.path.join(CONFIGS, config), "name=run", f"output.dir={out}", *SHORT, *overrides],
                   timeout=180)
    assert done.returncode == 0, describe(done)
    return os.path.join(out, "run")


def _model(run_dir):
    return torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=True)["model"]


@pytest.mark.mpi
def test_a_sazd_job_crosses_every_hosts_link(five_hosts, tmp_path):
    run_dir, moved = _across_hosts(five_hosts, tmp_path, "digits_sazd.yaml")
    summary = _summary(run_dir)
    # Rank 0 is alone on host 0: everything it sent and received crossed host 0's cable.
    assert moved[0]["tx_bytes"] >= summary["server_bytes_sent"] > 0
    assert moved[0]["rx_bytes"] >= summary["server_bytes_received"] > 0
    for host in range(1, 5):  # each worker's share of the layers' inputs came over its own cable
        assert moved[host]["rx_bytes"] >= summary["server_bytes_sent"] / 4 * 0.9, moved
    if "hosts" in summary:
        assert summary["hosts"] == [five_hosts.hostname(h) for h in range(5)]


# ps and stanza sum the workers' gradients in rank order: across hosts they are bitwise the same. sazd
# decodes each round from the replies that came first, so the order of its float additions follows
# the arrivals: equal up to rounding (the bound the coded schemes meet against the reference).
@pytest.mark.mpi
@pytest.mark.parametrize("config, overrides, rel", [
    ("digits_ps.yaml", (), 0.0),
    ("digits_stanza.yaml", (), 0.0),
    ("digits_sazd.yaml", ("code.subsets=rotate",), 1e-5),
], ids=["ps", "stanza", "sazd"])
def test_a_job_across_hosts_equals_the_job_on_one_host(five_hosts, tmp_path, config, overrides, rel):
    across, _ = _across_hosts(five_hosts, tmp_path / "across", config, *overrides)
    single = _on_one_host(tmp_path / "single", config, *overrides)
    ours, theirs = _model(across), _model(single)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        a, b = ours[key].float(), theirs[key].float()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        print(f"{config} {key}: relative difference {err:.2e}")
        assert err <= rel, f"{config}: {key} differs between hosts and one host by {err:.2e} (allowed {rel:g})"
