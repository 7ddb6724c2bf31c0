"""Checkpoints of the server's view of a run: decoded conv weights and momentum, head, RNG, position."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from psframework.config import Config, ConfigError
from psframework.fileio import atomic_write

FORMAT = 1


def save_checkpoint(path: str, iteration: int, model: torch.nn.Module,
                    conv_momentum: Optional[List[Dict[str, torch.Tensor]]],
                    head_optimizer: torch.optim.Optimizer, post_optimizer: Optional[torch.optim.Optimizer],
                    cfg: Config) -> None:
    """Write a checkpoint atomically (temporary name, then rename)."""
    momentum = None
    if conv_momentum is not None:
        momentum = [{"weight_momentum": m["weight_momentum"].clone(), "bias_momentum": m["bias_momentum"].clone()}
                    for m in conv_momentum]
    state = {
        "format": FORMAT, "scheme": cfg.scheme, "iteration": int(iteration),
        "model": model.state_dict(), "conv_momentum": momentum,
        "head_optimizer": head_optimizer.state_dict(),
        "post_optimizer": None if post_optimizer is None else post_optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(), "config": cfg.to_dict(),
    }
    atomic_write(path, lambda fh: torch.save(state, fh), mode="wb")


def load_checkpoint(path: str, model: torch.nn.Module, head_optimizer: torch.optim.Optimizer,
                    post_optimizer: Optional[torch.optim.Optimizer]
                    ) -> Tuple[int, Optional[List[Dict[str, torch.Tensor]]]]:
    """Restore a checkpoint into the model and optimizers; return (iteration, conv momentum)."""
    if not os.path.isfile(path):
        raise ConfigError(f"train.resume: checkpoint file {path!r} does not exist")
    try:
        state: Dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise ConfigError(f"train.resume: cannot read checkpoint {path!r} ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"train.resume: {path!r} is not a psframework checkpoint (format {FORMAT})")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"train.resume: checkpoint {path!r} does not fit the configured model: {first}") from None
    head_optimizer.load_state_dict(state["head_optimizer"])
    if post_optimizer is not None and state["post_optimizer"] is not None:
        post_optimizer.load_state_dict(state["post_optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["iteration"]), state["conv_momentum"]
