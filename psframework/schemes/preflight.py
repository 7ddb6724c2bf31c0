"""Checks of a run against the machine it starts on, before anything is allocated.

The config checks (psframework.config) hold anywhere; these need the machine: the GPU a `device:
cuda` run asks for, the dataset directory, the checkpoint to resume from, the output directory and
enough memory for the model and the batch on each rank. `psf check --machine` runs them too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from psframework import environment
from psframework.config import FILE_DATASETS
from psframework.errors import ConfigError
from psframework.imports import is_import_path
from psframework.settings import Settings

FLOAT_BYTES = 4
PARAM_COPIES = 3  # weights, gradients and momentum (or Adam's moments: a little more)
ACTIVATION_COPIES = 2  # values kept for the backward pass and their gradients
SERVER, WORKER = "server", "worker"


def check_machine(settings: Settings, rank: int = 0) -> None:
    """Raise ConfigError when the machine cannot run `settings` (paths, GPU)."""
    check_paths(settings)
    check_device(settings.device, rank)


def check_device(device: str, rank: int = 0) -> None:
    """Raise ConfigError when `device: cuda` is asked for and torch sees no GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        import socket

        raise ConfigError(f"device: got 'cuda' but torch sees no CUDA device on rank {rank} (host "
                          f"{socket.gethostname()}); use cpu or auto")


def check_cuda_aware(setting: str, comm: Any) -> None:
    """Raise ConfigError when `comm.cuda_aware: true` is set and the MPI library says it is not CUDA-aware."""
    if setting != "true" or comm is None or comm.Get_size() == 1:  # one process moves no tensors through MPI
        return
    from psframework.comm.cuda import detect_cuda_aware, query_cuda_support

    found = detect_cuda_aware(comm)
    if not found.aware and query_cuda_support() is not None:  # the library answered: believe it
        raise ConfigError(f"comm.cuda_aware: got true, but the MPI library is not CUDA-aware ({found.method}); "
                          "use auto (device buffers are then staged through host memory) or false")


def check_paths(settings: Settings) -> None:
    """Raise ConfigError naming a dataset directory, checkpoint or output path that cannot serve."""
    data = settings.data
    # A built-in that reads no files (synthetic, digits) ignores data.root, so a config's root may stay set.
    if data.dataset in FILE_DATASETS or (data.root is not None and is_import_path(data.dataset)):
        expect_path("data.root", data.root, "the directory of the dataset's files", directory=True)
    if settings.run.resume not in (None, "auto"):  # auto: whatever the run directory holds, if anything
        expect_path("train.resume", settings.run.resume, "a checkpoint file")
    check_writable("output.dir", os.path.dirname(settings.run.run_dir) or ".")


def expect_path(key: str, path: str, what: str, directory: bool = False) -> None:
    """Raise ConfigError unless `path` is an existing directory (or regular file), naming what it is instead."""
    if os.path.isdir(path) if directory else os.path.isfile(path):
        return
    if os.path.exists(path):
        raise ConfigError(f"{key}: {path!r} is a {'file' if directory else 'directory'}, expected {what}")
    missing = f"directory {path!r} does not exist, expected {what}" if directory else f"{what} {path!r} does not exist"
    raise ConfigError(f"{key}: {missing}")


def check_writable(key: str, path: str) -> None:
    """Raise ConfigError unless a run directory can be made below `path` (made on demand)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(f"{key}: {path!r} lies below the file {probe!r}, expected a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: directory {probe!r} is not writable, expected a directory this user can write")


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes one rank needs: parameters (with gradients and momentum) and activations."""

    params: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.activations


def footprint(settings: Settings, role: str) -> Footprint:
    """Estimate the memory of a rank in `role` (server or worker; the single process is a server)."""
    from psframework.schemes.common import meta_model, placement_of
    from psframework.schemes.registry import get_scheme

    scheme = get_scheme(settings.run.scheme)
    model = meta_model(settings)
    placement = placement_of(settings, model)
    batch, n, k = settings.data.batch_size, settings.code.n, settings.code.k
    sizes = {key: p.numel() for key, p in model.named_parameters()}
    coded_params = sum(sizes[key] for key in placement.worker_parameter_names())
    head_params = sum(sizes[key] for key in placement.head)
    outputs = [math.prod(c.output_shape) for c in placement.calls]
    cut = len(outputs) if placement.cut is None else placement.cut
    if role == WORKER and scheme.coded:
        # Each worker holds a row- and a column-coded packet of every coded layer and its inputs and outputs.
        params = 2 * coded_params / k
        acts = batch * sum(math.prod(c.input_shape) + 2 * math.prod(c.output_shape) for c in placement.coded)
    elif role == WORKER:
        whole = scheme.worker_part == "model"
        params = sum(sizes.values()) - (0 if whole else head_params)
        acts = -(-batch // n) * (math.prod(placement.input_shape) + sum(outputs if whole else outputs[:cut]))
    else:
        params, acts = sum(sizes.values()), batch * (math.prod(placement.input_shape) + sum(outputs))
    return Footprint(int(FLOAT_BYTES * PARAM_COPIES * params), int(FLOAT_BYTES * ACTIVATION_COPIES * acts))


def available_memory() -> Optional[int]:
    """Return the bytes of memory available on this node (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def check_memory(settings: Settings, role: str) -> None:
    """Raise ConfigError when this rank's estimated memory exceeds its share of the node's memory."""
    need = footprint(settings, role)
    available = available_memory()
    if available is None:
        return
    local = environment.local_size_vars()
    ranks = local[0] if local else 1
    share = available // max(ranks, 1)
    if need.total > share:
        where = f"1/{ranks} of the {gib(available)} available on this node" if ranks > 1 else \
            f"the {gib(available)} available on this node"
        raise ConfigError(f"memory: a {role} rank of scheme {settings.run.scheme} needs about {gib(need.total)} "
                          f"(parameters {gib(need.params)}, activations {gib(need.activations)} for "
                          f"data.batch_size={settings.data.batch_size}), more than {where}; lower "
                          "data.batch_size or model.channels/model.fc, or use more nodes")


def gib(size: float) -> str:
    """Return a byte count in readable units."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"
