"""Checkpoints of rank 0's view of a run: the model, the scheme's state, the RNG and the position."""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import torch

from psframework.config import ConfigError
from psframework.fileio import atomic_write
from psframework.settings import Settings

FORMAT = 2


def save_checkpoint(path: str, iteration: int, model: torch.nn.Module, state: Dict[str, Any],
                    settings: Settings) -> None:
    """Write a checkpoint atomically (temporary name, then rename)."""
    payload = {"format": FORMAT, "scheme": settings.run.scheme, "iteration": int(iteration),
               "model": model.state_dict(), "state": state, "torch_rng": torch.get_rng_state(),
               "config": settings.config}
    atomic_write(path, lambda fh: torch.save(payload, fh), mode="wb")


def load_checkpoint(path: str, model: torch.nn.Module) -> Tuple[int, Dict[str, Any]]:
    """Restore the model and the RNG from a checkpoint; return (iteration, the scheme's state)."""
    if not os.path.isfile(path):
        raise ConfigError(f"train.resume: checkpoint file {path!r} does not exist")
    try:
        payload: Dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise ConfigError(f"train.resume: cannot read checkpoint {path!r} ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"train.resume: {path!r} is not a psframework checkpoint (format {FORMAT})")
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"train.resume: checkpoint {path!r} does not fit the configured model: {first}") from None
    torch.set_rng_state(payload["torch_rng"])
    return int(payload["iteration"]), payload["state"]
