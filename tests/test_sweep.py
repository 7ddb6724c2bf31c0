"""psf sweep (grid, repeats, index, skipping finished points) and the srun launch it and the templates use."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import pytest

from psframework.cli import main
from psframework.errors import ConfigError
from psframework.launch import LaunchError, cpu_binding, mpiexec_path, srun_command, srun_mpi_plugin, train_world_size
from psframework.sweep import parse_grid, plan_sweep
from psframework.sweepindex import point_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "configs", "digits_reference.yaml")
SAZD = os.path.join(ROOT, "configs", "digits_sazd.yaml")


def test_a_local_sweep_runs_every_point_once_and_skips_finished_ones(tmp_path, capsys):
    args = ["sweep", REFERENCE, "--grid", "train.lr=0.05,0.1", "--repeat", "2", "--out", str(tmp_path),
            "train.max_iterations=3", "output.progress=off"]
    assert main(args) == 0
    sweep = tmp_path / "digits_reference-sweep"
    index = json.loads((sweep / "sweep.json").read_text())
    names = [p["name"] for p in index["points"]]
    assert names == ["train.lr=0.05,seed=0", "train.lr=0.05,seed=1", "train.lr=0.1,seed=0", "train.lr=0.1,seed=1"]
    configs = {}
    for point in index["points"]:
        summary = json.loads((sweep / point["dir"] / "summary.json").read_text())
        assert summary["iterations"] == 3 and point["world_size"] == 1
        configs[point["name"]] = (sweep / point["dir"] / "config.yaml").read_text()
    assert "seed: 1" in configs["train.lr=0.1,seed=1"] and "lr: 0.1" in configs["train.lr=0.1,seed=1"]
    stamps = {p: os.stat(sweep / p / "summary.json").st_mtime_ns for p in names}
    capsys.readouterr()
    assert main(args) == 0  # the second call starts nothing
    assert "(4 finished)" in capsys.readouterr().out
    assert stamps == {p: os.stat(sweep / p / "summary.json").st_mtime_ns for p in names}
    assert main(["sweep", REFERENCE, "--grid", "train.lr=0.2", "--out", str(tmp_path), "--name",
                 "digits_reference-sweep"]) == 2
    assert "holds a sweep of other settings" in capsys.readouterr().err


@pytest.mark.parametrize("grid, message", [
    (["code.k"], "--grid: got 'code.k', expected KEY=VALUE1,VALUE2"),
    (["code.k=2,"], "--grid: got 'code.k=2,'"),
    (["code.k=2", "code.k=3"], "key 'code.k' given twice"),
    (["code.k=5"], "point code.k=5: code.k: got k=5 > n=4"),
])
def test_bad_grids_are_one_line(grid, message, tmp_path, capsys):
    assert main(["sweep", SAZD, "--grid", *grid, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("psf: error: psf sweep:") and message in err[0], err
    assert not (tmp_path / "digits_sazd-sweep").exists()


def test_a_dry_run_prints_each_points_launch_line_with_its_launcher_and_rank_count(tmp_path, capsys):
    assert main(["sweep", SAZD, "--grid", "code.n=3,5", "code.k=2", "--dry-run", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    index = str(tmp_path / "digits_sazd-sweep" / "sweep.json")
    assert len(lines) == 2, lines
    for point, (line, ranks) in enumerate(zip(lines, ("4", "6"))):
        words = shlex.split(line)
        assert words[0] == f"PSF_SWEEP_POINT={point}", line
        command = words[next(i for i, w in enumerate(words) if not re.match(r"[A-Z_]+=", w)):]  # after the variables
        assert command[:3] == [mpiexec_path(), "-n", ranks], line
        assert command[-7:] == [sys.executable, "-m", "mpi4py", "-m", "psframework", "train", index], line
    assert os.listdir(tmp_path / "digits_sazd-sweep") == ["sweep.json"]  # nothing ran
    assert main(["sweep", REFERENCE, "--grid", "train.lr=0.05,0.1", "--dry-run", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert shlex.split(line)[:2] == ["PSF_SWEEP_POINT=1", sys.executable], line  # one process: no launcher


def test_a_slurm_sweep_submits_one_array_with_the_largest_task_count(tmp_path, capsys):
    assert main(["sweep", SAZD, "--grid", "code.n=3,5", "code.k=2", "--slurm", "--dry-run", "--out", str(tmp_path),
                 "--sbatch=--partition=cpu"]) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1].split()
    index = tmp_path / "digits_sazd-sweep" / "sweep.json"
    assert command[:4] == ["sbatch", "--array=0,1", "--ntasks=6", "--job-name=psf-digits_sazd-sweep"]
    assert command[-3:] == ["--partition=cpu", os.path.join("jobs", "single-node.sbatch"), str(index)]
    assert main(["sweep", SAZD, "--grid", "code.n=3,5", "code.k=2", "--slurm", "--dry-run", "--out", str(tmp_path),
                 "--max-parallel", "1"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].split()[1] == "--array=0,1%1"


def test_a_sweep_index_runs_the_point_its_task_names(tmp_path):
    assert parse_grid(["code.k=2,3", "stragglers.factor=1, 4"]) == {"code.k": ["2", "3"],
                                                                    "stragglers.factor": ["1", "4"]}
    sweep = plan_sweep(SAZD, ["train.epochs=1"], parse_grid(["code.k=2,3"]), 1, "s")
    from psframework.sweepindex import write_index

    index = write_index(str(tmp_path / "s"), sweep)
    config, overrides = point_arguments(index, ["output.progress=off"], {"SLURM_ARRAY_TASK_ID": "1"})
    assert config == SAZD
    assert overrides == ["train.epochs=1", "code.k=3", f"output.dir={tmp_path / 's'}", "name=code.k=3",
                         "train.resume=auto", "output.progress=off"]
    with pytest.raises(ConfigError, match="set PSF_SWEEP_POINT"):
        point_arguments(index, [], {})
    with pytest.raises(ConfigError, match="point '2' does not exist, expected 0..1"):
        point_arguments(index, [], {"PSF_SWEEP_POINT": "2"})
    assert point_arguments(SAZD, ["a=1"], {}) == (SAZD, ["a=1"])


def test_srun_gets_the_plugin_of_mpi4pys_mpi_the_configs_task_count_and_binding_where_it_binds(monkeypatch):
    assert srun_mpi_plugin({}, "MPICH Version: 4.2.0") == "pmi2"
    assert srun_mpi_plugin({}, "Open MPI v5.0.3, package: Open MPI") == "pmix"
    assert srun_mpi_plugin({"PSF_SRUN_MPI": "pmix"}, "MPICH Version: 4.2.0") == "pmix"
    assert srun_mpi_plugin({}, "Some Vendor MPI 1.0") is None
    assert cpu_binding({"PSF_SRUN_CPU_BIND": "none"}) == [] and cpu_binding({"PSF_SRUN_CPU_BIND": "sockets"}) == [
        "--cpu-bind=sockets"]
    assert train_world_size(["train", SAZD, "code.n=6"], {}) == (7, ["train", SAZD, "code.n=6"])
    assert train_world_size(["train", REFERENCE], {"SLURM_RESTART_COUNT": "2"}) == (
        1, ["train", REFERENCE, "train.resume=auto"])
    assert train_world_size(["doctor"], {}) == (None, ["doctor"])
    with pytest.raises(LaunchError, match="code.k: got k=3 > n=2"):
        train_world_size(["train", SAZD, "code.n=2"], {})
    monkeypatch.setenv("PATH", "/nonexistent")  # no srun, no scontrol: the plugin is not checked, no binding
    command = srun_command(["train", SAZD], None, {"SLURM_NTASKS": "5"})
    assert command[:4] == ["srun", "--mpi=pmi2", "-n", "5"] and command[-3:] == ["psframework", "train", SAZD]
    assert "--kill-on-bad-exit=0" in command  # a dead worker does not end the step
    assert "--kill-on-bad-exit=0" not in srun_command(["train", SAZD], None, {"PSF_FAULT_TOLERANT": "0"})
    with pytest.raises(LaunchError, match="needs 5 ranks but the Slurm allocation has 4 tasks"):
        srun_command(["train", SAZD], None, {"SLURM_NTASKS": "4"})
    fitted = srun_command(["train", SAZD], None, {"SLURM_NTASKS": "4"}, fit=True)  # requeued onto fewer nodes
    assert fitted[2:4] == ["-n", "4"] and fitted[-2:] == ["code.n=3", "code.k=2"]
    with pytest.raises(LaunchError, match="has 1 tasks .SLURM_NTASKS., too few for 1 server.s. with 2 or more"):
        srun_command(["train", SAZD], None, {"SLURM_NTASKS": "1"}, fit=True)


def test_the_launcher_tells_rank_0_when_srun_reports_a_task_ended_and_a_run_finished_without_it_ends_with_0(
        tmp_path, capsys):
    import signal

    from psframework.launch import finished, task_numbers, watch_task_ends

    assert task_numbers("0-1,3,5-6") == [0, 1, 3, 5, 6] and task_numbers("2") == [2]
    notices = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: notices.append(1))
    try:
        pid, ended = tmp_path / "rank0.pid", []
        watch_task_ends(["srun: error: vm: task 2: Killed\n"], str(pid), lambda: ended.append(0))  # no pid yet
        pid.write_text(str(os.getpid()))
        watch_task_ends(["psf: done\n", "srun: error: vm: task 0: Exited with exit code 1\n"], str(pid),
                        lambda: ended.append(0))
        assert notices == [] and ended == [0]  # rank 0 itself, or no task, ended: the step is ended
        watch_task_ends(["srun: error: node-3: tasks 1,4-5: Killed\n"], str(pid), lambda: ended.append(0))
        assert notices == [1] and ended == [0]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert "srun: error: node-3: tasks 1,4-5: Killed" in capsys.readouterr().err  # passed on
    lost = tmp_path / "lost"
    assert finished(137, str(lost)) == 137 and finished(0, str(lost)) == 0  # rank 0 left no word
    lost.write_text("2")
    assert finished(137, str(lost)) == 0
    said = capsys.readouterr().out
    assert "psf: srun ended with status 137: rank(s) 2 died and the run finished without them" in said
