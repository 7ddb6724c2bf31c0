"""Command line: psf train | check | model-info | bench | doctor | sweep | report."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from psframework import __version__, environment
from psframework.cliparse import EXIT_USAGE, Parser
from psframework.config import dump_config
from psframework.errors import ConfigError
from psframework.data import DatasetError
from psframework.runtime.world import FirstError, mpi_world
from psframework.schemes.validate import load_run, make_settings
from psframework.sweepindex import point_arguments

if TYPE_CHECKING:
    from psframework.runtime.preempt import Preempted

EXIT_FAILURE = 1
BENCHMARKS = {
    "codec": "psframework.bench.codec",
    "comm": "psframework.bench.comm",
    "peers": "psframework.bench.peers",
    "plan": "psframework.plan.validate",
    "scaleout": "psframework.bench.scaleout",
    "schemes": "psframework.bench.schemes",
    "stragglers": "psframework.bench.stragglers",
}

OWN_PARSERS = {"sweep": "psframework.sweep", "report": "psframework.report", "plan": "psframework.plan.cli"}


ABORT_GRACE_S = 0.5  # for the process manager to forward the error line before the abort ends every rank


def _abort(comm: Any, status: int) -> None:
    """Abort the whole job with `status`, once the error line just printed has had time to leave.

    MPI_Abort makes the process manager end every process at once: on a busy node it could end the
    one that forwards this rank's output before it read the line, and the job would fail in silence.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.Abort(status)


def _fail_alone(comm: Any, errors: Optional[FirstError], line: str, status: int) -> int:
    """Print the error line of a failure this rank may be alone to see, unless another rank saw one first,
    and abort the job (the one that prints aborts first: the others wait for its line to leave)."""
    first = errors is None or errors.first()
    if first:
        print(line, file=sys.stderr, flush=True)
    if errors is not None:
        if not first:
            time.sleep(2 * ABORT_GRACE_S)
        _abort(comm, status)
    return status


def _fail(message: str, rank: int = 0) -> int:
    """Print one error line (on rank 0 only) and return the usage exit status."""
    if rank == 0:
        print(f"psf: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def _end_cleanly(comm: object, status: int) -> int:
    """Finalize MPI before returning `status`: every rank agreed to stop, so no MPI_Abort (and its extra lines).

    Only in a process the MPI launcher started: a caller that imported mpi4py itself keeps its MPI.
    """
    if comm is not None and environment.launched_by_mpi():
        from mpi4py import MPI

        MPI.Finalize()
    return status


def cmd_train(args: argparse.Namespace) -> int:
    try:
        rank, size, comm = mpi_world()
    except ValueError as exc:  # a malformed environment variable, named in the message
        return _fail(str(exc))
    try:
        config, overrides = point_arguments(args.config, args.overrides)
        settings = make_settings(load_run(config, overrides), world_size=size)
    except (ConfigError, DatasetError) as exc:
        # Every rank reads the same config and fails the same way: one line, then a clean exit.
        return _end_cleanly(comm, _fail(str(exc), rank))
    from psframework.schemes.entry import train

    from psframework.comm.errors import TooFewWorkers, WatchdogTimeout
    from psframework.runtime.node import RANK_LOSS, leave_word_of_loss
    from psframework.runtime.preempt import Preempted
    from psframework.schemes.startup import RunEnds

    errors = FirstError(comm, ABORT_GRACE_S) if comm is not None and size > 1 else None
    try:
        train(settings, comm=comm)
    except Preempted as exc:
        return _end_preempted(comm, rank, exc, settings.run.preempt_signal, settings.run.max_requeues)
    except RunEnds as exc:
        # Every rank agreed to end here: one line from rank 0, then a clean exit everywhere.
        if rank == 0:
            print(f"psf: error: {exc}" if exc.status else str(exc), file=sys.stderr if exc.status else sys.stdout,
                  flush=True)
        return _end_cleanly(comm, exc.status)
    except (ConfigError, DatasetError) as exc:
        # Only this rank may have failed: report it and abort the job so that no rank hangs.
        return _fail_alone(comm, errors, f"psf: error: {exc}", EXIT_USAGE)
    except (WatchdogTimeout, TooFewWorkers) as exc:
        return _fail_alone(comm, errors, f"psf: error: rank {rank}: {exc}; {last_checkpoint(settings.run.run_dir)}",
                           EXIT_FAILURE)
    if RANK_LOSS():
        # A rank of the job died: MPI_Finalize would wait for it for ever, so leave without it.
        if rank == 0:
            leave_word_of_loss(RANK_LOSS)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _end_preempted(comm: object, rank: int, stopped: "Preempted", preempt_signal: str, max_requeues: int) -> int:
    """Leave MPI after a preemption; rank 0 then says where the run stopped and asks Slurm to requeue it."""
    from psframework.runtime.preempt import EXIT_PREEMPTED, after_stop

    _end_cleanly(comm, EXIT_PREEMPTED)
    if rank == 0:
        done = after_stop(stopped.signal_name, preempt_signal, os.environ, max_requeues)
        print(f"psf: {stopped}: checkpoint {stopped.checkpoint}; {done}", file=sys.stderr, flush=True)
    return EXIT_PREEMPTED


def last_checkpoint(run_dir: str) -> str:
    """Return where a run can be resumed from, in words."""
    path = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.exists(path):
        return f"no checkpoint in {run_dir} yet"
    return f"the last checkpoint is {path} (train.resume={path} goes on from it)"


def cmd_check(args: argparse.Namespace) -> int:
    try:
        cfg = load_run(args.config, args.overrides)
        settings = make_settings(cfg, world_size=args.world_size)
        if args.machine:
            from psframework.schemes.preflight import SERVER, WORKER, check_machine, check_memory

            check_machine(settings)
            for role in (SERVER, WORKER):
                check_memory(settings, role)
    except ConfigError as exc:
        return _fail(str(exc))
    sys.stdout.write(ranks_line(cfg) + dump_config(cfg))
    return 0


def ranks_line(cfg: Any) -> str:
    """Return the YAML comment that says how many MPI ranks the run needs, and how they divide."""
    from psframework.schemes.registry import get_scheme, world_size_of

    if not get_scheme(cfg.scheme).mpi:
        return "# MPI ranks: 1 (one process)\n"
    g, n = cfg.train.servers, cfg.code.n
    groups = f"{g} x " if g > 1 else ""
    return f"# MPI ranks: {world_size_of(cfg)} = {groups}(1 server + {n} workers)\n"


def cmd_model_info(args: argparse.Namespace) -> int:
    try:
        from psframework.schemes.model_info import model_info

        lines = model_info(load_run(args.config, args.overrides))
    except ConfigError as exc:
        return _fail(str(exc))
    print("\n".join(lines))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHMARKS[args.benchmark])
    return int(module.main(args.rest) or 0)


