"""Typed experiment configuration: YAML files, dotted overrides and the checks of each value on its own.

The rules that need more than the config (the scheme's, the straggler model's, the preemption
signal, whether the scheme can place the model) are checked by psframework.schemes.validate, which
every command reads a config through (`load_run`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Union

import yaml

from psframework.errors import ConfigError

FILE_DATASETS = ("mnist", "fashion-mnist", "cifar10")
DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "synthetic", "image-folder")


SEED_MAX = 2**32 - 1


# ---------------------------------------------------------------- YAML

class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping gives the same key twice (plain YAML would keep only the last)."""


class _Loader(yaml.SafeLoader):
    """Safe YAML with the number notations people write (1e-3, 5E4) and no duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise yaml.constructor.ConstructorError(None, None, f"unsupported key {key!r}, expected a name",
                                                        key_node.start_mark)
            if key in seen:
                raise DuplicateKeyError(None, None, f"duplicate key {key!r} (first given on line {seen[key]})",
                                        key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads a float only with a dot ("1.0e-3"); people also write 1e-3 and 5E4.
_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def read_yaml(text: str) -> Any:
    """Parse YAML text as configs are read: safe types, 1e-3 numbers, duplicate keys refused."""
    return yaml.load(text, Loader=_Loader)


@dataclass
class SyntheticConfig:
    channels: int = 3
    height: int = 32
    width: int = 32
    classes: int = 10
    train_size: int = 2048
    test_size: int = 512
    noise: float = 1.0


@dataclass
class DataConfig:
    dataset: str = "digits"  # a built-in name or "package.module:factory"
    args: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of a dataset factory
    root: Optional[str] = None
    batch_size: int = 32
    test_batch_size: int = 256
    seed: int = 0
    drop_last: bool = True
    loader_workers: int = 0  # DataLoader worker processes of a streamed dataset
    augment: Literal["none", "crop-flip"] = "none"  # random crop after padding and horizontal flip
    augment_padding: int = 4  # crop-flip: pixels of zero padding on each side before the crop
    augment_flip: float = 0.5  # crop-flip: probability of a horizontal flip
    # auto: per-channel mean and deviation of the training set; none; fixed: data.mean and data.std.
    # Null: the dataset's default (auto for the built-in datasets, none for image-folder and a factory's).
    normalize: Optional[Literal["auto", "none", "fixed"]] = None
    mean: Optional[List[float]] = None  # per channel, with normalize: fixed
    std: Optional[List[float]] = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class ModelConfig:
    name: str = "lenet5"  # a built-in model or "package.module:factory"
    args: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of a model factory
    split_at: Optional[str] = None  # stanza: the module that starts the head on rank 0
    input_size: Optional[int] = None
    channels: Optional[List[int]] = None
    fc: Optional[List[int]] = None
    batch_norm: Optional[bool] = None
    dropout: Optional[float] = None


@dataclass
class TrainConfig:
    epochs: int = 5
    max_iterations: Optional[int] = None
    lr: float = 0.02
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr_schedule: Literal["constant", "cosine", "multistep", "step", "onecycle"] = "constant"
    lr_milestones: List[int] = field(default_factory=list)  # multistep: epochs at which lr is multiplied by gamma
    lr_gamma: float = 0.1  # multistep, step: the factor at each milestone or step
    lr_step_epochs: int = 30  # step: epochs between two multiplications by gamma
    lr_pct_start: float = 0.3  # onecycle: the fraction of the run spent raising lr
    lr_div_factor: float = 25.0  # onecycle: lr starts at lr / div_factor
    lr_final_div_factor: float = 1e4  # onecycle: lr ends at lr / div_factor / final_div_factor
    warmup: int = 0  # linear warm-up length (in warmup_unit), multiplying the schedule
    warmup_unit: Literal["epochs", "iterations"] = "epochs"
    warmup_start_factor: float = 0.1  # the warm-up's first factor; it reaches 1 at the warm-up's end
    label_smoothing: float = 0.0
    accumulate: int = 1  # micro-batches of data.batch_size samples per optimizer step
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # Dynamic loss scaling (auto: with fp16): the loss times 2**loss_scale_power at first, halved at every
    # step whose gradients overflow (the step is skipped), doubled after loss_scale_window steps without.
    loss_scale: Literal["auto", "dynamic", "none"] = "auto"
    loss_scale_power: int = 16
    loss_scale_window: int = 2000
    head_optimizer: Optional[Literal["sgd", "adam"]] = None
    head_lr: Optional[float] = None
    seed: int = 0
    eval_every: int = 0
    verify_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: Optional[int] = None  # the newest periodic checkpoints kept (null: all)
    resume: Optional[str] = None  # a checkpoint file, or "auto": the newest in the run directory, if any
    resume_force: bool = False
    preempt_signal: str = "USR2"  # checkpoint and stop at the next iteration on this signal (or SIGTERM); "none"
    max_requeues: int = 3  # preemptions requeued (SLURM_RESTART_COUNT counts them); beyond: checkpoint and stop
    backup_workers: int = 0
    servers: int = 1  # server ranks G: each leads a group of code.n workers (rank 0 is the lead)


@dataclass
class CodeConfig:
    n: int = 4
    k: int = 3
    systematic: bool = True
    symbol_channels: int = 1
    nodes: Literal["chebyshev", "equispaced", "integers"] = "chebyshev"
    subsets: Literal["first", "rotate"] = "first"


@dataclass
class StragglerConfig:
    model: Literal["none", "fixed", "random", "exponential", "pareto", "freeze"] = "none"
    factor: float = 1.0
    responsive: bool = False
    pause_s: float = 0.5
    duty: float = 0.8
    seed: int = 0
    count: int = 1
    shape: float = 1.5
    ranks: List[int] = field(default_factory=list)


@dataclass
class EmulateConfig:
    bandwidth_gbps: Optional[float] = None
    latency_us: float = 0.0
    ranks: Literal["all", "servers"] = "all"  # whose links are emulated: every rank's, or only the servers'


@dataclass
class CommConfig:
    dissemination: Literal["direct", "relay"] = "direct"
    cuda_aware: Literal["auto", "true", "false"] = "auto"
    timeout_s: float = 120.0
    threads: int = 0
    window: int = 4
    detach_after: int = 2
    detach_after_s: float = 1.0
    progress_thread: Literal["auto", "true", "false"] = "auto"
    emulate: EmulateConfig = field(default_factory=EmulateConfig)


@dataclass
class OutputConfig:
    dir: str = "runs"
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    overwrite: bool = False
    tensorboard: bool = False  # rank 0 writes the metrics as TensorBoard scalars to RUN_DIR/tensorboard
    trace: bool = False  # every rank records a timeline of its timed activities; rank 0 writes RUN_DIR/trace.json
    trace_iterations: int = 50  # the timeline keeps the newest this many iterations
    trace_window: Optional[List[int]] = None  # or [first, last]: the iterations recorded


@dataclass
class Config:
    name: str = "experiment"
    scheme: str = "reference"  # a name in the scheme registry (psframework.schemes.registry)
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    code: CodeConfig = field(default_factory=CodeConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @property
    def run_dir(self) -> str:
        """Return the directory that holds this run's outputs."""
        return os.path.join(self.output.dir, self.name)

    def to_dict(self) -> dict:
        """Return the configuration as plain nested dictionaries."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- conversion

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return _type_name(inner[0]) + " or null"
    if origin in (list, List):
        return f"a list of {_type_name(args[0])}"
    if origin in (dict, Dict):
        return "a mapping of names to values"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check and convert one value against its declared type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    bad = ConfigError(f"{key}: got {value!r}, expected {_type_name(tp)}")
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], key)
    if origin is Literal:
        if isinstance(value, bool):
            # YAML reads on/off/yes/no as booleans; map them back onto the allowed words.
            words = ("on", "true") if value else ("off", "false")
            value = next((w for w in words if w in args), str(value).lower())
        if value not in args:
            hint = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(map(str, args))}{extra}")
        return value
    if origin in (list, List):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise bad
        return [_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
            raise bad
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise bad
        return _build(tp, value, key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # 5e4 reads as a float
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if isinstance(value, int) and abs(value) > 1e300 or not math.isfinite(value):
            raise ConfigError(f"{key}: got {value!r}, expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        if "\x00" in value:
            raise ConfigError(f"{key}: got {value!r}, expected text without NUL characters")
        return value
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _build(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    """Build a dataclass from a mapping, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1)
            extra = f" (did you mean '{prefix}{hint[0]}'?)" if hint else f" (known keys: {', '.join(names)})"
            raise ConfigError(f"unknown key '{prefix}{key}'{extra}")
        kwargs[key] = _convert(value, hints[key], prefix + key)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"override key {dotted!r}: expected dotted names such as train.lr")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override key {dotted!r}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple:
    """Split a `key=value` override; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, for example train.lr=0.1")
    key, raw = text.split("=", 1)
    try:
        value = read_yaml(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


# ---------------------------------------------------------------- validation

def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(cfg: Config) -> Config:
    """Check each value and the rules among values of the config alone; raise ConfigError naming the bad value.

    psframework.schemes.validate.validate_run checks the rest, and make_settings the world size.
    """
    _require(cfg.name != "" and "/" not in cfg.name and cfg.name not in (".", ".."),
             f"name: got {cfg.name!r}, expected a non-empty name without '/'")
    _check_train(cfg.train)
    _check_code(cfg.code)
    _check_comm(cfg.comm)
    _check_model(cfg.model)
    _check_data(cfg.data)
    _check_image_size(cfg)
    _check_output(cfg.output)
    _check_bounds(cfg)
    return cfg


def _check_output(o: OutputConfig) -> None:
    import importlib.util

    w = o.trace_window
    _require(w is None or (len(w) == 2 and w[0] <= w[1]),
             f"output.trace_window: got {w}, expected [first, last] iterations with first <= last")
    _require(not o.tensorboard or importlib.util.find_spec("tensorboard") is not None,
             "output.tensorboard: true needs the tensorboard package, which is not installed; expected "
             "pip install 'psframework[tensorboard]' (or output.tensorboard: false)")


# Upper (and remaining lower) bounds of numbers: beyond them a value is a typo, not an experiment.
_BOUNDS = {
    "data.batch_size": (1, 10**7), "data.test_batch_size": (1, 10**7), "data.seed": (0, SEED_MAX),
    "data.loader_workers": (0, 256),
    "data.synthetic.channels": (1, 4096), "data.synthetic.height": (1, 4096), "data.synthetic.width": (1, 4096),
    "data.synthetic.classes": (2, 100_000), "data.synthetic.train_size": (1, 10**8),
    "data.synthetic.test_size": (1, 10**8), "data.synthetic.noise": (0.0, 1e6),
    "model.input_size": (4, 4096), "model.channels": (1, 65_536), "model.fc": (1, 10**6),
    "train.epochs": (1, 10**6), "train.max_iterations": (1, 10**9), "train.lr": (0.0, 1e3),
    "train.head_lr": (0.0, 1e3), "train.weight_decay": (0.0, 1.0), "train.seed": (0, SEED_MAX),
    "train.eval_every": (0, 10**9), "train.verify_every": (0, 10**9), "train.checkpoint_every": (0, 10**9),
    "train.keep_checkpoints": (1, 10**9), "train.max_requeues": (0, 10**6),
    "output.trace_iterations": (1, 10**6), "output.trace_window": (1, 10**9),
    "train.servers": (1, 1024), "train.lr_step_epochs": (1, 10**6), "train.lr_div_factor": (1.0, 1e9),
    "train.lr_final_div_factor": (1.0, 1e12), "train.warmup": (0, 10**9), "train.accumulate": (1, 4096),
    "train.loss_scale_power": (0, 127), "train.loss_scale_window": (1, 10**9),
    "data.augment_padding": (0, 4096),
    "code.n": (1, 1024), "code.k": (1, 1024), "code.symbol_channels": (1, 65_536),
    "stragglers.factor": (0.0, 1e6), "stragglers.pause_s": (0.0, 3600.0), "stragglers.seed": (0, SEED_MAX),
    "stragglers.count": (1, 1024), "stragglers.shape": (0.0, 1e3),  # stragglers.ranks: the scheme knows its workers
    "comm.timeout_s": (0.0, 1e6), "comm.threads": (0, 1024), "comm.detach_after": (1, 10**6),
    "comm.detach_after_s": (0.0, 1e6),
    "comm.emulate.bandwidth_gbps": (0.0, 1e6), "comm.emulate.latency_us": (0.0, 1e7),
}


def _lookup(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _check_bounds(cfg: Config) -> None:
    """Check every bounded number against its range (each element of a list)."""
    for key, (lo, hi) in _BOUNDS.items():
        value = _lookup(cfg, key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        for v in values:
            _require(lo <= v <= hi, f"{key}: got {v}, expected {lo}..{hi}")


def _check_train(t: TrainConfig) -> None:
    _require(t.epochs > 0, f"train.epochs: got {t.epochs}, expected a positive integer")
    _require(t.max_iterations is None or t.max_iterations > 0,
             f"train.max_iterations: got {t.max_iterations}, expected a positive integer or null")
    _require(t.lr > 0, f"train.lr: got {t.lr}, expected a positive number")
    _require(t.head_lr is None or t.head_lr > 0, f"train.head_lr: got {t.head_lr}, expected a positive number or null")
    _require(0 <= t.momentum < 1, f"train.momentum: got {t.momentum}, expected 0 <= momentum < 1")
    _require(not t.nesterov or t.momentum > 0, "train.nesterov: true needs train.momentum > 0")
    _require(t.weight_decay >= 0, f"train.weight_decay: got {t.weight_decay}, expected >= 0")
    _require(t.eval_every >= 0, f"train.eval_every: got {t.eval_every}, expected >= 0 (0 = every epoch)")
    _require(t.verify_every >= 0, f"train.verify_every: got {t.verify_every}, expected >= 0 (0 = never)")
    _require(t.checkpoint_every >= 0,
             f"train.checkpoint_every: got {t.checkpoint_every}, expected >= 0 (0 = only at the end)")
    _require(t.backup_workers >= 0, f"train.backup_workers: got {t.backup_workers}, expected >= 0")
    _require(t.servers >= 1, f"train.servers: got {t.servers}, expected a positive number of server ranks")
    _check_schedule(t)
    _require(0 <= t.label_smoothing < 1, f"train.label_smoothing: got {t.label_smoothing}, expected 0 <= x < 1")
    _require(t.accumulate >= 1, f"train.accumulate: got {t.accumulate}, expected a positive number of micro-batches")
    for key in ("eval_every", "verify_every", "checkpoint_every", "max_iterations"):
        value = getattr(t, key)
        _require(not value or value % t.accumulate == 0,
                 f"train.{key}: got {value}, expected a multiple of train.accumulate={t.accumulate} "
                 "(an optimizer step spans that many iterations)")


def _check_schedule(t: TrainConfig) -> None:
    """Check the learning-rate schedule against itself and the run's epochs (the iterations: make_schedule)."""
    milestones = t.lr_milestones
    _require(all(b > a for a, b in zip(milestones, milestones[1:])) and all(m >= 1 for m in milestones),
             f"train.lr_milestones: got {milestones}, expected increasing epochs >= 1")
    _require(not milestones or milestones[-1] < t.epochs,
             f"train.lr_milestones: got {milestones}, expected epochs below train.epochs={t.epochs}")
    _require(t.lr_schedule != "multistep" or milestones,
             "train.lr_milestones: empty, expected the epochs of lr_schedule multistep (e.g. [100, 150])")
    _require(0 < t.lr_gamma <= 1, f"train.lr_gamma: got {t.lr_gamma}, expected 0 < gamma <= 1")
    _require(0 < t.lr_pct_start < 1, f"train.lr_pct_start: got {t.lr_pct_start}, expected 0 < x < 1")
    _require(0 < t.warmup_start_factor <= 1,
             f"train.warmup_start_factor: got {t.warmup_start_factor}, expected 0 < factor <= 1")
    _require(not (t.warmup and t.lr_schedule == "onecycle"),
             f"train.warmup: got {t.warmup} with lr_schedule onecycle, expected 0 (onecycle warms up itself: "
             "train.lr_pct_start)")
    _require(t.warmup_unit != "epochs" or t.warmup <= t.epochs,
             f"train.warmup: got {t.warmup} epochs, longer than the run's train.epochs={t.epochs}")
    _require(t.warmup_unit != "iterations" or t.warmup % t.accumulate == 0,
             f"train.warmup: got {t.warmup} iterations, expected a multiple of train.accumulate={t.accumulate}")


