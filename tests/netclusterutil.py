"""A cluster of hosts on one machine for the tests (hpc/netcluster): made, used and always removed.

`cluster(...)` makes one under a name of its own and yields its Cluster; it is removed when the test
ends, passed or failed, and a reaper process removes it too if the test process is killed (a
pytest-timeout). Where the machine cannot hold one (not root, no namespaces) the test skips with the
reason; CI runs as root, so there it runs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
from typing import Iterator, Optional, Sequence

import pytest

from psframework.netcluster import hosts
from psframework.netcluster.hosts import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETCLUSTER = os.path.join(ROOT, "hpc", "netcluster")
_names = itertools.count()


def netcluster(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run hpc/netcluster ARGS with this Python; return the completed process (output as text)."""
    env = dict(os.environ, PSF_PYTHON=sys.executable)
    return subprocess.run([NETCLUSTER, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _prefix() -> str:
    return f"t{os.getpid() % 100000}x"


def unique_name() -> str:
    """Return a cluster name no other test process uses: 't', this process's id, a counter."""
    return f"{_prefix()}{next(_names)}"


def require_namespaces() -> None:
    """Skip the test, with the reason, where no cluster can be made."""
    try:
        hosts.require_namespaces()
    except hosts.Unavailable as exc:
        pytest.skip(f"no cluster of hosts on this machine: {exc}")


@contextlib.contextmanager
def cluster(count: int, *shape: str, name: Optional[str] = None) -> Iterator[Cluster]:
    """Make a cluster of `count` hosts with shape options such as ('--rate', '1gbit'); remove it after."""
    require_namespaces()
    name = name or unique_name()
    try:
        made = netcluster("up", "--name", name, "--hosts", str(count), *shape, "--watch-pid", str(os.getpid()))
        assert made.returncode == 0, f"netcluster up failed: {made.stderr}"
        yield Cluster.load(name)
    finally:
        hosts.down(name)


def leftovers(name: str) -> Sequence[str]:
    """Return what is left of cluster `name`: namespaces, its state directory, processes in it."""
    left = list(hosts.leftover_namespaces(name))
    if os.path.exists(hosts.state_dir(name)):
        left.append(hosts.state_dir(name))
    return left


def leftovers_of_this_run() -> Sequence[str]:
    """Return the names of this test process's clusters that still exist, after removing them."""
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("ip"):
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split()[0].rsplit("-", 1)[0] for line in out.splitlines() if line.startswith(_prefix())}
    names |= {name for name in hosts.clusters() if name.startswith(_prefix())}
    for name in names:
        hosts.down(name)
    return sorted(names)
