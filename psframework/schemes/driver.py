"""The one training driver: iteration plan, schedule, evaluation, metrics, checkpoints and summary.

A scheme supplies one training step on each side (`ServerSide.step` on rank 0 or the single process,
`WorkerSide.step` on ranks 1..n) and a state hook (`state_dict` / `load_state_dict`); the driver
does everything around the steps, the same way for every scheme. Both sides walk the same plan, so a
worker always knows which iteration, synchronisation or stop comes next.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from psframework.comm.links import ServerLink, WorkerLink
from psframework.comm.rounds import Detached, StopEarly, cpu_per_iteration
from psframework.comm.timeline import TIMELINE
from psframework.data import Dataset
from psframework.metrics import Progress, RunRecorder
from psframework.runtime.preempt import FLAG, Preempted
from psframework.schemes.checkpoint import restore, save_checkpoint
from psframework.schemes.common import Step, evaluate, iteration_plan, iterations_per_epoch, scale_lr
from psframework.schemes.lr_schedule import check_schedule, lr_factor
from psframework.schemes.recipe import LossScaler
from psframework.schemes.groups import Group, SoleServer
from psframework.settings import ScheduleSettings, Settings

STEP, SYNC, STOP = "step", "sync", "stop"


@dataclass(frozen=True)
class Schedule:
    """When a run evaluates, checkpoints, verifies and synchronises, from its length and settings."""

    start: int  # iterations already done (a resumed run continues after them)
    total: int  # the iteration the run stops after: the plan's end, or train.max_iterations if sooner
    per_epoch: int
    eval_every: int = 0
    verify_every: int = 0
    checkpoint_every: int = 0
    lr: ScheduleSettings = ScheduleSettings()
    accumulate: int = 1  # iterations (micro-batches) per optimizer step
    planned: int = 0  # the plan's iterations, train.epochs long, that the learning rate follows (0: total)

    @property
    def capped(self) -> bool:
        """Return whether train.max_iterations stops the run before its plan ends."""
        return self.total < self.plan_length

    @property
    def plan_length(self) -> int:
        """Return the iterations of the plan the learning-rate schedule follows."""
        return self.planned or self.total

    def evaluates(self, iteration: int) -> bool:
        """Return whether the model is evaluated after this iteration (default: at every epoch's end)."""
        if iteration == self.total:
            return True
        return iteration % (self.eval_every or self.per_epoch) == 0

    def checkpoints(self, iteration: int) -> bool:
        """Return whether a checkpoint is written after this iteration (always after the last)."""
        return iteration == self.total or bool(self.checkpoint_every and iteration % self.checkpoint_every == 0)

    def verifies(self, iteration: int) -> bool:
        """Return whether coded weights are decoded twice and compared after this iteration."""
        return bool(self.verify_every and iteration % self.verify_every == 0)

    def syncs(self, iteration: int) -> bool:
        """Return whether rank 0 needs the current model after this iteration."""
        return self.evaluates(iteration) or self.checkpoints(iteration) or self.verifies(iteration)

    def ends_step(self, iteration: int) -> bool:
        """Return whether the optimizers step after this iteration (the last micro-batch of an optimizer step)."""
        return iteration % self.accumulate == 0

    def lr_factor(self, iteration: int) -> float:
        """Return the learning-rate multiplier of an iteration: that of its optimizer step."""
        m = self.accumulate
        return lr_factor(self.lr, (iteration - 1) // m + 1, self.plan_length // m, self.per_epoch // m, m)


def make_schedule(settings: Settings, num_samples: int, start: int = 0) -> Schedule:
    """Return the schedule of a run over `num_samples` training samples."""
    run, data, optim = settings.run, settings.data, settings.optim
    m = optim.accumulate
    per_epoch = iterations_per_epoch(data, num_samples, m)
    if per_epoch == 0:
        from psframework.errors import ConfigError

        steps = f" x train.accumulate={m}" if m > 1 else ""
        raise ConfigError(f"data.batch_size: got {data.batch_size}{steps}, larger than the {num_samples} "
                          "training samples")
    # A cap stops the run; the schedule stays the one planned over train.epochs.
    planned = per_epoch * run.epochs
    total = min(planned, run.max_iterations) if run.max_iterations else planned
    check_schedule(optim.schedule, planned // m, per_epoch // m, m)
    window = run.trace_window
    if run.trace and window and window[1] > total:
        from psframework.errors import ConfigError

        raise ConfigError(f"output.trace_window: got {list(window)}, beyond the run's {total} iterations; expected "
                          f"iterations within 1..{total}")
    return Schedule(start, total, per_epoch, run.eval_every, run.verify_every, run.checkpoint_every,
                    optim.schedule, m, planned)


def steps(settings: Settings, num_samples: int, schedule: Schedule) -> Iterator[Step]:
    """Yield the run's remaining iterations in the order fixed by `data.seed`."""
    return iteration_plan(settings.data, num_samples, schedule.start, schedule.total, schedule.accumulate)


@dataclass(frozen=True)
class Event:
    """One entry of the plan both sides follow: a training step, a synchronisation, or the stop."""

    kind: str
    iteration: int
    step: Optional[Step] = None


def events(settings: Settings, num_samples: int, schedule: Schedule, with_syncs: bool) -> Iterator[Event]:
    """Yield the plan of a run: every step, then (if the scheme synchronises) its sync, then the stop."""
    for step in steps(settings, num_samples, schedule):
        yield Event(STEP, step.iteration, step)
        if with_syncs and schedule.syncs(step.iteration):
            yield Event(SYNC, step.iteration)
    yield Event(STOP, schedule.total)


@dataclass
class Problem:
    """What rank 0 trains on: the dataset and the model."""

    dataset: Dataset
    model: torch.nn.Module


@dataclass
class StepResult:
    """One iteration's outcome: the loss, the timed parts (seconds) and other per-iteration fields."""

    loss: float
    timings: Dict[str, float] = field(default_factory=dict)
    fields: Dict[str, Any] = field(default_factory=dict)


class ServerSide(ABC):
    """Rank 0's part of a scheme (or the whole of a single-process scheme)."""

    fetches_batches = True  # whether rank 0 loads every global batch (data-parallel servers need labels only)

    def __init__(self, settings: Settings, problem: Problem, link: Optional[ServerLink] = None,
                 group: Optional[Group] = None) -> None:
        self.settings, self.problem, self.link = settings, problem, link  # no link: a single-process scheme
        self.group: Group = group or SoleServer(settings.optim.label_smoothing)  # its place among the run's servers
        self.optimizers: List[torch.optim.Optimizer] = []  # rank 0's optimizers: scaled by the schedule
        self.scaler = LossScaler.of(settings.optim)  # the loss scale (train.loss_scale), the same on every rank

    @property
    def model(self) -> torch.nn.Module:
        """Return the model rank 0 trains."""
        return self.problem.model

    @property
    def lead(self) -> bool:
        """Return whether this side is the lead server (rank 0): it evaluates, checkpoints and records."""
        return self.group.lead

    def batch_indices(self, step: Step) -> Any:
        """Return the samples of `step` this server computes on: the global batch, or its group's part."""
        return self.group.part(step.indices)

    def describe(self) -> str:
        """Return what the start-up line says about the scheme."""
        return ""

    def start(self, schedule: Schedule) -> None:
        """Begin the run: nothing by default (a scheme whose workers hold state sends it here)."""

    @abstractmethod
    def step(self, step: Step) -> StepResult:
        """Run one training iteration on the global batch of `step`."""

    def sync(self, iteration: int, verify: bool) -> Dict[str, Any]:
        """Bring rank 0's model up to date; return fields for the iteration's metrics."""
        return {}

    def state_dict(self) -> Dict[str, Any]:
        """Return the scheme's state for a checkpoint (besides the model)."""
        return {"optimizers": [opt.state_dict() for opt in self.optimizers], "loss_scale": self.scaler.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the scheme's state from a checkpoint."""
        for opt, saved in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(saved)
        if "loss_scale" in state:  # checkpoints before loss scaling hold none
            self.scaler.load_state_dict(state["loss_scale"])

    def finish(self) -> Dict[str, Any]:
        """End the run (workers stop here); return the scheme's summary fields."""
        return {}

    def readmission_state(self, index: int, iteration: int) -> Any:
        """Return what readmitted worker `index` needs to go on from `iteration`: nothing by default."""
        return torch.zeros(0)


class WorkerSide(ABC):
    """A worker's part of a scheme (ranks 1..n)."""

    with_syncs = False  # whether rank 0's synchronisations involve the workers

    def __init__(self, settings: Settings, link: WorkerLink) -> None:
        self.settings, self.link = settings, link

    def start(self, schedule: Schedule) -> None:
        """Begin the run: nothing by default (a worker that holds state receives it here)."""

    @abstractmethod
    def step(self, step: Step, after: Event) -> None:
        """Run this worker's part of one iteration; `after` is what comes next in the plan."""

    def sync(self, iteration: int) -> None:
        """Answer rank 0's synchronisation after an iteration (only called when `with_syncs` is set)."""

    def readmitted(self, state: Any) -> None:
        """Take the fresh state rank 0 sent on readmission: nothing by default (stateless workers)."""

    def close(self) -> None:
        """Release what the worker holds at the end of the run: nothing by default."""


def resume(side: ServerSide, checkpoint: Any) -> None:
    """Restore the model and the scheme's state from a checkpoint (None: a fresh run)."""
    if checkpoint is None:
        return
    num_train = len(side.problem.dataset.train)
    if checkpoint.num_train != num_train:
        from psframework.errors import ConfigError

        raise ConfigError(f"train.resume: checkpoint {checkpoint.path!r} was written for {checkpoint.num_train} "
                          f"training samples, the dataset has {num_train}")
    restore(checkpoint, side.model)
    side.load_state_dict(checkpoint.state)


def run_server(settings: Settings, side: ServerSide, opening: Any, world_size: int = 1,
               hosts: Sequence[str] = ()) -> Dict[str, Any]:
    """Train as rank 0 (or the single process); write the run directory and return the summary.

    `hosts`: every rank's host name by world rank (MPI schemes), recorded in the summary.
    """
    problem, run = side.problem, settings.run
    num_train = len(problem.dataset.train)
    schedule = make_schedule(settings, num_train, share_start(side, opening))
    if side.link is not None:
        side.link.announce((schedule.start, num_train))
    side.start(schedule)
    if side.link is not None:
        side.link.await_workers(schedule.start)
    recorder = RunRecorder(run.run_dir if side.lead else None, settings.config_yaml,
                           schedule.start if opening.in_place else None, run.tensorboard and side.lead)
    progress = Progress(schedule.total - schedule.start, run.progress if side.lead else "off")
    if opening.forced:
        print(f"psf: warning: resuming from {opening.checkpoint.path} although its settings differ "
              f"(train.resume_force): {'; '.join(opening.forced)}", file=sys.stderr, flush=True)
    progress.message(f"psf: scheme {run.scheme}{side.describe()}, model {settings.model.name}, dataset "
                     f"{problem.dataset.name} ({num_train} train / {len(problem.dataset.test)} test), "
                     f"iterations {schedule.start + 1}..{schedule.total}")
    if schedule.capped:
        progress.message(f"psf: train.max_iterations={schedule.total} stops the run at iteration {schedule.total} "
                         f"of the {schedule.plan_length} its schedule plans over train.epochs={run.epochs}")
    final: Dict[str, Any] = {"final_test_accuracy": None, "final_test_loss": None}
    problem.model.train()
    if side.fetches_batches:
        problem.dataset.train.prefetch(side.batch_indices(step) for step in steps(settings, num_train, schedule))
    for step in steps(settings, num_train, schedule):
        TIMELINE.begin(step.iteration)
        if side.link is not None:
            # A worker rejoins where an optimizer step starts: no accumulated gradient is missing from its state.
            side.link.start_iteration(step.iteration, side.readmission_state, readmit=step.first)
        factor = schedule.lr_factor(step.iteration)
        scale_lr(side.optimizers, factor)
        loss = train_step(side, step, recorder, settings.optim.lr * factor)
        extra = after_step(settings, side, schedule, step.iteration, recorder, final)
        progress.update(step.iteration - schedule.start, step.epoch, loss, extra)
        if step.last and side.group.stop and step.iteration < schedule.total:
            stop_early(settings, side, schedule, step.iteration, recorder)
    problem.dataset.close()  # stops a streamed dataset's loader processes
    fields = summary_fields(settings, side, schedule, recorder, world_size, final, hosts)
    if not side.lead:
        return None
    summary = recorder.finish({**fields, "resume_forced": opening.forced} if opening.forced else fields)
    progress.message(f"psf: done: test accuracy {summary['final_test_accuracy']:.4f}, {summary['wall_s']:.1f} s, "
                     f"mean iteration {summary['mean_iteration_s'] * 1e3:.1f} ms, outputs in {run.run_dir}")
    return summary


def share_start(side: ServerSide, opening: Any) -> int:
    """Return the iteration the run starts after; with several servers, every server takes the lead's
    model and scheme state (the lead alone read the checkpoint)."""
    lead = (opening.start, side.model.state_dict(), side.state_dict()) if side.lead else None
    start, model, state = side.group.broadcast(lead)
    if not side.lead:
        side.model.load_state_dict(model)
        side.load_state_dict(state)
    return start


def stop_early(settings: Settings, side: ServerSide, schedule: Schedule, iteration: int,
               recorder: RunRecorder) -> None:
    """End the run after `iteration` for a preemption signal: every rank stops there, the checkpoint holds it.

    Raises Preempted; metrics.jsonl.partial and the checkpoint let `train.resume=auto` go on from here.
    """
    if side.link is not None:
        side.link.stop_early(iteration)
    if not schedule.syncs(iteration):
        recorder.update_last(**side.sync(iteration, False))
    if side.lead and not schedule.checkpoints(iteration):
        write_checkpoints(settings, side, schedule, iteration)
    side.problem.dataset.close()
    if side.link is not None:
        side.link.finish(recorder, iteration)  # the workers answered the sync and stop now
    recorder.suspend()
    # Another server may have had the signal: the preemption signal is then the likely one.
    name = FLAG.name or settings.run.preempt_signal
    raise Preempted(iteration, schedule.total, name, os.path.join(settings.run.run_dir, "checkpoint.pt"))


def train_step(side: ServerSide, step: Step, recorder: RunRecorder, lr: float) -> float:
    """Run one step, time it and log its metrics row (with the iteration's learning rate `lr`); return the loss."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = side.step(step)
    iteration_s = time.perf_counter() - t0
    row = {"iteration": step.iteration, "epoch": step.epoch, "batch": step.batch, "loss": result.loss, "lr": lr,
           "iteration_s": iteration_s, "cpu_s": time.process_time() - cpu0, "wall_s": recorder.elapsed(),
           **result.timings}
    if result.timings:
        row["compute_s"] = max(0.0, iteration_s - sum(result.timings.values()))
    row.update(result.fields)
    recorder.log(row)
    return result.loss


def after_step(settings: Settings, side: ServerSide, schedule: Schedule, iteration: int,
               recorder: RunRecorder, final: Dict[str, Any]) -> str:
    """Synchronise, evaluate and checkpoint as the schedule says; return the progress line's extra text."""
    if not schedule.syncs(iteration):
        return ""
    TIMELINE.begin(iteration, "sync")
    fields = side.sync(iteration, schedule.verifies(iteration))
    recorder.update_last(**fields)
    extra = f"verify {fields['verify_max_rel_diff']:.1e} " if "verify_max_rel_diff" in fields else ""
    if not side.lead:
        return ""
    if schedule.evaluates(iteration):
        test = side.problem.dataset.test
        accuracy, loss = evaluate(side.model, test, settings.data.test_batch_size)
        final.update(final_test_accuracy=accuracy, final_test_loss=loss)
        recorder.update_last(test_accuracy=accuracy, test_loss=loss)
        extra += f"test acc {accuracy:.4f}"
    if schedule.checkpoints(iteration):
        write_checkpoints(settings, side, schedule, iteration)
    return extra.strip()


def write_checkpoints(settings: Settings, side: ServerSide, schedule: Schedule, iteration: int) -> None:
    """Write checkpoint.pt (the latest) and, at every `train.checkpoint_every`, checkpoint-ITERATION.pt; keep the
    newest `train.keep_checkpoints` of those."""
    state = side.state_dict()
    run_dir = settings.run.run_dir
    num_train = len(side.problem.dataset.train)
    names = ["checkpoint.pt"]
    if schedule.checkpoint_every and iteration % schedule.checkpoint_every == 0:
        names.append(f"checkpoint-{iteration}.pt")
    with TIMELINE.span("checkpoint"):
        for name in names:
            save_checkpoint(os.path.join(run_dir, name), iteration, num_train, side.model, state, settings)
    if settings.run.keep_checkpoints:
        prune_checkpoints(run_dir, settings.run.keep_checkpoints)


def prune_checkpoints(run_dir: str, keep: int) -> None:
    """Delete all but the newest `keep` periodic checkpoints; called once the newest is whole on disk (each is
    written to a temporary name and renamed), so a kill at any moment leaves a loadable one."""
    for iteration in periodic_checkpoints(run_dir)[:-keep]:
        with contextlib.suppress(FileNotFoundError):  # removed already by an earlier pruning
            os.remove(os.path.join(run_dir, f"checkpoint-{iteration}.pt"))


def periodic_checkpoints(run_dir: str) -> List[int]:
    """Return the iterations of the run directory's checkpoint-ITERATION.pt files, oldest first."""
    found = [name[len("checkpoint-"):-len(".pt")] for name in os.listdir(run_dir)
             if name.startswith("checkpoint-") and name.endswith(".pt")]
    return sorted(int(n) for n in found if n.isdigit())


def summary_fields(settings: Settings, side: ServerSide, schedule: Schedule, recorder: RunRecorder,
                   world_size: int, final: Dict[str, Any], hosts: Sequence[str] = ()) -> Dict[str, Any]:
    """Return the summary: what every scheme reports, then the scheme's own fields."""
    code = settings.code
    fields = {"scheme": settings.run.scheme, "name": settings.run.name, "model": settings.model.name,
              "dataset": side.problem.dataset.name, "world_size": world_size,
              "n": code.n if world_size > 1 else None, "k": code.k if code.kind else None,
              "iterations": schedule.total, "start_iteration": schedule.start, **final,
              "mean_iteration_s": recorder.mean("iteration_s", skip=1)}
    if hosts:
        fields["hosts"] = list(hosts)
    fields.update(side.finish())
    if side.link is not None:
        fields.update(side.link.finish(recorder, schedule.total))
    if side.link is None:  # one process
        fields["cpu_s_per_iteration"] = cpu_per_iteration(recorder.mean("cpu_s", skip=1), [])
    fields.update(side.group.summary(fields, recorder))
    return fields


def run_worker(settings: Settings, side: WorkerSide, on_started: Callable[[], Any] = lambda: None) -> None:
    """Follow rank 0's plan as a worker, from the announced start to the stop.

    `on_started` runs once the server knows this worker is set up. A worker that rank 0 detached asks
    to rejoin, takes the fresh state it is sent and skips ahead in the plan to the iteration it was
    readmitted at.
    """
    start, num_train = side.link.announced()
    schedule = make_schedule(settings, num_train, start)
    side.start(schedule)
    side.link.started(schedule.start)
    on_started()
    plan = events(settings, num_train, schedule, side.with_syncs)
    event, resume_at, stop_at = next(plan), 0, schedule.total
    for after in plan:
        if event.iteration >= resume_at:
            try:
                timed_play(side, event, after, first=event.iteration == schedule.start + 1)
            except Detached as notice:
                readmission = side.link.rejoin(notice.iteration, schedule.total)
                if readmission is None:
                    break
                resume_at, state = readmission
                side.readmitted(state)
            except StopEarly as notice:
                stop_at = notice.iteration
                if side.with_syncs and not schedule.syncs(stop_at):
                    side.sync(stop_at)  # rank 0 checkpoints this iteration
                break
        event = after
    side.close()  # before the stop, which frees this rank's communicators: updates still in flight end here
    stopped = side.link.stop(stop_at)
    if stopped < schedule.total:
        raise Preempted(stopped, schedule.total, FLAG.name)


def timed_play(side: WorkerSide, event: Event, after: Event, first: bool) -> None:
    """Play a plan event, adding the processor time of every step but the first (warm-up) to the report."""
    cpu0 = time.process_time()
    TIMELINE.begin(event.iteration)
    play(side, event, after)
    if event.kind == STEP and not first:
        side.link.report.add("cpu_s", time.process_time() - cpu0)
        side.link.report.add("cpu_steps", 1)


def play(side: WorkerSide, event: Event, after: Event) -> None:
    """Run one plan event on a worker."""
    if event.kind == STEP:
        side.step(event.step, after)
    else:
        TIMELINE.begin(event.iteration, "sync")
        side.sync(event.iteration)
