"""Train a torch module you already have, from Python, with any scheme.

    import psframework
    summary = psframework.train_module(MyNet(), "configs/digits_sazd.yaml", ["train.epochs=2"])

Under MPI every rank runs the same script and so passes its own instance of the same network; rank
0 trains its instance in place and returns the run's summary, the other ranks return None.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from torch import nn

from psframework.errors import ConfigError
from psframework.models.zoo import GIVEN_PREFIX, give
from psframework.schemes.validate import load_run, make_settings


def train_module(model: nn.Module, config: Optional[str] = None, overrides: Sequence[str] = (),
                 comm: Any = None) -> Optional[Dict[str, Any]]:
    """Train `model` as the config file (None: the defaults) and `key=value` overrides describe.

    The config's model section is replaced by `model` (model.input_size still resizes the images).
    Raises ConfigError for a bad config or a model the scheme cannot place; returns the summary on rank 0.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"train_module: got a {type(model).__name__}, expected a torch.nn.Module")
    name = give(model)
    cfg = load_run(config, [*overrides, f"model.name={name}", "model.args={}"])
    from psframework.schemes import train
    from psframework.runtime.world import mpi_world
    from psframework.schemes.startup import RunEnds

    rank, size, world = mpi_world()
    comm = world if comm is None else comm
    settings = make_settings(cfg, world_size=size if comm is None else comm.Get_size())
    try:
        return train(settings, comm=comm)
    except RunEnds as exc:
        if exc.status:
            raise ConfigError(str(exc)) from None
        return None


__all__ = ["GIVEN_PREFIX", "train_module"]
