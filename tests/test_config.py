"""Configuration loading, overrides and validation."""

from __future__ import annotations

import os

import pytest

from psframework.cli import main
from psframework.config import Config, dump_config
from psframework.errors import ConfigError
from psframework.schemes.registry import get_scheme
from psframework.schemes.validate import load_run, make_settings


def write(tmp_path, text: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_and_shipped_configs_validate(configs_dir, tmp_path):
    cfg = load_run(None)
    assert isinstance(cfg, Config) and cfg.scheme == "reference"
    names = sorted(n for n in os.listdir(configs_dir) if n.endswith(".yaml"))
    assert len(names) >= 9
    for name in names:
        # Configs validate without the dataset files (the machine checks look for them at training time).
        cfg = load_run(os.path.join(configs_dir, name))
        make_settings(cfg, world_size=get_scheme(cfg.scheme).world_size(cfg.code.n))


def test_overrides_are_typed_and_nested(tmp_path):
    path = write(tmp_path, "train:\n  lr: 0.1\n")
    cfg = load_run(path, ["train.lr=0.5", "code.n=6", "code.k=4", "stragglers.ranks=[2,3]",
                          "train.nesterov=true", "output.progress=off", "train.max_iterations=7"])
    assert cfg.train.lr == 0.5 and cfg.code.n == 6 and cfg.code.k == 4
    assert cfg.stragglers.ranks == [2, 3] and cfg.train.nesterov is True
    assert cfg.output.progress == "off" and cfg.train.max_iterations == 7


def test_integer_is_accepted_where_a_number_is_expected():
    cfg = load_run(None, ["train.lr=1"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


@pytest.mark.parametrize("text,value", [("1e-3", 1e-3), ("1E-3", 1e-3), ("5e-2", 0.05), ("1.5e-2", 0.015),
                                        ("+2e-1", 0.2), ("0.001", 0.001), ("3", 3.0)])
def test_numbers_in_every_notation_people_write(tmp_path, text, value):
    assert load_run(None, [f"train.lr={text}"]).train.lr == value
    assert load_run(write(tmp_path, f"train:\n  lr: {text}\n")).train.lr == value


def test_integral_numbers_are_accepted_where_an_integer_is_expected(tmp_path):
    cfg = load_run(write(tmp_path, "train:\n  max_iterations: 5e4\n"), ["data.batch_size=6.4e1"])
    assert cfg.train.max_iterations == 50000 and isinstance(cfg.train.max_iterations, int)
    assert cfg.data.batch_size == 64


def test_dump_round_trips(tmp_path):
    cfg = load_run(None, ["scheme=sazd", "code.n=5", "code.k=3", "name=abc"])
    path = write(tmp_path, dump_config(cfg))
    assert load_run(path) == cfg


BAD = [
    (["trian.lr=0.1"], "did you mean 'train'"),
    (["train.lrr=0.1"], "did you mean 'train.lr'"),
    (["train.lr=fast"], "train.lr: got 'fast'"),
    (["train.lr=-1"], "train.lr: got -1.0, expected a positive number"),
    (["scheme=sazdd"], "did you mean 'sazd'"),
    (["code.k=5", "code.n=4"], "k=5 > n=4"),
    (["code.k=0"], "code.k: got 0"),
    (["data.batch_size=0"], "data.batch_size: got 0"),
    (["data.batch_size=2.5"], "data.batch_size: got 2.5, expected an integer"),
    (["data.dataset=mnist"], "data.root: dataset mnist needs data.root"),
    (["train.momentum=1.5"], "train.momentum: got 1.5"),
    (["train.nesterov=true", "train.momentum=0"], "nesterov: true needs train.momentum > 0"),
    (["scheme=sazd", "train.optimizer=adam"], "linear optimizer"),
    (["scheme=uncoded", "code.n=4", "code.k=3"], "scheme uncoded needs k = n"),
    (["stragglers.model=fixed"], "stragglers.ranks: got none, expected at least one worker rank for model fixed"),
    (["scheme=sazd", "stragglers.ranks=[9]"], "got rank 9, expected worker ranks 1..4"),
    (["stragglers.ranks=3"], "stragglers.ranks: got 3, expected a list"),
    (["train.nesterov=maybe"], "train.nesterov: got 'maybe', expected true or false"),
    (["model.name=resnet"], "model.name: got 'resnet'"),
    (["model.dropout=1.0"], "model.dropout: got 1.0"),
    (["device=gpu"], "device: got 'gpu'"),
    (["comm.timeout_s=0"], "comm.timeout_s: got 0.0"),
    (["name=a/b"], "name: got 'a/b'"),
    (["train.lr"], "expected key=value"),
    (["data=3"], "data: got 3, expected a mapping"),
    (["train.head_optimizer=rmsprop"], "train.head_optimizer: got 'rmsprop'"),
    (["scheme=stanza", "train.head_optimzer=adam"], "did you mean 'train.head_optimizer'"),
    (["scheme=ps", "train.backup_workers=4"],
     "train.backup_workers: got 4 with code.n=4, expected 0 <= backup_workers < n"),
    (["scheme=stanza", "train.backup_workers=-1"], "train.backup_workers: got -1, expected >= 0"),
    (["scheme=sazd", "train.backup_workers=1"], "backup workers belong to the data-parallel schemes"),
    (["scheme=ps", "data.batch_size=3"], "data.batch_size: got 3 with code.n=4 workers"),
    (["comm.emulate.bandwidth_gbps=0"], "comm.emulate.bandwidth_gbps: got 0.0, expected a positive number"),
    (["comm.emulate.latency_us=-5"], "comm.emulate.latency_us: got -5.0, expected microseconds >= 0"),
    (["comm.emulate.bandwith_gbps=10"], "did you mean 'comm.emulate.bandwidth_gbps'"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_inputs_give_clear_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run(None, overrides)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_world_size_must_be_n_plus_one():
    with pytest.raises(ConfigError, match=r"world size 4 does not fit code.n=4.*mpiexec -n 5"):
        make_settings(load_run(None, ["scheme=sazd"]), world_size=4)
    assert make_settings(load_run(None, ["scheme=sazd"]), world_size=5).code.n == 4
    with pytest.raises(ConfigError, match="scheme reference runs in one process"):
        make_settings(load_run(None, []), world_size=3)
    # Started without mpiexec: the only advice is how to launch (no code.n=0 suggestion).
    with pytest.raises(ConfigError, match=r"scheme stanza needs n\+1 = 5 ranks .*launch with mpiexec -n 5$"):
        make_settings(load_run(None, ["scheme=stanza"]), world_size=1)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run(write(tmp_path, "train: [1, 2\n"))
    with pytest.raises(ConfigError, match=r"line 4: duplicate key 'train' \(first given on line 1\)"):
        load_run(write(tmp_path, "train:\n  lr: 0.1\nname: x\ntrain:\n  epochs: 2\n"))
    with pytest.raises(ConfigError, match="expected a mapping of keys at the top level"):
        load_run(write(tmp_path, "- 1\n- 2\n"))


def test_check_command_prints_config_or_one_error_line(tmp_path, capsys, configs_dir):
    assert main(["check", os.path.join(configs_dir, "digits_reference.yaml"), "train.lr=0.3"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.3" in out and "scheme: reference" in out
    assert main(["check", os.path.join(configs_dir, "digits_reference.yaml"), "code.k=9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("psf: error: code.k: got k=9 > n=4")
