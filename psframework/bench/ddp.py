"""The data-parallel baseline of `psf bench peers`: torch DistributedDataParallel on a psframework config.

Run under mpiexec with one process per worker (code.n of the config), as a new user runs DDP:

    mpiexec -n 4 python -m mpi4py -m psframework.bench.ddp CONFIG RUN_DIR [KEY=VALUE ...]

Every process builds the config's model from the same seed, takes its contiguous shard of each global
batch in the config's data order (as `ps` workers do) and steps SGD after DDP has averaged the
gradients: gloo on the CPU, NCCL on GPUs. MPI only starts the processes and tells rank 0's address;
DDP's traffic is its own (MASTER_ADDR, when set, is rank 0's address; GLOO_SOCKET_IFNAME picks gloo's
interface). With `comm.emulate.bandwidth_gbps` every gradient bucket's allreduce also
waits, on the process's emulated link, for the bytes a ring allreduce sends per process
(2 (N - 1) / N of the bucket), while the backward pass goes on. Rank 0 writes RUN_DIR/metrics.jsonl
as it goes and RUN_DIR/summary.json at the end (the fields psf bench reads of a psframework run).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from psframework import environment
from psframework.fileio import atomic_write_json

if TYPE_CHECKING:
    from psframework.runtime.emulate import LinkEmulator

DDP_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
MASTER_ADDR = "MASTER_ADDR"  # rank 0's address for the rendezvous, where its host name does not resolve


def ring_bytes(nbytes: int, world: int) -> int:
    """Return the bytes one process sends in a ring allreduce of `nbytes` over `world` processes."""
    return 0 if world < 2 else 2 * (world - 1) * nbytes // world


def emulated_allreduce(emulator: "LinkEmulator", world: int) -> Any:
    """Return a DDP communication hook: average a bucket, and finish no earlier than the emulated link allows."""
    from psframework.runtime.emulate import sleep_until

    def hook(state, bucket):  # no annotations: DDP checks them, and this module's are strings
        tensor = bucket.buffer().div_(world)
        due = emulator(-1, None, ring_bytes(tensor.numel() * tensor.element_size(), world))
        work = dist.all_reduce(tensor, async_op=True).get_future()

        def finish(done: torch.futures.Future) -> torch.Tensor:
            sleep_until(due)  # on the communication thread: the backward pass goes on meanwhile
            return done.value()[0]

        return work.then(finish)

    return hook


def rendezvous(comm: Any) -> str:
    """Return a TCP address on rank 0 for torch.distributed, agreed among the MPI ranks (MASTER_ADDR if set)."""
    address = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        # MASTER_ADDR: rank 0's address where its host name resolves to none (hosts of hpc/netcluster)
        host = environment.get(MASTER_ADDR) or (socket.gethostname() if comm.Get_size() > 1 else "127.0.0.1")
        address = f"tcp://{socket.gethostbyname(host)}:{port}"
    return comm.bcast(address, root=0)


def train(settings: Any, comm: Any, run_dir: str) -> Optional[Dict[str, Any]]:
    """Train the config with DDP; return the summary on rank 0 (None elsewhere)."""
    from torch.nn.parallel import DistributedDataParallel

    from psframework.data import shard
    from psframework.runtime.emulate import link_emulator
    from psframework.runtime.threads import configure_threads
    from psframework.schemes.common import build_problem, iteration_plan, make_optimizer
    from psframework.schemes.driver import make_schedule

    rank, world = comm.Get_rank(), comm.Get_size()
    configure_threads(comm)  # the same share of the node's cores as a psframework rank
    device = "cuda" if settings.device == "cuda" else "cpu"
    dist.init_process_group(DDP_BACKENDS[device], init_method=rendezvous(comm), rank=rank, world_size=world)
    dataset, model = build_problem(settings)
    ddp = DistributedDataParallel(model)
    emulator = link_emulator(settings.transport.bandwidth_gbps, settings.transport.latency_us)
    if emulator is not None:
        ddp.register_comm_hook(None, emulated_allreduce(emulator, world))
    o = settings.optim
    optimizer = make_optimizer(list(ddp.parameters()), "sgd", o.lr, o.momentum, o.nesterov, o.weight_decay)
    schedule = make_schedule(settings, len(dataset.train))
    rows: List[Dict[str, Any]] = []
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") if rank == 0 else open(os.devnull, "w") as log:
        start = time.perf_counter()
        for step in iteration_plan(settings.data, len(dataset.train), 0, schedule.total):
            t0, cpu0 = time.perf_counter(), time.process_time()
            images, labels = dataset.train.fetch(shard(step.indices, rank, world))
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(images), labels)
            loss.backward()
            optimizer.step()
            row = {"iteration": step.iteration, "loss": float(loss.detach()), "iteration_s": time.perf_counter() - t0,
                   "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - start}
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
    summary = summarize(rows, comm, settings, model, emulator)
    # A process that frees DDP or its process group while a peer has already gone (or is stopped) can
    # wait in the teardown for ever, and rank 0 hosts the rendezvous store that the others still use:
    # the processes meet before the teardown and after it.
    comm.Barrier()
    del ddp
    dist.destroy_process_group()
    comm.Barrier()
    return summary


def summarize(rows: Sequence[Dict[str, Any]], comm: Any, settings: Any, model: torch.nn.Module,
              emulator: Optional["LinkEmulator"]) -> Optional[Dict[str, Any]]:
    """Return the run's summary on rank 0: iteration time, processor time of every process, bytes per process."""
    steady = list(rows[1:]) or list(rows)  # the first iteration is warm-up
    cpu = [sum(r["cpu_s"] for r in steady) / len(steady)]
    cpus = comm.gather(cpu[0], root=0)
    if comm.Get_rank() != 0:
        return None
    world = comm.Get_size()
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    per_process = ring_bytes(grads, world)
    return {"scheme": "ddp", "world_size": world, "n": world, "iterations": len(rows), "start_iteration": 0,
            "mean_iteration_s": sum(r["iteration_s"] for r in steady) / len(steady),
            "cpu_s_per_iteration": {"server": 0.0, "workers": sum(cpus), "total": sum(cpus)},
            "server_bytes_sent_per_iteration": per_process, "server_bytes_received_per_iteration": per_process,
            "final_loss": rows[-1]["loss"], "membership": [],
            "emulation": None if emulator is None else {"bandwidth_gbps": emulator.bandwidth_gbps,
                                                        "latency_us": emulator.latency_us,
                                                        "server_send_delay_s": emulator.delayed_s}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Train CONFIG with DDP into RUN_DIR; return the exit status."""
    from mpi4py import MPI

    from psframework.errors import ConfigError
    from psframework.schemes.validate import load_run, make_settings

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: mpiexec -n N python -m mpi4py -m psframework.bench.ddp CONFIG RUN_DIR [KEY=VALUE ...]",
              file=sys.stderr)
        return 2
    config, run_dir, overrides = args[0], args[1], args[2:]
    comm = MPI.COMM_WORLD
    try:
        settings = make_settings(load_run(config, list(overrides) + ["scheme=reference"]))
    except ConfigError as exc:
        if comm.Get_rank() == 0:
            print(f"psf: error: {exc}", file=sys.stderr)
        return 2
    summary = train(settings, comm, run_dir)
    if summary is not None:
        atomic_write_json(os.path.join(run_dir, "summary.json"), summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
