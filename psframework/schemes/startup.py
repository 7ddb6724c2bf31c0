"""Starting a run safely: every rank checks what it can, then all ranks agree before going on.

A bad input is found before anything is allocated or written (the machine, the memory estimate,
the checkpoint and its fingerprint, the run directory's lock), and again after the sides are built
(the dataset files). At each of the two points every rank reports what it found; if any rank found
a problem, every rank leaves the same way, so the job prints one line and exits with one status.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import numpy as np

from psframework.errors import ConfigError
from psframework.data import DatasetError
from psframework.rundir import RunDirectory, open_run_directory
from psframework.schemes.checkpoint import Checkpoint, differences, fingerprint, read_checkpoint
from psframework.schemes.common import meta_model
from psframework.schemes.preflight import (SERVER, WORKER, check_cuda_aware, check_device, check_machine,
                                           check_memory)
from psframework.settings import Settings

EXIT_USAGE = 2
AUTO = "auto"  # train.resume: the newest checkpoint in the run directory, or a fresh start
T = TypeVar("T")


class RunEnds(Exception):
    """The run ends before training: a bad input (status 2) or nothing left to do (status 0)."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Opening:
    """What rank 0 found before training: the locked run directory and the checkpoint to resume from."""

    run_dir: Optional[RunDirectory] = None
    checkpoint: Optional[Checkpoint] = None
    in_place: bool = False  # the checkpoint lies in the run directory: its metrics continue
    forced: List[str] = field(default_factory=list)  # fingerprint differences train.resume_force let through

    @property
    def start(self) -> int:
        return self.checkpoint.iteration if self.checkpoint is not None else 0

    def close(self, failed: bool = False) -> None:
        """Release the run directory (and on failure remove what this run made that is still empty)."""
        if self.run_dir is not None:
            self.run_dir.release(remove_if_unused=failed)
            self.run_dir = None


def attempt(action: Callable[[], T]) -> Tuple[Optional[T], Optional[Tuple[int, str]]]:
    """Run `action`; return (its result, None) or (None, (status, message)) for a bad input."""
    try:
        return action(), None
    except RunEnds as exc:
        return None, (exc.status, str(exc))
    except (ConfigError, DatasetError) as exc:
        return None, (EXIT_USAGE, str(exc))


def agree(comm: Any, outcome: Optional[Tuple[int, str]]) -> None:
    """Share every rank's outcome; raise RunEnds on every rank if any rank failed (rank 0's reason first)."""
    outcomes = [outcome] if comm is None or comm.Get_size() == 1 else _gather_failures(comm, outcome)
    for rank, found in enumerate(outcomes):
        if found is not None:
            status, message = found
            raise RunEnds(message if rank == 0 else f"rank {rank}: {message}", status)


def _gather_failures(comm: Any, outcome: Optional[Tuple[int, str]]) -> List[Optional[Tuple[int, str]]]:
    """Return every rank's outcome if any rank failed, else []: the common case waits without spinning."""
    from mpi4py import MPI

    from psframework.comm.collective import wait_quietly
    from psframework.comm.polling import auto_poll_sleep

    failed, any_failed = np.array([outcome is not None], np.int32), np.zeros(1, np.int32)
    wait_quietly(comm.Iallreduce(failed, any_failed, op=MPI.MAX), auto_poll_sleep(comm))
    return comm.allgather(outcome) if any_failed[0] else []


def preflight(settings: Settings, rank: int, comm: Any = None) -> Opening:
    """Check this rank's part before anything is allocated; rank 0 also opens the run directory."""
    check_cuda_aware(settings.transport.cuda_aware, comm)
    if rank != 0:
        check_device(settings.device, rank)
        check_memory(settings, SERVER if rank % (settings.code.n + 1) == 0 else WORKER)  # other servers: G > 1
        return Opening()
    check_machine(settings)
    check_memory(settings, SERVER)
    opening, overwrite = Opening(), settings.run.overwrite
    resume = settings.run.resume
    checkpoint = None if resume in (None, AUTO) else read_checkpoint(resume)
    if resume == AUTO:
        checkpoint = newest_checkpoint(settings.run.run_dir)
        # Nothing to resume: start afresh, also over the files of a run stopped before its first checkpoint.
        overwrite = overwrite or (checkpoint is None and not os.path.exists(os.path.join(settings.run.run_dir,
                                                                                         "summary.json")))
    if checkpoint is not None:
        opening = check_resume(settings, checkpoint)
    opening.run_dir = open_run_directory(settings.run.run_dir, opening.in_place, overwrite)
    return opening


def newest_checkpoint(run_dir: str) -> Optional[Checkpoint]:
    """Return the newest checkpoint in `run_dir` that reads back whole (train.resume: auto), or None."""
    try:
        names = [n for n in os.listdir(run_dir) if n.startswith("checkpoint") and n.endswith(".pt")]
    except OSError:
        return None
    paths = sorted((os.path.join(run_dir, n) for n in names), key=os.path.getmtime, reverse=True)
    for path in paths:
        try:
            return read_checkpoint(path)
        except ConfigError:
            continue  # torn or foreign: an older one may still do
    return None


def check_resume(settings: Settings, checkpoint: Checkpoint) -> Opening:
    """Compare the checkpoint's fingerprint, and end the run early if it holds every iteration."""
    from psframework.schemes.driver import make_schedule

    path = checkpoint.path
    current = fingerprint(settings.config, meta_model(settings))
    differ = differences(checkpoint.fingerprint, current)
    if differ and not settings.run.resume_force:
        raise ConfigError(f"train.resume: checkpoint {path!r} was written with other settings: {'; '.join(differ)} "
                          "(train.resume_force=true resumes anyway)")
    planned = make_schedule(settings, checkpoint.num_train).total
    if checkpoint.iteration > planned:
        raise ConfigError(f"train.resume: checkpoint {path!r} holds iteration {checkpoint.iteration}, beyond the "
                          f"{planned} iterations this config plans (raise train.epochs or train.max_iterations)")
    if checkpoint.iteration == planned:
        raise RunEnds(f"psf: nothing to do: checkpoint {path} already holds all {planned} planned iterations "
                      "(raise train.epochs or train.max_iterations to train on)", status=0)
    in_place = os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(settings.run.run_dir)
    return Opening(checkpoint=checkpoint, in_place=in_place, forced=differ)