def cmd_doctor(args: argparse.Namespace) -> int:
    from psframework import doctor

    return int(doctor.main(args.rest) or 0)


def cmd_sweep(args: argparse.Namespace) -> int:
    from psframework import sweep

    return int(sweep.main(args.rest) or 0)


def cmd_report(args: argparse.Namespace) -> int:
    from psframework import report

    return int(report.main(args.rest) or 0)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the `psf` command."""
    parser = Parser(prog="psf", description="Straggler-tolerant MPI parameter-server training for CNNs "
                    "(Stanza layer separation, SAZD coded training).")
    parser.add_argument("--version", action="version", version=f"psframework {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("config", help="YAML experiment file")
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="dotted overrides such as train.lr=0.1 code.n=6")
        return p

    p = with_config("train", "train a model as the config says (MPI schemes under mpiexec)")
    p.set_defaults(func=cmd_train)
    p = with_config("check", "validate a config and print it resolved")
    p.add_argument("--world-size", type=int, default=None,
                   help="also check the config against this MPI world size")
    p.add_argument("--machine", action="store_true",
                   help="also check this machine: the GPU for device cuda, dataset and output paths, memory")
    p.set_defaults(func=cmd_check)
    p = with_config("model-info", "print per-layer parameters and activation sizes")
    p.set_defaults(func=cmd_model_info)
    p = sub.add_parser("bench", help="run a benchmark and write its report",
                       description="run a benchmark; arguments after its name go to the benchmark")
    p.add_argument("benchmark", choices=sorted(BENCHMARKS))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options (see psf bench NAME --help)")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("doctor", help="print the MPI, thread, GPU and binding set-up")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("sweep", help="run a grid of overrides over a config, locally or as a Slurm job array",
                       description="run a grid of overrides over a config (see psf sweep --help)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="CONFIG [KEY=VALUE ...] --grid KEY=V1,V2 ... [--slurm]")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("plan", help="predict every scheme on a cluster and recommend one (psf plan calibrate: profile)",
                       description="predict every scheme on a cluster (see psf plan --help)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="CONFIG [KEY=VALUE ...] --hosts N --link RATE ...")
    p = sub.add_parser("report", help="write a Markdown report with plots and a CSV of runs and sweeps",
                       description="write a Markdown report with plots and a CSV of runs and sweeps "
                       "(see psf report --help)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="RUN_OR_SWEEP_DIR... --out DIR")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the `psf` command line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in OWN_PARSERS:  # their own parsers answer --help and every usage error
        return int(importlib.import_module(OWN_PARSERS[argv[0]]).main(argv[1:]) or 0)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow an option (psf check CONFIG --machine train.lr=0.1): argparse leaves them over.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


def entry_point() -> None:
    """Console-script entry: exit with main()'s status."""
    sys.exit(main())
