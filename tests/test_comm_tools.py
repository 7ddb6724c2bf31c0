"""Launch tooling: psf doctor, psf bench comm, hpc/psf-mpirun and the sbatch templates."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, List, Tuple

import pytest
from mpiutil import ROOT, describe, run_mpi

from psframework import cli
from psframework.launch import is_open_mpi, mpiexec_path

pytestmark = pytest.mark.timeout(120, method="thread")
WRAPPER = os.path.join(ROOT, "hpc", "psf-mpirun")


def run_python(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run Python on one process, outside any MPI launch (no launcher variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MPI_LOCAL", "OMPI_", "PMI_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_doctor_prints_a_row_per_rank_under_mpiexec():
    proc = run_mpi(3, ["-m", "psframework.doctor"], timeout=60)
    assert proc.returncode == 0, describe(proc)
    out = proc.stdout
    for line in ("MPI library      MPICH", "world size       3", "thread level", "CUDA-aware MPI   no",
                 "torch            ", "CuPy             "):
        assert line in out, out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert [r[0] for r in rows] == ["0", "1", "2"], out
    assert [r[3] for r in rows] == ["0", "1", "2"] and all(r[4] == "MPI_LOCALRANKID" for r in rows), out
    assert all(r[-3:] == ["cpu", "-", "no"] for r in rows), out  # binding, GPU name, CUDA-aware


def test_doctor_works_on_one_process_and_as_json():
    proc = run_python("-m", "psframework.doctor", "--json")
    assert proc.returncode == 0, describe(proc)
    report = json.loads(proc.stdout)
    assert report["global"]["world_size"] == 1 and len(report["ranks"]) == 1
    assert report["global"]["cuda_aware"] is False and report["ranks"][0]["threads"] >= 1
    assert report["ranks"][0]["local_rank_source"] == "MPI_COMM_TYPE_SHARED split"


def test_roles_need_a_server_and_a_worker():
    proc = run_python("-c", "from psframework.comm import setup_roles; setup_roles()")
    assert proc.returncode != 0
    assert "world size: got 1, expected at least 2 MPI processes" in proc.stderr, describe(proc)


def test_bench_comm_writes_its_report(tmp_path):
    out = tmp_path / "bench"
    proc = run_mpi(2, ["-m", "psframework.bench.comm", "--quick", "--max-size", "65536", "--out", str(out)],
                   timeout=90)
    assert proc.returncode == 0, describe(proc)
    report = json.loads((out / "comm.json").read_text())
    sizes = [row["bytes"] for row in report["bandwidth"]]
    assert sizes == [1 << i for i in range(10, 17)] == report["inputs"]["sizes"]
    assert report["benchmark"] == "comm" and report["inputs"]["quick"] and report["machine"]["world_size"] == 2
    for row in report["bandwidth"]:
        assert row["pingpong_MBps"] > 0 and row["server_to_worker_MBps"] > 0 and row["worker_to_server_MBps"] > 0
    assert report["first_k"] and report["first_k"][0]["workers"] == 1
    md = (out / "comm.md").read_text()
    assert "| 64 KiB |" in md and "mpiexec -n 2 python -m mpi4py -m psframework bench comm --quick" in md
    # The default expectations bound messages of 4 MiB and more, which a quick run does not send.
    assert "## Expectations" in md and "**met**" not in md and "not measured (nothing at `bandwidth[" in md
    assert sorted(os.listdir(out)) == ["comm.json", "comm.md"]


def test_bench_comm_renders_a_report_without_mpi(tmp_path):
    proc = run_python("-m", "psframework", "bench", "comm", "--render",
                      os.path.join(ROOT, "docs", "benchmarks", "comm.json"), "--out", str(tmp_path),
                      "--expectations", "none")
    assert proc.returncode == 0, describe(proc)
    md = (tmp_path / "comm.md").read_text()
    assert md.startswith("# Communication benchmark") and "## Expectations" not in md
    assert os.listdir(tmp_path) == ["comm.md"]


def test_bench_comm_on_one_process_says_how_to_run_it():
    proc = run_python("-c", "import sys; from psframework.bench.comm import main; sys.exit(main([]))")
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs at least 2 MPI processes, got 1" in lines[0]
    assert "mpiexec -n 2 python -m mpi4py -m psframework bench comm" in lines[0]


def wrapper_env(**extra: str) -> Dict[str, str]:
    """Return this environment without Slurm's variables or any interpreter choice, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for name in ("PSF_LAUNCHER", "PSF_PYTHON", "PSF_VENV", "VIRTUAL_ENV"):
        env.pop(name, None)
    env.update(extra)
    return env


def fake_venv(path: str) -> str:
    """Make a virtual environment's bin/ at `path` with this interpreter and mpiexec linked in; return path."""
    os.makedirs(os.path.join(path, "bin"))
    os.symlink(sys.executable, os.path.join(path, "bin", "python"))
    os.symlink(mpiexec_path(), os.path.join(path, "bin", "mpiexec"))
    return path


