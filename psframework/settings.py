"""The one settings boundary: a checked Config becomes small typed settings objects.

Everything below the command line (schemes, driver, codes, comm, runtime) works from these objects,
never from the Config itself. psframework.schemes.validate.make_settings checks `code.n` against the
communicator, once, and builds them with the scheme's code (`build_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from psframework.config import Config, DataConfig, ModelConfig, dump_config
from psframework.errors import ConfigError
from psframework.runtime.stragglers import StragglerSpec
from psframework.runtime.transport_settings import TransportSettings


@dataclass(frozen=True)
class CodeSettings:
    """The erasure code of a scheme's conv layers and how the server chooses replies."""

    kind: Optional[str]  # a kind of psframework.codes.make_code, or None for schemes without a code
    n: int
    k: int
    systematic: bool = True
    symbol_size: int = 1
    nodes: str = "chebyshev"
    subsets: str = "first"  # "first": decode from the first k replies; "rotate": every k-subset in turn


@dataclass(frozen=True)
class ScheduleSettings:
    """The learning-rate schedule: a factor of train.lr at every optimizer step (psframework.schemes.lr_schedule)."""

    kind: str = "constant"  # constant, cosine, multistep, step or onecycle
    milestones: Tuple[int, ...] = ()  # multistep: epochs
    gamma: float = 0.1
    step_epochs: int = 30
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    warmup: int = 0  # in warmup_unit
    warmup_unit: str = "epochs"  # epochs or iterations
    warmup_start_factor: float = 0.1


@dataclass(frozen=True)
class OptimSettings:
    """Optimizers of the conv layers and of the head, the learning-rate schedule and how a step is computed."""

    optimizer: str = "sgd"
    lr: float = 0.02
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    head_optimizer: Optional[str] = None
    head_lr: Optional[float] = None
    schedule: ScheduleSettings = ScheduleSettings()
    seed: int = 0  # model initialisation and dropout
    label_smoothing: float = 0.0
    accumulate: int = 1  # micro-batches (iterations) per optimizer step
    precision: str = "fp32"  # fp32, bf16 or fp16: autocast of the layers each rank runs
    loss_scale: str = "none"  # dynamic or none (train.loss_scale auto resolved: dynamic with fp16)
    loss_scale_power: int = 16  # the first scale is 2 ** this
    loss_scale_window: int = 2000  # steps without overflow before the scale doubles


@dataclass(frozen=True)
class RunSettings:
    """What the training driver does around the steps: length, evaluation, checkpoints, outputs."""

    scheme: str
    name: str
    run_dir: str
    epochs: int
    max_iterations: Optional[int]
    eval_every: int  # 0: at the end of every epoch
    verify_every: int  # 0: never
    checkpoint_every: int  # 0: only at the end
    resume: Optional[str]
    backup_workers: int
    progress: str
    resume_force: bool = False  # resume although the checkpoint's settings differ
    overwrite: bool = False  # replace a run directory that already holds a run
    preempt_signal: str = "USR2"  # the signal that makes the run checkpoint and stop ("none": SIGTERM only)
    servers: int = 1  # server ranks G, each leading a group of code.n workers
    keep_checkpoints: Optional[int] = None  # the newest periodic checkpoints kept (None: all)
    max_requeues: int = 3  # how often a preempted Slurm job is requeued
    tensorboard: bool = False  # the lead server writes the metrics rows as TensorBoard scalars
    trace: bool = False  # every rank records a timeline; rank 0 writes trace.json
    trace_iterations: int = 50  # the timeline's ring of iterations
    trace_window: Optional[Tuple[int, int]] = None  # or the iterations recorded


@dataclass(frozen=True)
class Settings:
    """Every setting of one run, grouped by the part of the system that uses it."""

    run: RunSettings
    code: CodeSettings
    transport: TransportSettings
    stragglers: StragglerSpec
    optim: OptimSettings
    data: DataConfig
    model: ModelConfig
    device: str
    config: Dict[str, Any]  # the resolved config, recorded in checkpoints and the run directory

    @property
    def config_yaml(self) -> str:
        """Return the resolved config as the YAML text the run directory keeps."""
        return dump_config(self.config)


def code_settings(cfg: Config, kind: Optional[str]) -> CodeSettings:
    """Return the code settings of a config; `kind` is its scheme's code (the registry entry's)."""
    c = cfg.code
    return CodeSettings(kind, c.n, c.k, c.systematic, c.symbol_channels, c.nodes, c.subsets)


def straggler_spec(cfg: Config) -> StragglerSpec:
    """Return the straggler model; its own checks become one config error line."""
    s = cfg.stragglers
    try:
        return StragglerSpec(s.model, tuple(s.ranks), s.factor, s.seed, s.count, s.shape, s.responsive, s.pause_s,
                             s.duty)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def loss_scale_of(t: Any) -> str:
    """Return the loss scaling of a `train` section: dynamic or none (auto: dynamic exactly with fp16)."""
    if t.loss_scale == "auto":
        return "dynamic" if t.precision == "fp16" else "none"
    return t.loss_scale


def build_settings(cfg: Config, code: Optional[str]) -> Settings:
    """Turn a validated Config into Settings; `code` is its scheme's code kind (None: no code)."""
    t, c = cfg.train, cfg.comm
    run = RunSettings(cfg.scheme, cfg.name, cfg.run_dir, t.epochs, t.max_iterations,
                      t.eval_every, t.verify_every, t.checkpoint_every, t.resume, t.backup_workers,
                      cfg.output.progress, t.resume_force, cfg.output.overwrite, t.preempt_signal, t.servers,
                      t.keep_checkpoints, t.max_requeues, cfg.output.tensorboard, cfg.output.trace,
                      cfg.output.trace_iterations,
                      tuple(cfg.output.trace_window) if cfg.output.trace_window else None)
    transport = TransportSettings(c.timeout_s, c.cuda_aware, c.threads, c.emulate.bandwidth_gbps,
                                  c.emulate.latency_us, c.dissemination, c.window, c.detach_after,
                                  c.progress_thread, c.emulate.ranks, c.detach_after_s)
    schedule = ScheduleSettings(t.lr_schedule, tuple(t.lr_milestones), t.lr_gamma, t.lr_step_epochs, t.lr_pct_start,
                                t.lr_div_factor, t.lr_final_div_factor, t.warmup, t.warmup_unit,
                                t.warmup_start_factor)
    optim = OptimSettings(t.optimizer, t.lr, t.momentum, t.nesterov, t.weight_decay, t.head_optimizer, t.head_lr,
                          schedule, t.seed, t.label_smoothing, t.accumulate, t.precision, loss_scale_of(t),
                          t.loss_scale_power, t.loss_scale_window)
    return Settings(run, code_settings(cfg, code), transport, straggler_spec(cfg), optim, cfg.data, cfg.model,
                    cfg.device, cfg.to_dict())
