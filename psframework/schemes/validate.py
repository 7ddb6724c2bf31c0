"""A run's config at its one boundary: the rules that need the scheme, the model or the runtime, then the settings.

psframework.config reads a YAML experiment and checks each value on its own. `validate_run` adds
what needs the rest of the package: the scheme's own rules (its registry entry's `Scheme.check`),
the preemption signal, the straggler model's parameters and whether the scheme can place the
model. Every command reads a config through `load_run` (psf train, check and model-info, sweeps,
the srun launcher, train_module), so a bad input is one ConfigError line before anything starts;
`make_settings` then checks the world size and builds the settings with the scheme's code.
"""

from __future__ import annotations

from typing import Optional, Sequence

from psframework.config import Config, load_config
from psframework.errors import ConfigError
from psframework.schemes.registry import get_scheme
from psframework.settings import Settings, build_settings, straggler_spec


def load_run(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML experiment with `key=value` overrides and check all of it; ConfigError names the first fault."""
    return validate_run(load_config(path, overrides))


def validate_run(cfg: Config) -> Config:
    """Check the rules of a values-checked config that need its scheme, the runtime or its model; return it."""
    scheme = get_scheme(cfg.scheme)
    _check_signal(cfg.train.preempt_signal)
    scheme.check(cfg)
    straggler_spec(cfg)  # the straggler model checks its own parameters
    _check_geometry(cfg)
    _check_precision(cfg)
    _check_augment(cfg)
    return cfg


def make_settings(cfg: Config, world_size: Optional[int] = None) -> Settings:
    """Turn a validated Config into Settings; check n against the communicator's size if given."""
    scheme = get_scheme(cfg.scheme)
    if world_size is not None:
        scheme.check_world(cfg.code.n, world_size, cfg.train.servers)
    return build_settings(cfg, scheme.code)


def _check_signal(name: str) -> None:
    """Check train.preempt_signal: "none" or a signal a process can catch."""
    from psframework.runtime.preempt import signal_number

    try:
        ok = name.lower() == "none" or signal_number(name) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"train.preempt_signal: got {name!r}, expected a signal name such as USR2, USR1, INT "
                          "or HUP (TERM is always caught), or none")


def _check_precision(cfg: Config) -> None:
    """Check train.precision against the device: fp16 autocast and its loss scaler need a GPU."""
    if cfg.train.precision != "fp16":
        return
    import torch

    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if not cuda:
        raise ConfigError(f"train.precision: got fp16 with device {cfg.device!r}"
                          f"{'' if cfg.device == 'cpu' else ' and no GPU'}, expected bf16 or fp32 on the CPU "
                          "(fp16 needs device cuda)")


def _check_augment(cfg: Config) -> None:
    """Check data.augment against the dataset: a crop and a flip need images."""
    d = cfg.data
    if d.augment == "none":
        return
    from psframework.data import image_shape
    from psframework.schemes.common import input_shape

    channels, height, width = image_shape(d)  # as stored: a model's resize does not make images of them
    if min(height, width) < 2:
        raise ConfigError(f"data.augment: got {d.augment!r} for data.dataset {d.dataset!r}, whose samples are "
                          f"{channels}x{height}x{width}, expected images of at least 2x2 pixels (or augment: none)")
    height, width = input_shape(cfg)[1:]
    if d.augment_padding >= min(height, width):
        raise ConfigError(f"data.augment_padding: got {d.augment_padding}, expected fewer pixels than the images' "
                          f"{height}x{width}")


def _check_geometry(cfg: Config) -> None:
    """Build the model on torch's meta device (no memory) and check that the scheme can place it."""
    from psframework.schemes.common import check_model

    try:
        check_model(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
