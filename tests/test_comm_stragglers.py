"""Straggler injection: models, determinism, distributions and validation (no MPI needed)."""

from __future__ import annotations

import numpy as np
import pytest

from psframework.runtime.stragglers import StragglerSpec, Stragglers

WORKERS = list(range(1, 9))


def test_none_delays_nobody():
    s = Stragglers(StragglerSpec(), WORKERS)
    assert s.factors(0) == {w: 0.0 for w in WORKERS}
    assert s.delayed(5) == [] and s.delay_s(3, 5, 0.2) == 0.0


def test_fixed_slows_the_listed_ranks_by_their_own_compute_time():
    s = Stragglers(StragglerSpec(model="fixed", ranks=(2, 5), factor=3.0), WORKERS)
    for it in range(5):
        assert s.delayed(it) == [2, 5]
    assert s.delay_s(2, 0, 0.5) == pytest.approx(1.0)  # (3 - 1) x 0.5 s: the worker takes 3 x 0.5 s in all
    assert s.delay_s(5, 9, 0.1) == pytest.approx(0.2)
    assert s.delay_s(1, 0, 0.5) == 0.0


def test_random_draws_count_ranks_per_iteration_reproducibly():
    spec = StragglerSpec(model="random", factor=2.0, count=3, seed=11)
    a, b = Stragglers(spec, WORKERS), Stragglers(spec, WORKERS)
    draws = [tuple(a.delayed(it)) for it in range(300)]
    assert all(len(d) == 3 for d in draws)
    assert draws == [tuple(b.delayed(it)) for it in range(300)]  # the same on every rank
    assert len(set(draws)) > 30 and set().union(*draws) == set(WORKERS)
    assert all(a.factors(it)[w] == 1.0 for it in range(10) for w in a.delayed(it))
    other = Stragglers(StragglerSpec(model="random", factor=2.0, count=3, seed=12), WORKERS)
    assert [tuple(other.delayed(it)) for it in range(300)] != draws


def test_exponential_delays_have_the_given_mean():
    s = Stragglers(StragglerSpec(model="exponential", factor=0.5, seed=3), WORKERS)
    units = np.array([list(s.factors(it).values()) for it in range(4000)])
    assert units.min() >= 0.0
    assert units.mean() == pytest.approx(0.5, rel=0.03)
    assert np.median(units) == pytest.approx(0.5 * np.log(2), rel=0.05)


def test_pareto_delays_have_the_given_mean_and_a_heavy_tail():
    s = Stragglers(StragglerSpec(model="pareto", factor=0.4, shape=3.0, seed=5), WORKERS)
    units = np.array([list(s.factors(it).values()) for it in range(4000)])
    assert units.min() >= 0.0
    assert units.mean() == pytest.approx(0.4, rel=0.05)
    heavy = Stragglers(StragglerSpec(model="pareto", factor=0.4, shape=1.5, seed=5), WORKERS)
    tail = np.array([list(heavy.factors(it).values()) for it in range(4000)])
    scale = 0.4 * (1.5 - 1.0)  # Lomax scale giving mean `factor`
    assert np.median(tail) == pytest.approx(scale * (2 ** (1 / 1.5) - 1), rel=0.05)
    assert tail.max() > 20 * np.median(tail)


def test_inject_sleeps_the_delay_and_returns_it():
    slept = []
    s = Stragglers(StragglerSpec(model="fixed", ranks=(1,), factor=4.0), WORKERS)
    assert s.inject(1, 0, 0.01, sleep=slept.append) == pytest.approx(0.03)
    assert s.inject(2, 0, 0.01, sleep=slept.append) == 0.0
    assert slept == [pytest.approx(0.03)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="gamma"), "stragglers.model: got 'gamma'"),
    (dict(model="fixed", ranks=(1,), factor=0.5), "stragglers.factor: got 0.5, expected >= 1"),
    (dict(model="exponential", factor=0.0), "stragglers.factor: got 0.0, expected > 0"),
    (dict(model="fixed"), "expected at least one worker rank"),
    (dict(model="random", count=0), "stragglers.count: got 0"),
    (dict(model="pareto", shape=1.0), "stragglers.shape: got 1.0"),
    (dict(seed=-1), "stragglers.seed: got -1"),
])
def test_bad_specs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StragglerSpec(**kwargs)


def test_bad_use_is_rejected():
    with pytest.raises(ValueError, match="stragglers.ranks: got \\[9\\]"):
        Stragglers(StragglerSpec(model="fixed", ranks=(9,), factor=2.0), WORKERS)
    with pytest.raises(ValueError, match="stragglers.count: got 9, expected <= 8"):
        Stragglers(StragglerSpec(model="random", count=9, factor=2.0), WORKERS)
    s = Stragglers(StragglerSpec(), WORKERS)
    with pytest.raises(ValueError, match="iteration: got -1"):
        s.factors(-1)
    with pytest.raises(ValueError, match="rank: got 0"):
        s.delay_s(0, 0, 1.0)
    with pytest.raises(ValueError, match="compute_s: got -1"):
        s.delay_s(1, 0, -1.0)