def _check_code(c: CodeConfig) -> None:
    _require(c.k >= 1, f"code.k: got {c.k}, expected k >= 1")
    _require(c.n >= 1, f"code.n: got {c.n}, expected n >= 1")
    _require(c.k <= c.n, f"code.k: got k={c.k} > n={c.n}, expected k <= n")
    _require(c.symbol_channels >= 1, f"code.symbol_channels: got {c.symbol_channels}, expected >= 1")


def _check_comm(c: CommConfig) -> None:
    _require(c.timeout_s > 0, f"comm.timeout_s: got {c.timeout_s}, expected a positive number")
    _require(c.threads >= 0, f"comm.threads: got {c.threads}, expected >= 0 (0 = automatic)")
    _require(1 <= c.window <= 16, f"comm.window: got {c.window}, expected 1..16 messages in flight per worker")
    _require(c.detach_after >= 1, f"comm.detach_after: got {c.detach_after}, expected >= 1 iterations")
    _require(c.detach_after_s >= 0, f"comm.detach_after_s: got {c.detach_after_s}, expected seconds >= 0")
    e = c.emulate
    _require(e.bandwidth_gbps is None or e.bandwidth_gbps > 0,
             f"comm.emulate.bandwidth_gbps: got {e.bandwidth_gbps}, expected a positive number of Gb/s or null (off)")
    _require(e.latency_us >= 0, f"comm.emulate.latency_us: got {e.latency_us}, expected microseconds >= 0")


