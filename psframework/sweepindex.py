"""A sweep's index (sweep.json): its config, overrides and points, and the point a `psf train sweep.json` runs.

`psf sweep` writes the index; `psf train`, the srun launcher and a Slurm array task read it back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from psframework import environment
from psframework.errors import ConfigError
from psframework.fileio import atomic_write_json

INDEX = "sweep.json"


@dataclass
class Point:
    """One run of a sweep: its overrides, its directory (relative to the sweep's) and its MPI world size."""

    name: str
    overrides: List[str]
    seed: Optional[int]
    dir: str
    world_size: int


@dataclass
class Sweep:
    """A sweep's index: the config, the overrides every point shares, the grid and its points."""

    sweep: str
    config: str
    overrides: List[str]
    grid: Dict[str, List[str]]
    repeat: int
    points: List[Point] = field(default_factory=list)


def read_sweep(path: str) -> Sweep:
    """Read a sweep index; raise ConfigError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        points = [Point(**p) for p in raw.pop("points")]
        return Sweep(**raw, points=points)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a sweep index psf sweep wrote ({type(exc).__name__}: {exc})") from None


def point_arguments(config: str, overrides: Sequence[str],
                    env: Optional[Mapping[str, str]] = None) -> Tuple[str, List[str]]:
    """Return (config, overrides) of a `psf train` call: a sweep index runs the point environment.sweep_point names."""
    if os.path.basename(config) != INDEX:
        return config, list(overrides)
    sweep = read_sweep(config)
    chosen = environment.sweep_point(env)
    if chosen is None:
        raise ConfigError(f"{config}: a sweep index runs one point: set PSF_SWEEP_POINT (or run it as a Slurm "
                          f"array task) to 0..{len(sweep.points) - 1}")
    if not chosen.isdigit() or int(chosen) >= len(sweep.points):
        raise ConfigError(f"{config}: point {chosen!r} does not exist, expected 0..{len(sweep.points) - 1}")
    point = sweep.points[int(chosen)]
    where = [f"output.dir={os.path.dirname(os.path.abspath(config))}", f"name={point.dir}", "train.resume=auto"]
    return sweep.config, sweep.overrides + point.overrides + where + list(overrides)


def write_index(sweep_dir: str, sweep: Sweep) -> str:
    """Write (or keep) the sweep's index; raise ConfigError if the directory holds another sweep."""
    path = os.path.join(sweep_dir, INDEX)
    if os.path.exists(path):
        old = read_sweep(path)
        if asdict(old) != asdict(sweep):
            raise ConfigError(f"psf sweep: {sweep_dir} holds a sweep of other settings (config, overrides or grid); "
                              "choose another --name or remove it")
        return path
    os.makedirs(sweep_dir, exist_ok=True)
    atomic_write_json(path, asdict(sweep))
    return path