def dry_run(env: Dict[str, str], *args: str) -> List[str]:
    """Return the command psf-mpirun --dry-run prints for `args`."""
    proc = subprocess.run([WRAPPER, "--dry-run", *args], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, describe(proc)
    return proc.stdout.split()


def mpiexec_command(mpiexec: str, python: str, *args: str, tolerant: bool = True) -> List[str]:
    """Return the mpiexec command line psf-mpirun should build on 3 ranks.

    Fault tolerant (the default): MPICH runs every rank under the guard with -disable-auto-cleanup;
    Open MPI gets --with-ft ulfm where its ompi_info reports ULFM.
    """
    guard: List[str] = []
    if is_open_mpi(mpiexec):
        extra = ["--oversubscribe"]
        info = os.path.join(os.path.dirname(mpiexec), "ompi_info")
        if tolerant and os.access(info, os.X_OK) and "FT MPI support: yes" in subprocess.run(
                [info], capture_output=True, text=True).stdout:
            extra += ["--with-ft", "ulfm"]
    else:
        extra = ["-disable-auto-cleanup"] if tolerant else []
        guard = [python, "-m", "psframework.runtime.guard"] if tolerant else []
    return [mpiexec, "-n", "3", *extra, *guard, python, "-m", "mpi4py", "-m", "psframework", *args]


def test_psf_mpirun_runs_the_chosen_interpreter_and_its_mpiexec(tmp_path):
    active = fake_venv(str(tmp_path / "active"))
    chosen = fake_venv(str(tmp_path / "chosen"))
    args = ["-n", "3", "train", "cfg.yaml", "code.n=2"]
    beside = os.path.join(active, "bin", "mpiexec")
    assert dry_run(wrapper_env(VIRTUAL_ENV=active), *args) == mpiexec_command(
        beside, os.path.join(active, "bin", "python"), *args[2:])
    beside = os.path.join(chosen, "bin", "mpiexec")
    assert dry_run(wrapper_env(VIRTUAL_ENV=active, PSF_VENV=chosen), *args) == mpiexec_command(
        beside, os.path.join(chosen, "bin", "python"), *args[2:])
    assert dry_run(wrapper_env(PSF_VENV=chosen, PSF_PYTHON=sys.executable), *args) == mpiexec_command(
        mpiexec_path(), sys.executable, *args[2:])
    assert dry_run(wrapper_env(PSF_VENV=chosen, PSF_FAULT_TOLERANT="0"), *args) == mpiexec_command(
        beside, os.path.join(chosen, "bin", "python"), *args[2:], tolerant=False)
    proc = subprocess.run([WRAPPER, "--dry-run", "-n", "2", "doctor"], env=wrapper_env(PSF_VENV=str(tmp_path)),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "PSF_VENV: got" in proc.stderr, describe(proc)


def test_psf_mpirun_builds_the_srun_command_and_checks_its_arguments():
    env = wrapper_env(PSF_PYTHON=sys.executable)
    slurm = dict(env, SLURM_JOB_ID="42", PSF_LAUNCHER="srun", SLURM_NTASKS="8")
    config = os.path.join(ROOT, "configs", "digits_sazd.yaml")
    srun = dry_run(slurm, "train", config, "code.n=6")
    # The MPICH wheel is started through PMI-2; -n is code.n + 1 from the config
    assert os.path.basename(srun[0]) == "srun" and srun[1:4] == ["--mpi=pmi2", "-n", "7"]
    assert srun[-5:] == ["-m", "psframework", "train", config, "code.n=6"]
    srun = dry_run(dict(slurm, PSF_SRUN_MPI="pmix", PSF_SRUN_CPU_BIND="cores"), "-n", "3", "doctor")
    assert srun[1:6] == ["--mpi=pmix", "-n", "3", "--kill-on-bad-exit=0", "--cpu-bind=cores"] and srun[-1] == "doctor"
    proc = subprocess.run([WRAPPER, "--dry-run", "train", config, "code.n=9"], env=slurm, capture_output=True,
                          text=True, timeout=60)
    expected = ("psf: error: the run needs 10 ranks but the Slurm allocation has 8 tasks (SLURM_NTASKS): "
                "submit with sbatch --ntasks=10")
    assert proc.returncode == 2 and proc.stderr.strip() == expected
    proc = subprocess.run([WRAPPER, "train", "cfg.yaml"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "give the number of ranks" in proc.stderr
    proc = subprocess.run([WRAPPER, "-n", "0", "doctor"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "-n: got '0'" in proc.stderr


def test_psf_mpirun_runs_psf_under_mpi():
    env = wrapper_env(PSF_PYTHON=sys.executable, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1")
    proc = subprocess.run([WRAPPER, "-n", "2", "doctor"], env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, describe(proc)
    assert "world size       2" in proc.stdout, describe(proc)


TEMPLATES = sorted(name for name in os.listdir(os.path.join(ROOT, "jobs")) if name.endswith(".sbatch"))
# Names that stand for a config without being one: the usage placeholder, a run directory's copy, the docs' site.
NOT_CONFIGS = {"CONFIG.yaml", "config.yaml", "mkdocs.yml", "my_images.yaml"}  # the last: a user's copy of an example


def read(*parts: str) -> str:
    """Return the text of a file of the repository."""
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


# The README and the pages of the documentation: the commands they show are the ones users copy.
DOC_PAGES = ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                                   if name.endswith(".md"))


def template_world_size(text: str) -> int:
    """Return the ranks an sbatch template asks for: --ntasks, or --nodes times --ntasks-per-node."""
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    if "ntasks" in options:
        return int(options["ntasks"])
    return int(options.get("nodes", 1)) * int(options["ntasks-per-node"])


def example_runs() -> List[Tuple[str, List[str]]]:
    """Return (template, psf train arguments) of every `sbatch jobs/NAME ARGS` example in the templates and docs."""
    texts = [read("jobs", name) for name in TEMPLATES] + [read(page) for page in DOC_PAGES]
    found = re.findall(r"^[#\s]*sbatch jobs/(\S+\.sbatch) +([^#\n]+)", "\n".join(texts), re.M)
    unique = dict.fromkeys((name, args.strip()) for name, args in found if not args.startswith("CONFIG"))
    return [(name, shlex.split(args)) for name, args in unique]


EXAMPLES = [pytest.param(name, args, id=" ".join([name, *args])) for name, args in example_runs()]


def psf_command_lines(text: str) -> List[List[str]]:
    """Return the psf arguments of every psframework command line in a template, comments included."""
    lines = re.findall(r"(?:-m psframework(?:\.launch)?|psf-mpirun)\s+(.*)$", text, re.M)
    commands = []
    for line in lines:
        words = shlex.split(line)
        if words[:1] == ["-n"]:  # psf-mpirun's rank count
            words = words[2:]
        if words[:1] == ["--fit"]:  # the launcher's: train with the tasks the allocation has
            words = words[1:]
        commands.append(words)
    return commands


def runnable_here(overrides: List[str], data_root: str) -> List[str]:
    """Return the overrides with a site's data.root made local, and device=cuda dropped without a GPU."""
    import torch

    local = [o for o in overrides if not o.startswith("data.root=")] + [f"data.root={data_root}"]
    if not torch.cuda.is_available():
        local = [o for o in local if o != "device=cuda"]
    return local


def test_every_config_the_templates_and_docs_name_exists():
    files = [os.path.join("jobs", name) for name in TEMPLATES] + DOC_PAGES + ["hpc/psf-mpirun", "hpc/quickstart.sh"]
    missing = []
    for path in files:
        for name in set(re.findall(r"[\w./-]+\.ya?ml\b", read(path))) - NOT_CONFIGS:
            where = name if "/" in name else os.path.join("configs", name)  # a bare name is a config
            beside = os.path.join(os.path.dirname(path), name)  # a page's link, relative to the page
            if not os.path.isfile(os.path.join(ROOT, where)) and not os.path.isfile(os.path.join(ROOT, beside)):
                missing.append(f"{path}: {name}")
    assert not missing, missing


@pytest.mark.parametrize("name", TEMPLATES)
def test_sbatch_templates_launch_psf_train_through_mpi4py(name):
    path = os.path.join(ROOT, "jobs", name)
    text = read("jobs", name)
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --ntasks" in text
    # srun with the right plugin and -n, fitting the workers to the tasks the allocation has
    assert 'exec python -m psframework.launch --fit train "$@"' in text
    assert "#SBATCH --signal=USR2@120" in text and "#SBATCH --requeue" in text
    assert subprocess.run(["bash", "-n", path], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run(["bash", path], capture_output=True, text=True, timeout=30)  # no config given
    assert proc.returncode == 2 and "usage: sbatch jobs/" in proc.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_sbatch_template_command_lines_parse(name):
    examples = [args for template, args in example_runs() if template == name]
    assert examples, f"jobs/{name} has no `sbatch jobs/{name} CONFIG ...` example"
    commands = psf_command_lines(read("jobs", name))
    assert commands and any(words[:1] == ["train"] for words in commands)
    for words in commands:
        args = [a for w in words for a in (examples[0] if w == "$@" else [w])]
        parsed = cli.build_parser().parse_args(args)  # argparse exits with status 2 on a bad line
        assert parsed.command == args[0]


@pytest.mark.parametrize("template, args", EXAMPLES)
def test_sbatch_examples_check_against_the_templates_world_size(template, args, tmp_path, capsys):
    size = template_world_size(read("jobs", template))
    config, overrides = args[0], runnable_here(args[1:], str(tmp_path))
    status = cli.main(["check", config, *overrides, "--world-size", str(size)])
    assert status == 0, capsys.readouterr().err
