"""The scheme registry: the one list of training schemes and what each one needs.

An entry names the module that holds a scheme's server and worker sides, the erasure code of its
conv layers, its analytic byte model and the config rules that follow from how it works. Every
other list of scheme names (config checks, the command line, benchmarks) derives from here. A new
scheme is one module plus one `register(Scheme(...))` call.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from psframework.config import ConfigError


class SchemeError(ConfigError):
    """A scheme name is unknown or a setting does not fit the scheme."""


@dataclass(frozen=True)
class Scheme:
    """One training scheme: where its parts live and which settings it accepts."""

    name: str
    summary: str
    module: str  # import path of the module with the classes below
    server: str  # class of rank 0's side (the whole run, for a single-process scheme)
    worker: Optional[str] = None  # class of ranks 1..n; None: the scheme runs in one process
    group_server: Optional[str] = None  # class of every server's side with several servers (default: `server`)
    group_worker: Optional[str] = None  # class of the workers' side with several servers (default: `worker`)
    code: Optional[str] = None  # erasure code of the conv layers: a kind of psframework.codes.make_code
    byte_model: Optional[str] = None  # "module:function" (settings, model, placement, group) -> bytes (sent, received)
    group_byte_model: Optional[str] = None  # the byte model with several servers (default: `byte_model`)
    sync_model: Optional[str] = None  # "module:function" (settings, model, placement) -> bytes summed among servers
    linear_conv_optimizer: bool = False  # workers keep coded weight copies: only a linear step keeps them exact
    k_equals_n: bool = False  # every worker is needed
    backup_workers: bool = False  # rank 0 may go on without the b slowest workers
    shards_batch: bool = False  # each worker computes on its own shard of the global batch
    worker_part: str = "trunk"  # what a data-parallel worker holds of the model: the "trunk" or the whole "model"

    @property
    def mpi(self) -> bool:
        """Return whether the scheme runs under MPI with a server and n workers."""
        return self.worker is not None

    @property
    def cuts_model(self) -> bool:
        """Return whether the scheme cuts the model into a trunk on the workers and a head on rank 0."""
        return self.mpi and not self.coded and self.worker_part == "trunk"

    @property
    def shards_parameters(self) -> bool:
        """Return whether, with several servers, each server holds one shard of the parameters (every
        worker pushes to and pulls from every server) instead of leading a group."""
        return self.mpi and not self.coded and self.worker_part == "model"

    @property
    def workers_sum_across_groups(self) -> bool:
        """Return whether, with several servers, the workers keep state that they sum across the groups
        (DEU coded weights, Stanza's conv stack): they move in step, none is detached or left out."""
        return self.mpi and (self.linear_conv_optimizer or self.cuts_model)

    @property
    def coded(self) -> bool:
        """Return whether the scheme codes its conv layers across the workers."""
        return self.code is not None

    def sides(self, servers: int) -> Tuple[str, Optional[str]]:
        """Return the classes of the server's and the workers' sides of a run with `servers` servers."""
        if servers > 1:
            return self.group_server or self.server, self.group_worker or self.worker
        return self.server, self.worker

    def load(self, attribute: str) -> Any:
        """Return an attribute (class or function) of the scheme's module, or of "module:attribute"."""
        module, _, name = attribute.rpartition(":")
        return getattr(importlib.import_module(module or self.module), name)

    def expected_server_bytes(self, settings: Any, model: Any, placement: Any,
                              group: int = 0) -> Optional[Tuple[int, int]]:
        """Return the analytic (sent, received) payload bytes per iteration between a group's server and the
        workers (group 0: rank 0), or None without a byte model."""
        byte_model = self.byte_model
        if settings.run.servers > 1 and self.group_byte_model:
            byte_model = self.group_byte_model
        if byte_model is None:
            return None
        return self.load(byte_model)(settings, model, placement, group)

    def expected_sync_bytes(self, settings: Any, model: Any, placement: Any) -> int:
        """Return the analytic payload bytes each server sums with the other servers per iteration (0 with one)."""
        if settings.run.servers == 1 or self.sync_model is None:
            return 0
        return self.load(self.sync_model)(settings, model, placement)

    def world_size(self, n: int, servers: int = 1) -> int:
        """Return how many MPI processes the scheme needs for `servers` groups of one server and n workers."""
        return servers * (n + 1) if self.mpi else 1

    def check_world(self, n: int, world_size: int, servers: int = 1) -> None:
        """Raise SchemeError unless the communicator's size fits the servers and their n workers each."""
        want = self.world_size(n, servers)
        if world_size == want:
            return
        if not self.mpi:
            raise SchemeError(f"world size {world_size}: scheme {self.name} runs in one process, "
                              f"not under mpiexec -n {world_size}")
        if servers > 1:
            raise SchemeError(f"world size {world_size} does not fit train.servers={servers} with code.n={n}: "
                              f"scheme {self.name} needs G*(n+1) = {want} ranks ({servers} groups of 1 server + {n} "
                              f"workers); launch with mpiexec -n {want}")
        other = f" or set code.n={world_size - 1}" if world_size > 1 else ""
        raise SchemeError(f"world size {world_size} does not fit code.n={n}: scheme {self.name} needs n+1 = {want} "
                          f"ranks (1 server + {n} workers); launch with mpiexec -n {want}{other}")


def world_size_of(cfg: Any) -> int:
    """Return how many MPI processes a config's run needs."""
    return get_scheme(cfg.scheme).world_size(cfg.code.n, cfg.train.servers)


_REGISTRY: Dict[str, Scheme] = {}


def register(scheme: Scheme) -> Scheme:
    """Add a scheme to the registry (or replace one of the same name); return it."""
    _REGISTRY[scheme.name] = scheme
    return scheme


def scheme_names() -> Tuple[str, ...]:
    """Return the names of every registered scheme, in registration order."""
    return tuple(_REGISTRY)


def get_scheme(name: str) -> Scheme:
    """Return the registered scheme called `name`; SchemeError with a did-you-mean otherwise."""
    scheme = _REGISTRY.get(name)
    if scheme is None:
        import difflib

        hint = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise SchemeError(f"scheme: got {name!r}, expected one of {', '.join(_REGISTRY)}{extra}")
    return scheme


_CODED_SYNC = "psframework.schemes.coded_parts:expected_sync_bytes"
_CODED = dict(module="psframework.schemes.coded", server="CodedServerSide", worker="CodedWorkerSide",
              byte_model="psframework.schemes.coded_parts:expected_server_bytes", sync_model=_CODED_SYNC,
              linear_conv_optimizer=True)
_PARALLEL = dict(byte_model="expected_server_bytes", backup_workers=True, shards_batch=True)

register(Scheme("reference", "one process, whole model: the correctness oracle",
                "psframework.schemes.reference", "ReferenceTrainer"))
register(Scheme("ps", "parameter server: whole model replicated on the workers, data parallel",
                "psframework.schemes.ps", "PSServer", "PSWorker", group_server="ShardedPSServer", worker_part="model",
                sync_model="expected_sync_bytes", **_PARALLEL))
register(Scheme("stanza", "layer separation: conv stack on the workers (data parallel), FC head on rank 0",
                "psframework.schemes.stanza", "StanzaServer", "StanzaWorker",
                group_server="GroupStanzaServer", group_worker="GroupStanzaWorker",
                group_byte_model="expected_group_server_bytes", sync_model="expected_sync_bytes",
                **_PARALLEL))
register(Scheme("sazd", "SA-coded conv layers with distributed encoding and updating; any k of n",
                code="shift-add", **_CODED))
register(Scheme("sazd-naive", "SA-coded conv layers; rank 0 encodes, ships coded weights and updates",
                "psframework.schemes.sazd_naive", "NaiveServerSide", "NaiveWorkerSide", code="shift-add",
                sync_model=_CODED_SYNC))
register(Scheme("poly", "polynomial (real Vandermonde) coded conv layers; any k of n", code="polynomial", **_CODED))
register(Scheme("uncoded", "plain model parallel conv layers; every worker needed", code="split",
                k_equals_n=True, **_CODED))
