"""Decode threads: how many host threads a large zigzag decode splits its columns over, and the pool that runs them.

The default comes from one place: `set_decode_threads(n)` when called, else the environment variable
PSF_DECODE_THREADS, else the cores this process may run on, at most four (an MPI rank usually shares
its node with other ranks). Worker threads are started on first use and kept; a decode on a pool that
another thread is using runs in its caller instead of waiting.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Sequence

from psframework import environment
from psframework.codes.checks import check_int

ENV_VAR = environment.DECODE_THREADS
MAX_DEFAULT_THREADS = 4

_configured: Optional[int] = None  # set_decode_threads, or the environment variable once read


def check_threads(value: Any, name: str = "threads") -> int:
    """Return `value` as a thread count; raise ValueError naming it unless it is an integer >= 1."""
    return check_int(value, name, 1)


def default_decode_threads() -> int:
    """Return the decode threads used when nothing is configured: the usable cores, at most four."""
    return max(1, min(environment.usable_cores(), MAX_DEFAULT_THREADS))


def set_decode_threads(threads: Optional[int]) -> None:
    """Set the default decode thread count of this process; None goes back to PSF_DECODE_THREADS or the cores."""
    global _configured
    _configured = None if threads is None else check_threads(threads)


def get_decode_threads() -> int:
    """Return the default decode thread count (see the module docstring for where it comes from)."""
    global _configured
    if _configured is None:
        _configured = environment.decode_threads()
        if _configured is None:
            return default_decode_threads()
    return _configured


def resolve_threads(threads: Optional[int]) -> int:
    """Return `threads` checked, or the default decode thread count when it is None."""
    return get_decode_threads() if threads is None else check_threads(threads)


class _Worker:
    """One pool thread: runs the task it is handed and signals when done."""

    def __init__(self) -> None:
        # Plain locks used as binary semaphores: the cheapest wake-up the threading module has.
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._task: Optional[Callable[[], None]] = None
        self._error: Optional[BaseException] = None
        threading.Thread(target=self._loop, name="psf-decode", daemon=True).start()

    def start(self, task: Callable[[], None]) -> None:
        self._task = task
        self._go.release()

    def wait(self) -> Optional[BaseException]:
        """Block until the task has finished; return the exception it raised, if any."""
        self._done.acquire()
        error, self._error = self._error, None
        return error

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            try:
                task, self._task = self._task, None
                task()
            except BaseException as exc:  # handed to the caller, which re-raises it
                self._error = exc
            finally:
                self._done.release()


class StripePool:
    """Persistent threads that run the stripes of one decode alongside the calling thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: List[_Worker] = []

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run tasks[0] in the calling thread and the others on pool threads; return when all have finished."""
        if len(tasks) < 2 or not self._lock.acquire(blocking=False):
            for task in tasks:  # one task, or the pool is busy with another decode: no waiting for it
                task()
            return
        try:
            while len(self._workers) < len(tasks) - 1:
                self._workers.append(_Worker())
            workers = self._workers[:len(tasks) - 1]
            for worker, task in zip(workers, tasks[1:]):
                worker.start(task)
            error: Optional[BaseException] = None
            try:
                tasks[0]()
            except BaseException as exc:  # the workers still write into the output: wait for them first
                error = exc
            for worker in workers:
                failed = worker.wait()
                error = error or failed
            if error is not None:
                raise error
        finally:
            self._lock.release()

    def _forget(self) -> None:
        """Drop the threads, which a forked child does not have."""
        self._lock = threading.Lock()
        self._workers = []


POOL = StripePool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._forget)
