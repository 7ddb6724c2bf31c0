"""Train a torch module you already have, from Python, with any scheme.

    import psframework
    summary = psframework.train_module(MyNet(), "configs/digits_sazd.yaml", ["train.epochs=2"])

Launch the script on every rank as any MPI job, for example
`mpiexec -n 5 python -m mpi4py my_script.py` (an error on any rank then ends the whole job).
Every rank passes its own instance of the same network; rank 0 trains its instance in place and
returns the run's summary, the other ranks return None.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Protocol, Sequence

from torch import nn

from psframework.errors import ConfigError
from psframework.models.zoo import GIVEN_PREFIX, give
from psframework.schemes.validate import load_run, make_settings


def train_module(model: nn.Module, config: Optional[str] = None, overrides: Sequence[str] = (),
                 comm: Any = None) -> Optional[Dict[str, Any]]:
    """Train `model` as the config file (None: the defaults) and `key=value` overrides describe.

    The config's model section is replaced by `model` (model.input_size still resizes the images).
    `comm` is the mpi4py communicator the job runs on (None: every rank of the world).
    Raises ConfigError for a bad config or a model the scheme cannot place; returns the summary on rank 0.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"train_module: got a {type(model).__name__}, expected a torch.nn.Module")
    name = give(model)
    cfg = load_run(config, [*overrides, f"model.name={name}", "model.args={}"])
    from psframework.schemes.entry import train
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


class ModelFactory(Protocol):
    """Build the model a config names: `model.name: package.module:function` or `path/to/file.py:function`.

    The function is called with `model.args` as keywords, plus `num_classes` (the dataset's class
    count) when its signature names it or takes `**kwargs`, and `in_channels` (the images' channels)
    only when its signature names it. It returns a `torch.nn.Module` whose first convolution takes
    the data's channels and whose output has one score per class. Every torchvision classification
    model is one: `model.name: torchvision.models:resnet18`.
    """

    def __call__(self, **kwargs: Any) -> nn.Module:
        ...


class DatasetFactory(Protocol):
    """Build the data a config names: `data.dataset: package.module:function` or `path/to/file.py:function`.

    The function is called with `data.args` as keywords and returns `(train, test)` or
    `(train, test, num_classes)`. Each split is an `(images (N, C, H, W), labels (N,))` pair of
    tensors or arrays, held in memory, or a map-style `torch.utils.data.Dataset` of
    `(image (C, H, W), label)` items, streamed in the order the run's plan fixes (every sample of
    one shape). The class count is `num_classes`, else `len(train.classes)`, else the largest
    label + 1 of data held in memory.
    """

    def __call__(self, **kwargs: Any) -> Any:
        ...


__all__ = ["GIVEN_PREFIX", "DatasetFactory", "ModelFactory", "train_module"]
