"""A per-rank timeline of the phases that are timed anyway, written as one Chrome trace-event file for the job.

Every rank records spans (send, the wait for the k-th reply, decode, encode, compute, the sums
among servers, checkpoints) and instants (detach, readmission) into `TIMELINE`, bounded to a ring
of the last iterations or a window of iteration numbers. At the end rank 0 gathers them and writes
`trace.json`: a process per rank, a thread per activity, which Perfetto and chrome://tracing open.
Off (the default), a span is one attribute test.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

ACTIVITIES = ("send", "wait", "decode", "encode", "compute", "sum", "checkpoint", "membership")
_NOTHING = contextlib.nullcontext()


@dataclass(frozen=True)
class Span:
    """One timed phase of one iteration: its activity, name, start and length (seconds on the wall clock)."""

    iteration: int
    phase: str  # "step": the iteration's training step; "sync": the synchronisation after it
    activity: str
    name: str
    start: float
    duration: float  # 0 for an instant


class Timeline:
    """This rank's recorded spans, bounded to the newest `keep` iterations or to a window of iterations."""

    def __init__(self) -> None:
        self.enabled = False
        self.iteration = 0
        self.phase = "step"
        self.keep: Optional[int] = None
        self.window: Optional[Tuple[int, int]] = None
        self.spans: Deque[Span] = collections.deque()
        self._offset = time.time() - time.perf_counter()  # perf_counter on a clock every rank shares

    def configure(self, enabled: bool, keep: Optional[int] = None, window: Optional[Sequence[int]] = None) -> None:
        """Start recording (or not) with a fresh timeline."""
        self.enabled, self.keep = enabled, keep
        self.window = (int(window[0]), int(window[1])) if window else None
        self.spans.clear()
        self.iteration = 0

    def begin(self, iteration: int, phase: str = "step") -> None:
        """Note the iteration (and its phase) that later spans belong to; drop those older than the ring keeps."""
        self.iteration, self.phase = iteration, phase
        if self.keep is not None and self.window is None:
            while self.spans and self.spans[0].iteration <= iteration - self.keep:
                self.spans.popleft()

    def recording(self) -> bool:
        """Return whether spans of the current iteration are kept."""
        if not self.enabled:
            return False
        return self.window is None or self.window[0] <= self.iteration <= self.window[1]

    def add(self, activity: str, name: str, start: float, duration: float) -> None:
        """Record a span that began at perf_counter() time `start`."""
        if self.recording():
            self.spans.append(Span(self.iteration, self.phase, activity, name, start + self._offset, duration))

    def span(self, activity: str, name: Optional[str] = None) -> Any:
        """Return a block whose wall time is recorded as a span (nothing at all when off)."""
        if not self.enabled:
            return _NOTHING
        return self._timed(activity, name or activity)

    @contextlib.contextmanager
    def _timed(self, activity: str, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(activity, name, t0, time.perf_counter() - t0)

    def instant(self, activity: str, name: str) -> None:
        """Record a moment (a detach, a readmission)."""
        self.add(activity, name, time.perf_counter(), 0.0)


TIMELINE = Timeline()


def newest_of_job(spans_per_rank: Sequence[Sequence[Span]], keep: int) -> List[List[Span]]:
    """Keep only the spans of the job's newest `keep` iterations.

    Each rank's ring follows its own iterations: a worker detached before the end, or one that skipped
    stale work, stopped earlier and still holds iterations the job's ring has already dropped.
    """
    last = max((s.iteration for spans in spans_per_rank for s in spans), default=0)
    return [[s for s in spans if s.iteration > last - keep] for spans in spans_per_rank]


def trace_events(spans_per_rank: Sequence[Sequence[Span]], names: Sequence[str]) -> List[Dict[str, Any]]:
    """Return Chrome trace events: metadata naming each rank's process and activity threads, then the spans."""
    events: List[Dict[str, Any]] = []
    for rank, name in enumerate(names):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, activity in enumerate(ACTIVITIES):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": activity}})
    for rank, spans in enumerate(spans_per_rank):
        for s in spans:
            event = {"name": s.name, "cat": s.activity, "pid": rank, "tid": ACTIVITIES.index(s.activity),
                     "ts": round(s.start * 1e6, 3), "args": {"iteration": s.iteration, "phase": s.phase}}
            if s.duration > 0:
                event.update(ph="X", dur=round(s.duration * 1e6, 3))
            else:
                event.update(ph="i", s="t")
            events.append(event)
    return events


def trace_json(spans_per_rank: Sequence[Sequence[Span]], names: Sequence[str]) -> str:
    """Return the trace file's text (Chrome's JSON object format)."""
    return json.dumps({"traceEvents": trace_events(spans_per_rank, names), "displayTimeUnit": "ms"})