def _check_model(m: ModelConfig) -> None:
    if m.channels is not None:
        _require(len(m.channels) > 0 and all(x > 0 for x in m.channels),
                 f"model.channels: got {m.channels}, expected a list of positive channel counts")
    if m.fc is not None:
        _require(all(x > 0 for x in m.fc), f"model.fc: got {m.fc}, expected a list of positive widths")
    if m.dropout is not None:
        _require(0 <= m.dropout < 1, f"model.dropout: got {m.dropout}, expected 0 <= dropout < 1")
    if m.input_size is not None:
        _require(m.input_size >= 4, f"model.input_size: got {m.input_size}, expected >= 4")


def _check_data(d: DataConfig) -> None:
    _require(d.batch_size > 0, f"data.batch_size: got {d.batch_size}, expected a positive integer")
    _require(d.test_batch_size > 0, f"data.test_batch_size: got {d.test_batch_size}, expected a positive integer")
    syn = d.synthetic
    for key in ("channels", "height", "width", "classes", "train_size", "test_size"):
        value = getattr(syn, key)
        _require(value > 0, f"data.synthetic.{key}: got {value}, expected a positive integer")
    _require(syn.classes >= 2, f"data.synthetic.classes: got {syn.classes}, expected >= 2")
    from psframework.imports import is_import_path

    if d.dataset not in DATASETS and not is_import_path(d.dataset):
        hint = difflib.get_close_matches(d.dataset, DATASETS, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"data.dataset: got {d.dataset!r}, expected one of {', '.join(DATASETS)} "
                          f"or package.module:factory{extra}")
    if d.dataset in FILE_DATASETS:
        _require(d.root is not None, f"data.root: dataset {d.dataset} needs data.root, the directory of its files")
    if d.dataset == "image-folder":
        _require(d.root is not None, "data.root: dataset image-folder needs data.root, the folder that holds "
                 "train/CLASS/IMAGE and test/CLASS/IMAGE")
        _require(os.path.isdir(d.root), f"data.root: got {d.root!r}, which is not a directory; expected the folder "
                 "that holds train/CLASS/IMAGE and test/CLASS/IMAGE")
    _require(0 <= d.augment_flip <= 1, f"data.augment_flip: got {d.augment_flip}, expected a probability 0..1")
    if d.normalize == "fixed":
        _require(d.mean is not None and d.std is not None and len(d.mean) == len(d.std),
                 f"data.mean, data.std: got {d.mean} and {d.std}, expected two lists of one value per channel "
                 "with normalize: fixed")
        _require(all(s > 0 for s in d.std), f"data.std: got {d.std}, expected positive deviations")
    else:
        _require(d.mean is None and d.std is None,
                 f"data.mean, data.std: given with normalize: {d.normalize}, expected only with normalize: fixed")


