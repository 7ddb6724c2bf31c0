"""What every MPI scheme's ranks share: transports (with network emulation), worker reports, straggler sleeps."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from psframework.codes.threads import ENV_VAR as DECODE_THREADS_ENV, set_decode_threads
from psframework.config import Config


def make_transports(cfg: Config, comm: Any = None, peers: bool = False) -> Tuple[Any, Any, Any]:
    """Return (roles, transport to every rank, worker-to-worker transport or None).

    `comm.emulate` makes every transport hold messages back as a slower network link would.
    """
    from psframework.comm import Transport, configure_threads, link_emulator, setup_roles

    roles = setup_roles(comm)
    plan = configure_threads(roles.comm, threads=cfg.comm.threads or None)
    if not os.environ.get(DECODE_THREADS_ENV):  # decoding shares this rank's cores like torch and BLAS do
        set_decode_threads(plan.threads)
    emulate = cfg.comm.emulate

    def transport(on: Any) -> Any:
        return Transport(on, cuda_aware=cfg.comm.cuda_aware, timeout_s=cfg.comm.timeout_s,
                         send_hook=link_emulator(emulate.bandwidth_gbps, emulate.latency_us))

    world = transport(roles.comm)
    worker_peers = transport(roles.workers_comm) if (peers and roles.is_worker) else None
    return roles, world, worker_peers


def emulation_summary(cfg: Config, transport: Any) -> Optional[Dict[str, float]]:
    """Return the emulated link settings and how long rank 0's sends were held back, or None when off."""
    hook = transport.send_hook
    if hook is None:
        return None
    return {"bandwidth_gbps": cfg.comm.emulate.bandwidth_gbps, "latency_us": cfg.comm.emulate.latency_us,
            "server_send_delay_s": hook.delayed_s}


class WorkerStats:
    """What a worker reports when it stops."""

    FIELDS = ("replies_sent", "replies_skipped", "max_behind", "compute_s", "delay_s", "updates")

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0.0)
        self.behind = 0

    def sent(self) -> None:
        """Count a reply sent: the worker is up to date again."""
        self.values["replies_sent"] += 1
        self.behind = 0

    def skipped(self) -> None:
        """Count a reply skipped because the server had already moved on."""
        self.values["replies_skipped"] += 1
        self.behind += 1
        self.values["max_behind"] = max(self.values["max_behind"], self.behind)

    def vector(self) -> torch.Tensor:
        return torch.tensor([self.values[f] for f in self.FIELDS], dtype=torch.float64)

    @classmethod
    def from_vector(cls, vector: Sequence[float]) -> Dict[str, float]:
        """Return a report received from a worker as {field: value}."""
        return dict(zip(cls.FIELDS, vector))


def straggle(stragglers: Any, rank: int, iteration: int, compute_s: float,
             keep_moving: Sequence[Callable[[], Any]]) -> float:
    """Sleep as an injected straggler would and return the delay; messages keep moving meanwhile.

    Only compute is slow: `keep_moving` (progress functions) run between short naps.
    """
    def sleep(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > 0:
            for progress in keep_moving:
                progress()
            time.sleep(min(left, 1e-3))

    return stragglers.inject(rank, iteration, compute_s, sleep=sleep)


def stop_envelope(total: int) -> Any:
    """Return the envelope of the stop command (and of the worker's report that answers it)."""
    from psframework.comm import Envelope, Kind, Phase

    return Envelope(Kind.CONTROL, total, 2, Phase.OTHER)


def stop_workers(transport: Any, workers: Sequence[int], total: int) -> Dict[str, Dict[str, float]]:
    """Tell every worker to stop; return their reports {rank: {field: value}}."""
    env = stop_envelope(total)
    gather = transport.post_gather(workers, env)
    for rank in workers:
        transport.isend(rank, torch.zeros(1), env)
    result = gather.wait(len(workers))
    return {str(rank): WorkerStats.from_vector(result.data[rank].tolist()) for rank in workers}


def answer_stop(inbox: Any, transport: Any, total: int, stats: WorkerStats) -> None:
    """Take the stop command and send the server this worker's report."""
    env = stop_envelope(total)
    inbox.take(env)
    transport.send(0, stats.vector(), env)


def finish_server(cfg: Config, transport: Any, workers: Sequence[int], recorder: Any, progress: Any,
                  fields: Dict[str, Any]) -> Dict[str, Any]:
    """Stop the workers, close rank 0's transport and write the summary: the shared fields, then `fields`.

    `fields` holds at least iterations, final_test_accuracy and the scheme's own entries.
    """
    worker_stats = stop_workers(transport, workers, fields["iterations"])
    report = transport.close(timeout_s=1.0)
    stats = transport.stats
    summary = recorder.finish({
        "scheme": cfg.scheme, "name": cfg.name, "world_size": transport.size, **fields,
        "mean_iteration_s": recorder.mean("iteration_s", skip=1),
        "mean_wait_s": recorder.mean("wait_s", skip=1),
        "server_bytes_sent": stats.sent_bytes, "server_bytes_received": stats.received_bytes,
        "server_bytes_sent_per_iteration": recorder.mean("bytes_sent", skip=1),
        "server_bytes_received_per_iteration": recorder.mean("bytes_received", skip=1),
        "late_replies_drained": stats.late_drained + report.completed,
        "emulation": emulation_summary(cfg, transport),
        "workers": worker_stats,
    })
    progress.message(f"psf: done: test accuracy {summary['final_test_accuracy']:.4f}, {summary['wall_s']:.1f} s, "
                     f"mean iteration {summary['mean_iteration_s'] * 1e3:.1f} ms, outputs in {cfg.run_dir}")
    return summary
