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
    return CodeSettings(kind=kind, n=c.n, k=c.k, systematic=c.systematic, symbol_size=c.symbol_channels,
                        nodes=c.nodes, subsets=c.subsets)


def straggler_spec(cfg: Config) -> StragglerSpec:
    """Return the straggler model; its own checks become one config error line."""
    s = cfg.stragglers
    try:
        return StragglerSpec(model=s.model, ranks=tuple(s.ranks), factor=s.factor, seed=s.seed, count=s.count,
                             shape=s.shape, responsive=s.responsive, pause_s=s.pause_s, duty=s.duty)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def loss_scale_of(t: Any) -> str:
    """Return the loss scaling of a `train` section: dynamic or none (auto: dynamic exactly with fp16)."""
    if t.loss_scale == "auto":
        return "dynamic" if t.precision == "fp16" else "none"
    return t.loss_scale


def run_settings(cfg: Config) -> RunSettings:
    """Return what the driver does around the steps, from the train and output sections."""
    t, out = cfg.train, cfg.output
    return RunSettings(
        scheme=cfg.scheme, name=cfg.name, run_dir=cfg.run_dir, epochs=t.epochs, max_iterations=t.max_iterations,
        eval_every=t.eval_every, verify_every=t.verify_every, checkpoint_every=t.checkpoint_every, resume=t.resume,
        backup_workers=t.backup_workers, progress=out.progress, resume_force=t.resume_force,
        overwrite=out.overwrite, preempt_signal=t.preempt_signal, servers=t.servers,
        keep_checkpoints=t.keep_checkpoints, max_requeues=t.max_requeues, tensorboard=out.tensorboard,
        trace=out.trace, trace_iterations=out.trace_iterations,
        trace_window=tuple(out.trace_window) if out.trace_window else None)


def transport_settings(cfg: Config) -> TransportSettings:
    """Return the transport settings of the comm section."""
    c = cfg.comm
    return TransportSettings(
        timeout_s=c.timeout_s, cuda_aware=c.cuda_aware, threads=c.threads, bandwidth_gbps=c.emulate.bandwidth_gbps,
        latency_us=c.emulate.latency_us, dissemination=c.dissemination, window=c.window,
        detach_after=c.detach_after, progress_thread=c.progress_thread, emulated_ranks=c.emulate.ranks,
        detach_after_s=c.detach_after_s)


def optim_settings(cfg: Config) -> OptimSettings:
    """Return the optimizers, learning-rate schedule and step recipe of the train section."""
    t = cfg.train
    schedule = ScheduleSettings(
        kind=t.lr_schedule, milestones=tuple(t.lr_milestones), gamma=t.lr_gamma, step_epochs=t.lr_step_epochs,
        pct_start=t.lr_pct_start, div_factor=t.lr_div_factor, final_div_factor=t.lr_final_div_factor,
        warmup=t.warmup, warmup_unit=t.warmup_unit, warmup_start_factor=t.warmup_start_factor)
    return OptimSettings(
        optimizer=t.optimizer, lr=t.lr, momentum=t.momentum, nesterov=t.nesterov, weight_decay=t.weight_decay,
        head_optimizer=t.head_optimizer, head_lr=t.head_lr, schedule=schedule, seed=t.seed,
        label_smoothing=t.label_smoothing, accumulate=t.accumulate, precision=t.precision,
        loss_scale=loss_scale_of(t), loss_scale_power=t.loss_scale_power, loss_scale_window=t.loss_scale_window)


def build_settings(cfg: Config, code: Optional[str]) -> Settings:
    """Turn a validated Config into Settings; `code` is its scheme's code kind (None: no code)."""
    return Settings(run=run_settings(cfg), code=code_settings(cfg, code), transport=transport_settings(cfg),
                    stragglers=straggler_spec(cfg), optim=optim_settings(cfg), data=cfg.data, model=cfg.model,
                    device=cfg.device, config=cfg.to_dict())
