"""Several servers (train.servers = G): G groups of a server and n workers, one model, the reference's result."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mpiutil import describe, run_mpi, run_psf
from test_preempt import interrupt
from psframework.cli import main
from psframework.comm.collective import CollectiveStats
from psframework.errors import ConfigError
from psframework.schemes.common import meta_model, placement_of
from psframework.schemes.groups import ServerGroup, part_size, sync_bytes
from psframework.schemes.registry import SchemeError, get_scheme
from psframework.schemes.validate import load_run, make_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_sazd.yaml")
# Synthetic images: the digits' constant borders put ReLU inputs exactly at their kink, where rounding
# decides a gradient entry. At this learning rate the training with BatchNorm is not chaotic: the
# reference trainer with its initial weights perturbed by 1e-7 (hpc/sensitivity.py) ends within 1e-6.
SYNTHETIC = ["data.dataset=synthetic", "data.synthetic.height=8", "data.synthetic.width=8",
             "data.synthetic.channels=1", "data.synthetic.train_size=990"]
# One epoch of the 990 synthetic samples is 30 batches of 32 (the last, partial one dropped), the runs' length:
# the cosine schedule, planned over the epochs, ends with them (its rate falls to zero, where rounding
# differences no longer grow).
COMMON = ["train.max_iterations=30", "train.epochs=1", "output.progress=off", "train.weight_decay=0.001",
          "train.momentum=0.9", "train.lr=0.05", "model.batch_norm=true", *SYNTHETIC]
GROUPS = ["train.servers=2", "code.n=3", "code.k=2"]


class OnePeer:
    """The peers of a single server: a sum is the values themselves."""

    names = [0]

    def __init__(self) -> None:
        self.stats = CollectiveStats()

    def sum(self, values, what, serve=None):
        self.stats.sent_bytes += values.nbytes
        self.stats.received_bytes += values.nbytes
        return values

    def start_sum(self, values, what):
        total = self.sum(values, what)
        return type("Done", (), {"wait": lambda self, serve=None: total})()


def settings_of(*overrides):
    return make_settings(load_run(CONFIG, list(overrides)))


def test_a_group_gets_its_contiguous_part_of_every_batch():
    indices = np.arange(100, 131)
    parts = [ServerGroup(OnePeer(), g, 2).part(indices) for g in range(2)]
    assert np.array_equal(np.concatenate(parts), indices)
    assert [len(p) for p in parts] == [part_size(31, 0, 2), part_size(31, 1, 2)] == [16, 15]


def test_synced_batch_norm_of_one_server_is_torch_batch_norm():
    torch.manual_seed(0)
    ours, theirs = torch.nn.BatchNorm2d(5).double(), torch.nn.BatchNorm2d(5).double()
    with torch.no_grad():
        for layer in (ours, theirs):
            layer.weight.copy_(torch.linspace(0.5, 2.0, 5))
            layer.bias.copy_(torch.linspace(-1.0, 1.0, 5))
    x = torch.randn(7, 5, 3, 4, dtype=torch.float64)
    dy = torch.randn(7, 5, 3, 4, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with ServerGroup(OnePeer(), 0, 1).batchnorm(ours):
        ya = ours(xa)
    yb = theirs(xb)
    (ya * dy).sum().backward()
    (yb * dy).sum().backward()
    pairs = [(ya, yb), (xa.grad, xb.grad), (ours.weight.grad, theirs.weight.grad), (ours.bias.grad, theirs.bias.grad),
             (ours.running_mean, theirs.running_mean), (ours.running_var, theirs.running_var)]
    for a, b in pairs:
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert int(ours.num_batches_tracked) == 1
    ours.eval()
    with ServerGroup(OnePeer(), 0, 1).batchnorm(ours):
        assert torch.equal(ours(x), F.batch_norm(x, ours.running_mean, ours.running_var, ours.weight, ours.bias))


def test_the_servers_sum_gradients_loss_and_the_stop_flag_in_one_message():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 3)).sum().backward()
    peers = OnePeer()
    group = ServerGroup(peers, 0, 1)
    group.begin(4)
    assert group.sum_gradients([opt], 1.5) == 1.5 and not group.stop
    assert peers.stats.sent_bytes == 4 * (3 * 2 + 2 + 2) == sync_bytes(8, [])
    assert group.fields() == {"server_sync_bytes": 40}


def test_the_world_is_g_groups_of_a_server_and_n_workers():
    scheme = get_scheme("sazd")
    assert scheme.world_size(3, 2) == 8 and scheme.world_size(4) == 5
    scheme.check_world(3, 8, 2)
    with pytest.raises(SchemeError) as err:
        scheme.check_world(3, 6, 2)
    assert str(err.value) == ("world size 6 does not fit train.servers=2 with code.n=3: scheme sazd needs G*(n+1) = 8 "
                              "ranks (2 groups of 1 server + 3 workers); launch with mpiexec -n 8")


@pytest.mark.parametrize("overrides,message", [
    (["scheme=reference", "train.servers=2"], "train.servers: got 2 for scheme reference, which runs in one process"),
    ([*GROUPS, "stragglers.model=fixed", "stragglers.ranks=[4]"],
     "stragglers.ranks: got rank 4, expected worker ranks 1..3, 5..7"),
    ([*GROUPS, "data.batch_size=1"], "data.batch_size: got 1 with train.servers=2, expected at least one sample"),
    (["train.servers=0"], "train.servers: got 0, expected a positive number of server ranks"),
    (["scheme=stanza", "train.servers=2", "train.backup_workers=1"],
     "train.backup_workers: got 1 with train.servers=2; scheme stanza's workers sum their conv gradients"),
    (["scheme=ps", "train.servers=2", "train.head_optimizer=adam"],
     "train.head_optimizer: got 'adam' with train.servers=2; scheme ps's servers step their parameter shards"),
    (["scheme=ps", "train.servers=2", "train.backup_workers=8"],
     "train.backup_workers: got 8 with 8 workers (train.servers=2 x code.n=4), expected 0 <= backup_workers < 8"),
])
def test_bad_server_settings_are_one_clear_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_run(CONFIG, overrides)
    assert message in str(err.value)


def test_check_and_launch_count_every_group(capsys):
    from psframework.launch import train_world_size

    assert train_world_size(["train", CONFIG, *GROUPS], {})[0] == 8
    assert main(["check", CONFIG, *GROUPS, "--world-size", "8"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "# MPI ranks: 8 = 2 x (1 server + 3 workers)"
    assert main(["check", CONFIG, *GROUPS, "--world-size", "5"]) == 2
    assert "needs G*(n+1) = 8 ranks" in capsys.readouterr().err


def test_each_server_moves_half_the_activations_of_one_server_for_the_same_batch():
    one, two = settings_of("code.n=3", "code.k=2", *COMMON), settings_of(*GROUPS, *COMMON)
    model = meta_model(one)
    placement = placement_of(one, model)
    scheme = get_scheme("sazd")
    sent, received = scheme.expected_server_bytes(one, model, placement)
    for group in (0, 1):
        assert scheme.expected_server_bytes(two, model, placement, group) == (sent // 2, received // 2)
    assert scheme.expected_sync_bytes(one, model, placement) == 0
    held = set(placement.worker_parameter_names())
    stepped = sum(p.numel() for name, p in model.named_parameters() if name not in held)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 2 and stepped > 0
    assert scheme.expected_sync_bytes(two, model, placement) == sync_bytes(stepped, norms)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}"] + COMMON) == 0
    return out / "ref"


def read_run(run_dir):
    state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return state, rows, json.loads((run_dir / "summary.json").read_text())


def assert_matches(run_dir, reference_dir, rel=1e-4):
    (ours, rows, _), (ref, ref_rows, _) = read_run(run_dir), read_run(reference_dir)
    assert ours.keys() == ref.keys()
    for key in ref:
        a, b = ours[key].double(), ref[key].double()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        assert err <= rel, f"{key}: relative error {err:.2e}"
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in ref_rows]
    assert max(abs(r["loss"] - q["loss"]) for r, q in zip(rows, ref_rows)) <= rel


# Forced erasures in both groups: "rotate" decodes every round from the next k-subset, waiting for all.
@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("overrides", [
    ["scheme=sazd", "comm.dissemination=relay", "code.subsets=rotate", "train.verify_every=10"],
    ["scheme=poly", "code.subsets=rotate"],
    ["scheme=uncoded", "code.k=3"],
    ["scheme=sazd-naive", "code.subsets=rotate"],
], ids=["sazd-relay", "poly", "uncoded", "sazd-naive"])
def test_coded_groups_match_the_reference_and_their_byte_counts(tmp_path, reference, overrides):
    args = [*COMMON, *GROUPS, *overrides]
    proc = run_psf(8, ["train", CONFIG, "name=run", f"output.dir={tmp_path}", *args], timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert_matches(tmp_path / "run", reference)
    summary = read_run(tmp_path / "run")[2]
    assert summary["world_size"] == 8 and [s["rank"] for s in summary["servers"]] == [0, 4]
    settings = settings_of(*args)
    model = meta_model(settings)
    placement = placement_of(settings, model)
    scheme = get_scheme(settings.run.scheme)
    for server in summary["servers"]:
        assert server["sync_bytes_per_iteration"] == scheme.expected_sync_bytes(settings, model, placement)
        expected = scheme.expected_server_bytes(settings, model, placement, server["group"])
        if expected is not None:
            assert (server["bytes_sent_per_iteration"], server["bytes_received_per_iteration"]) == expected


@pytest.fixture(scope="module")
def plain_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    assert main(["train", CONFIG, "scheme=reference", "name=ref", f"output.dir={out}", *COMMON,
                 "model.batch_norm=false"]) == 0
    return out / "ref"


# Data-parallel BatchNorm sees shards, not the whole batch: ps and stanza are compared without it.
@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scheme", ["ps", "stanza"])
def test_data_parallel_servers_match_the_reference_and_their_byte_counts(tmp_path, plain_reference, scheme):
    args = [*COMMON, "model.batch_norm=false", "train.servers=2", "code.n=2", "code.k=2", f"scheme={scheme}"]
    proc = run_psf(6, ["train", CONFIG, "name=run", f"output.dir={tmp_path}", *args], timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert_matches(tmp_path / "run", plain_reference)
    summary = read_run(tmp_path / "run")[2]
    settings = settings_of(*args)
    model = meta_model(settings)
    placement = placement_of(settings, model)
    one = settings_of(*args[:-4], "code.n=4", "code.k=4", f"scheme={scheme}")  # one server, the same 4 workers
    single = get_scheme(scheme).expected_server_bytes(one, model, placement)
    for server in summary["servers"]:
        expected = get_scheme(scheme).expected_server_bytes(settings, model, placement, server["group"])
        assert (server["bytes_sent_per_iteration"], server["bytes_received_per_iteration"]) == expected
        assert server["sync_bytes_per_iteration"] == get_scheme(scheme).expected_sync_bytes(settings, model, placement)
        assert expected[0] < 0.6 * single[0]  # each server's link carries about half of one server's


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_sharded_servers_go_on_with_the_first_workers_of_each_shard(tmp_path):
    args = [*COMMON, "model.batch_norm=false", "train.servers=2", "code.n=2", "code.k=2", "scheme=ps",
            "train.backup_workers=1",
            "train.max_iterations=10"]
    proc = run_psf(6, ["train", CONFIG, "name=run", f"output.dir={tmp_path}", *args], timeout=200)
    assert proc.returncode == 0, describe(proc)
    _, rows, summary = read_run(tmp_path / "run")
    assert summary["backup_workers"] == 1 and len(rows) == 10
    assert all(len(row["used"]) == 3 and set(row["used"]) <= {1, 2, 4, 5} for row in rows)


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_frozen_worker_is_named_by_the_holder_of_the_same_packet_in_the_other_group(tmp_path):
    args = [*GROUPS, "train.max_iterations=200", "output.progress=off", "comm.timeout_s=5", "stragglers.model=freeze",
            "stragglers.ranks=[6]", "stragglers.pause_s=3600", "stragglers.duty=0.99"]
    proc = run_mpi(8, ["-m", "psframework", "train", CONFIG, "name=run", f"output.dir={tmp_path}", *args], timeout=200)
    assert proc.returncode != 0
    line, = [x for x in proc.stderr.splitlines() if x.startswith("psf: error:")]
    assert line.startswith("psf: error: rank 2: watchdog: no answer from rank(s) 6 for the coded gradient sum of "
                           "packet 1 after 5 s"), line


# A preemption signal on every rank: all servers stop after one iteration, the lead checkpoints (the
# coded weights decoded from its group, the other servers' state is the same), and a resume goes on.
@pytest.mark.mpi
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks,overrides,reference_name", [
    (8, [*GROUPS, "scheme=sazd", "code.subsets=rotate"], "reference"),
    (6, ["model.batch_norm=false", "train.servers=2", "code.n=2", "code.k=2", "scheme=ps"], "plain_reference"),
    (6, ["model.batch_norm=false", "train.servers=2", "code.n=2", "code.k=2", "scheme=stanza"], "plain_reference"),
], ids=["sazd", "ps", "stanza"])
def test_a_preempted_run_of_several_servers_resumes_to_the_reference(tmp_path, request, ranks, overrides,
                                                                     reference_name):
    args = [CONFIG, f"output.dir={tmp_path}", "name=cut", *COMMON, *overrides]
    status, err = interrupt(ranks, args, tmp_path / "cut" / "metrics.jsonl.partial", 8, signal.SIGUSR2)
    assert status == 75, err
    stopped = int([x for x in err.splitlines() if x.startswith("psf:")][0].split("after iteration ")[1].split()[0])
    assert 8 <= stopped < 30
    proc = run_psf(ranks, ["train", *args, "train.resume=auto"], timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert_matches(tmp_path / "cut", request.getfixturevalue(reference_name))


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_world_that_does_not_fit_the_groups_is_one_line_under_mpiexec(tmp_path):
    proc = run_mpi(6, ["-m", "psframework", "train", CONFIG, f"output.dir={tmp_path}", *GROUPS], timeout=60)
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.startswith("psf:")]
    assert lines == ["psf: error: world size 6 does not fit train.servers=2 with code.n=3: scheme sazd needs "
                     "G*(n+1) = 8 ranks (2 groups of 1 server + 3 workers); launch with mpiexec -n 8"]
