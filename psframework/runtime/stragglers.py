"""Straggler injection: real, seeded delays scaled by each worker's own measured compute time.

Models: none; fixed (the listed ranks are slowed by `factor`); random (`count` ranks drawn afresh
every iteration are slowed by `factor`); exponential and pareto (every worker sleeps a random
multiple of its compute time with mean `factor`; Pareto of shape `shape`, heavy-tailed). A slowed
worker with compute time c sleeps (factor - 1) * c, so it takes factor * c in all. The delays of an
iteration depend only on (seed, iteration), so every rank can compute anyone's delay.

A slowed worker is unresponsive while it sleeps, as a slow node is: it makes no MPI progress, so
messages to it pile up where they were sent (`responsive: true` keeps its messages moving, the
model where only compute is slow). The freeze model stops the listed ranks outright: a helper
process sends them SIGSTOP for `pause_s` seconds and SIGCONT after, repeatedly, so that they are
frozen a fraction `duty` of the time, whatever they are doing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

MODELS = ("none", "fixed", "random", "exponential", "pareto", "freeze")


@dataclass(frozen=True)
class StragglerSpec:
    """The straggler model and its parameters."""

    model: str = "none"
    ranks: Tuple[int, ...] = ()
    factor: float = 1.0
    seed: int = 0
    count: int = 1
    shape: float = 1.5
    responsive: bool = False
    pause_s: float = 0.5
    duty: float = 0.8

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"stragglers.model: got {self.model!r}, expected one of {', '.join(MODELS)}")
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if self.model in ("fixed", "random") and not self.factor >= 1.0:
            raise ValueError(f"stragglers.factor: got {self.factor}, expected >= 1 (a slowdown factor)")
        if self.model in ("exponential", "pareto") and not self.factor > 0.0:
            raise ValueError(f"stragglers.factor: got {self.factor}, expected > 0 (the mean delay in compute times)")
        if self.model in ("fixed", "freeze") and not self.ranks:
            raise ValueError(f"stragglers.ranks: got none, expected at least one worker rank for model {self.model}")
        if self.model == "freeze" and not 0.0 < self.pause_s <= 3600.0:
            raise ValueError(f"stragglers.pause_s: got {self.pause_s}, expected seconds in (0, 3600]")
        if self.model == "freeze" and not 0.0 < self.duty < 1.0:
            raise ValueError(f"stragglers.duty: got {self.duty}, expected a fraction of the time in (0, 1)")
        if self.model == "random" and not self.count >= 1:
            raise ValueError(f"stragglers.count: got {self.count}, expected >= 1")
        if self.model == "pareto" and not self.shape > 1.0:
            raise ValueError(f"stragglers.shape: got {self.shape}, expected > 1 (a Pareto shape with a finite mean)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"stragglers.seed: got {self.seed!r}, expected an integer >= 0")


class Stragglers:
    """Decide and inject each worker's delay per iteration."""

    def __init__(self, spec: StragglerSpec, workers: Sequence[int]) -> None:
        self.spec = spec
        self.workers = tuple(int(w) for w in workers)
        if not self.workers:
            raise ValueError("workers: got none, expected at least one worker rank")
        unknown = [r for r in spec.ranks if r not in self.workers]
        if spec.model in ("fixed", "freeze") and unknown:
            raise ValueError(f"stragglers.ranks: got {unknown}, expected worker ranks among {list(self.workers)}")
        if spec.model == "random" and spec.count > len(self.workers):
            raise ValueError(f"stragglers.count: got {spec.count}, expected <= {len(self.workers)} workers")
        self._cache: Tuple[int, Dict[int, float]] = (-1, {})

    def factors(self, iteration: int) -> Dict[int, float]:
        """Return each worker's delay for an iteration, in units of its own compute time."""
        if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
            raise ValueError(f"iteration: got {iteration!r}, expected an integer >= 0")
        if self._cache[0] == iteration:
            return dict(self._cache[1])
        spec, n = self.spec, len(self.workers)
        rng = np.random.default_rng([spec.seed, int(iteration)])
        if spec.model in ("none", "freeze"):  # a frozen rank is stopped from outside, not delayed per iteration
            units = np.zeros(n)
        elif spec.model == "fixed":
            units = np.array([spec.factor - 1.0 if w in spec.ranks else 0.0 for w in self.workers])
        elif spec.model == "random":
            chosen = set(rng.choice(n, size=spec.count, replace=False).tolist())
            units = np.array([spec.factor - 1.0 if i in chosen else 0.0 for i in range(n)])
        elif spec.model == "exponential":
            units = rng.exponential(spec.factor, size=n)
        else:  # Lomax (Pareto II) draws, scaled so that the mean is `factor`
            units = rng.pareto(spec.shape, size=n) * spec.factor * (spec.shape - 1.0)
        result = {w: float(u) for w, u in zip(self.workers, units)}
        self._cache = (int(iteration), result)
        return dict(result)

    def delayed(self, iteration: int) -> List[int]:
        """Return the workers with a non-zero delay in an iteration."""
        return [w for w, u in self.factors(iteration).items() if u > 0.0]

    def delay_s(self, rank: int, iteration: int, compute_s: float) -> float:
        """Return the seconds `rank` must sleep in an iteration, given its compute time."""
        if not compute_s >= 0.0:
            raise ValueError(f"compute_s: got {compute_s!r}, expected a time >= 0")
        factors = self.factors(iteration)
        if rank not in factors:
            raise ValueError(f"rank: got {rank}, expected a worker rank among {list(self.workers)}")
        return factors[rank] * compute_s

    def inject(self, rank: int, iteration: int, compute_s: float,
               sleep: Callable[[float], None] = time.sleep) -> float:
        """Sleep this worker's delay for the iteration and return it, so that metrics can record it."""
        delay = self.delay_s(rank, iteration, compute_s)
        if delay > 0.0:
            sleep(delay)
        return delay


class Freezer:
    """Freeze a process (this one by default) periodically from a helper process (SIGSTOP, then SIGCONT)."""

    def __init__(self, spec: StragglerSpec, pid: "int | None" = None) -> None:
        import os
        import subprocess
        import sys

        run_s = spec.pause_s * (1.0 - spec.duty) / spec.duty
        target = os.getpid() if pid is None else pid
        # The helper must import this copy of the package, wherever it was imported from.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "psframework.runtime.freezer", str(target),
                                         str(spec.pause_s), str(run_s)], stdin=subprocess.DEVNULL,
                                        env=dict(os.environ, PYTHONPATH=path))

    def stop(self) -> None:
        """End the freezing (the helper lets this process go on)."""
        self.process.terminate()
        self.process.wait()


def start_freezer(spec: StragglerSpec, rank: int) -> "Freezer | None":
    """Start freezing this rank if the freeze model lists it; return the freezer (stop it at the end) or None."""
    if spec.model != "freeze" or rank not in spec.ranks:
        return None
    return Freezer(spec)
