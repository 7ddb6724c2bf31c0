"""The scheme registry: the one list of training schemes and what each one needs.

An entry names the module that holds a scheme's server and worker sides, the erasure code of its
conv layers, its analytic byte model and the config rules that follow from how it works
(`Scheme.check`, applied by psframework.schemes.validate). Every other list of scheme names (the
command line, benchmarks) derives from here. A new scheme is one module plus one
`register(Scheme(...))` call.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from psframework.config import Config
from psframework.errors import ConfigError

LINEAR_OPTIMIZERS = ("sgd",)


class SchemeError(ConfigError):
    """A scheme name is unknown or a setting does not fit the scheme."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise SchemeError(message)


def worker_ranks(n: int, servers: int) -> List[int]:
    """Return the world ranks of the workers: G groups of one server and n workers, servers at g*(n+1)."""
    return [g * (n + 1) + 1 + j for g in range(servers) for j in range(n)]


def describe_ranks(ranks: Sequence[int]) -> str:
    """Return ranks as short text: 1..4, or 1..3, 5..7 for several groups."""
    runs: List[List[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs)


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
    # The workers encode and update coded weight copies: only a linear step keeps them exact.
    distributed_encoding_and_updating: bool = False
    k_equals_n: bool = False  # every worker is needed
    backup_workers: bool = False  # rank 0 may go on without the b slowest workers
    shards_batch: bool = False  # each worker computes on its own shard of the global batch
    worker_part: str = "trunk"  # what a data-parallel worker holds of the model: the "trunk" or the whole "model"
    cost_graph: Optional[str] = None  # "module:function" adding one iteration to psf plan's task graph
    proposed: bool = False  # psf plan proposes it (a real choice, not a baseline or an oracle)

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
        return self.mpi and (self.distributed_encoding_and_updating or self.cuts_model)

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

    def check(self, cfg: Config) -> None:
        """Raise SchemeError naming the first setting of `cfg` that does not fit how this scheme works."""
        c, t = cfg.code, cfg.train
        if self.k_equals_n:
            _require(c.k == c.n, f"code.k: got k={c.k} with n={c.n}, scheme {self.name} needs k = n")
        if self.distributed_encoding_and_updating:
            _require(t.optimizer in LINEAR_OPTIMIZERS,
                     f"train.optimizer: got {t.optimizer!r} for scheme {self.name}; coded conv layers need a "
                     "linear optimizer (sgd with momentum/nesterov/weight_decay) so that the coded weight "
                     "copies stay consistent")
        if t.backup_workers:
            self._check_backup_workers(cfg)
        if self.shards_batch:
            workers = c.n * t.servers
            who = (f"code.n={c.n} workers" if t.servers == 1
                   else f"{workers} workers (train.servers={t.servers} x code.n={c.n})")
            _require(cfg.data.batch_size >= workers,
                     f"data.batch_size: got {cfg.data.batch_size} with {who}, expected at least one "
                     f"sample per worker (batch_size >= {workers}); shards differ by at most one sample when the "
                     "workers do not divide it")
        self._check_servers(cfg)
        if self.mpi:
            workers = worker_ranks(c.n, t.servers)
            for r in cfg.stragglers.ranks:
                _require(r in workers,
                         f"stragglers.ranks: got rank {r}, expected worker ranks {describe_ranks(workers)}")
            _require(cfg.stragglers.count <= len(workers),
                     f"stragglers.count: got {cfg.stragglers.count}, expected <= {len(workers)} workers")

    def _check_backup_workers(self, cfg: Config) -> None:
        """Check train.backup_workers: only data-parallel schemes leave workers out, and never all of them."""
        c, t = cfg.code, cfg.train
        _require(self.backup_workers,
                 f"train.backup_workers: got {t.backup_workers} for scheme {self.name}; backup workers belong "
                 "to the data-parallel schemes, coded schemes tolerate n-k stragglers through code.k")
        if self.shards_parameters and t.servers > 1:
            workers, who = c.n * t.servers, f"{c.n * t.servers} workers (train.servers={t.servers} x code.n={c.n})"
        else:
            workers, who = c.n, f"code.n={c.n}"
        _require(t.backup_workers < workers,
                 f"train.backup_workers: got {t.backup_workers} with {who}, expected 0 <= backup_workers < "
                 f"{'n' if workers == c.n else workers} (at least one worker's result is needed each round)")

    def _check_servers(self, cfg: Config) -> None:
        """Check train.servers: several servers need an MPI scheme, enough batch and the scheme's optimizers."""
        g, t = cfg.train.servers, cfg.train
        if g == 1:
            return
        _require(self.mpi, f"train.servers: got {g} for scheme {self.name}, which runs in one process; "
                 "expected 1 (several servers belong to the MPI schemes)")
        _require(cfg.data.batch_size >= g, f"data.batch_size: got {cfg.data.batch_size} with train.servers={g}, "
                 f"expected at least one sample per server (batch_size >= {g})")
        if self.workers_sum_across_groups and not self.coded:
            _require(t.backup_workers == 0, f"train.backup_workers: got {t.backup_workers} with "
                     f"train.servers={g}; scheme {self.name}'s workers sum their conv gradients over every worker "
                     "each iteration, so every worker is needed (backup workers need train.servers=1)")
            _require(t.optimizer == "sgd", f"train.optimizer: got {t.optimizer!r} with train.servers={g}; scheme "
                     f"{self.name}'s workers step the conv stack themselves with sgd (head_optimizer may differ)")
        if self.shards_parameters:
            for key in ("optimizer", "head_optimizer"):
                value = getattr(t, key)
                _require(value in (None, "sgd"), f"train.{key}: got {value!r} with train.servers={g}; scheme "
                         f"{self.name}'s servers step their parameter shards with sgd")

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


_CODED = dict(module="psframework.schemes.coded.server", server="DecodingServerSide",
              worker="psframework.schemes.coded.worker:EncodingWorkerSide",
              group_worker="psframework.schemes.coded.worker:GroupEncodingWorkerSide",
              byte_model="psframework.schemes.coded.exchange:expected_server_bytes",
              sync_model="expected_sync_bytes", distributed_encoding_and_updating=True,
              cost_graph="psframework.plan.graphs:coded_iteration")
_PARALLEL = dict(byte_model="expected_server_bytes", backup_workers=True, shards_batch=True, proposed=True)

register(Scheme("reference", "one process, whole model: the correctness oracle",
                "psframework.schemes.reference", "ReferenceTrainer"))
register(Scheme("ps", "parameter server: whole model replicated on the workers, data parallel",
                "psframework.schemes.ps", "PSServer", "PSWorker", group_server="ShardedPSServer", worker_part="model",
                sync_model="expected_sync_bytes", cost_graph="psframework.plan.graphs:ps_iteration", **_PARALLEL))
register(Scheme("stanza", "layer separation: conv stack on the workers (data parallel), FC head on rank 0",
                "psframework.schemes.stanza", "StanzaServer", "StanzaWorker",
                group_server="GroupStanzaServer", group_worker="GroupStanzaWorker",
                group_byte_model="expected_group_server_bytes", sync_model="expected_sync_bytes",
                cost_graph="psframework.plan.graphs:stanza_iteration", **_PARALLEL))
register(Scheme("sazd", "SA-coded conv layers with distributed encoding and updating; any k of n",
                code="shift-add", proposed=True, **_CODED))
register(Scheme("sazd-naive", "SA-coded conv layers; rank 0 encodes, ships coded weights and updates",
                "psframework.schemes.coded.naive", "EncodingServerSide", "StatelessWorkerSide", code="shift-add",
                sync_model="expected_sync_bytes"))
register(Scheme("poly", "polynomial (real Vandermonde) coded conv layers; any k of n", code="polynomial", **_CODED))
register(Scheme("uncoded", "plain model parallel conv layers; every worker needed", code="split",
                k_equals_n=True, **_CODED))
