"""Shared fixtures: small configs and run directories."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# Every process the tests start (and this one) can import a torchvision whose C++ operators do not load
# with the installed torch: see tests/startup/sitecustomize.py.
SITE = os.path.join(ROOT, "tests", "startup")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, SITE)
import sitecustomize  # noqa: E402,F401  (the hook for this process)


@pytest.fixture
def configs_dir() -> str:
    return CONFIGS


def pytest_collection_modifyitems(config, items) -> None:
    """Count every test that starts MPI jobs or Slurm jobs as slow: `-m "not slow"` is the quick tier."""
    for item in items:
        if item.get_closest_marker("mpi") or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="module")
def _pools_end_with_their_module():
    """End the warm MPI jobs of a test file when it is done (they hold a Python and torch per rank)."""
    yield
    from mpiutil import close_pools

    close_pools()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a test left any of its clusters of hosts behind (namespaces, files); remove them."""
    from netclusterutil import leftovers_of_this_run

    left = leftovers_of_this_run()
    if left:
        print(f"\nconftest: clusters of hosts left behind by the tests (now removed): {left}", file=sys.stderr)
        session.exitstatus = 1