def _check_image_size(cfg: Config) -> None:
    """Check that image-folder has a size to resize to: model.input_size, or a built-in model's default."""
    from psframework.imports import is_import_path

    if cfg.data.dataset == "image-folder" and cfg.model.input_size is None and is_import_path(cfg.model.name):
        raise ConfigError(f"model.input_size: not set, expected the height and width every image of data.dataset "
                          f"image-folder is resized to for model {cfg.model.name} (for example 224)")


# ---------------------------------------------------------------- loading

def read_config_file(path: str) -> dict:
    """Return the mapping a YAML config file holds; ConfigError names the file and what is wrong."""
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a directory, expected a YAML file")
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path!r}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start}), expected a UTF-8 YAML file") from None
    try:
        loaded = read_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        kind = "" if isinstance(exc, DuplicateKeyError) else "not valid YAML: "
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"config file {path!r}{where}: {kind}{problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path!r}: expected a mapping of keys at the top level")
    return loaded


def load_config(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML experiment, apply `key=value` overrides and check its values (psframework.schemes.validate.load_run
    also checks it against its scheme)."""
    tree: dict = read_config_file(path) if path is not None else {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    cfg = _build(Config, tree)
    return validate(cfg)


def dump_config(cfg: Union[Config, Mapping[str, Any]]) -> str:
    """Return the resolved configuration (or its nested dictionaries) as YAML text."""
    return yaml.safe_dump(cfg.to_dict() if isinstance(cfg, Config) else dict(cfg), sort_keys=False)
