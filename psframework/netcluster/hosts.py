"""Build, shape, cut and remove a cluster of hosts: one network namespace per host, a veth cable from
each host to a bridge in a switch namespace of its own, addresses in 198.18.0.0/15 (RFC 2544, reserved
for network benchmarks). Nothing is connected to the machine's own interfaces: no default route, no
cable to the root namespace, nothing forwarded, so no packet leaves the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from psframework.fileio import atomic_write_json
from psframework.netcluster.shaping import NO_NETEM, LinkShape, clear_commands, tc_commands

STATE_ROOT = "/run/psf-netcluster"
DEVICE = "eth0"  # every host's interface has this name inside its namespace
BRIDGE = "br0"
PREFIX_LEN = 15  # 198.18.0.0/15: every host and the switch on one link
SWITCH_ADDRESS = "198.19.255.254"  # the switch namespace's own address, where the cluster's slurmctld listens
NAME_PATTERN = r"[a-z][a-z0-9]{0,9}"
MAX_HOSTS = 1000
UNAVAILABLE = 3  # exit status: no root, or no network namespaces here


class ClusterError(Exception):
    """A verb cannot go ahead as asked: one line says why (exit status 2)."""


class Unavailable(ClusterError):
    """This machine cannot hold a cluster: not root, or no network namespaces (exit status 3)."""


def host_address(index: int) -> str:
    """Return host `index`'s address: 198.18.0.1, 198.18.0.2, ... (250 to a third octet)."""
    return f"198.18.{index // 250}.{index % 250 + 1}"


@dataclasses.dataclass
class Cluster:
    """A cluster's names, size and link shapes, kept in STATE_ROOT/NAME/cluster.json while it is up."""

    name: str
    hosts: int
    shapes: List[LinkShape]
    cut: List[int] = dataclasses.field(default_factory=list)  # hosts whose link is down
    reaper_pid: Optional[int] = None

    @property
    def state_dir(self) -> str:
        """Return the directory of the cluster's files (state, Slurm's configuration and spools)."""
        return state_dir(self.name)

    @property
    def switch(self) -> str:
        """Return the switch's namespace."""
        return f"{self.name}-sw"

    def namespace(self, host: int) -> str:
        """Return host `host`'s namespace."""
        return f"{self.name}-h{host}"

    def hostname(self, host: int) -> str:
        """Return the host name its processes see."""
        return f"{self.name}-h{host}"

    def port(self, host: int) -> str:
        """Return the switch's end of host `host`'s cable."""
        return f"p{host}"

    def check_host(self, host: int) -> None:
        """Raise ClusterError unless `host` is one of the cluster's hosts."""
        if not 0 <= host < self.hosts:
            raise ClusterError(f"host: got {host}, expected 0..{self.hosts - 1} (cluster {self.name} "
                               f"has {self.hosts} hosts)")

    def save(self) -> None:
        """Write the state file atomically."""
        state = dataclasses.asdict(self)
        atomic_write_json(os.path.join(self.state_dir, "cluster.json"), state)

    @classmethod
    def load(cls, name: str) -> "Cluster":
        """Return the cluster that is up under `name`; ClusterError if there is none."""
        check_name(name)
        path = os.path.join(state_dir(name), "cluster.json")
        if not os.path.exists(path):
            raise ClusterError(f"no cluster named {name!r} is up (hpc/netcluster up --name {name} --hosts N)")
        with open(path) as fh:
            state = json.load(fh)
        state["shapes"] = [LinkShape(**s) for s in state["shapes"]]
        return cls(**state)


def as_host(hostname: str) -> List[str]:
    """Return the command prefix that runs a program under host name `hostname` (a UTS namespace of its own)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]


def state_dir(name: str) -> str:
    """Return the directory of cluster `name`'s files."""
    return os.path.join(STATE_ROOT, name)


def check_name(name: str) -> None:
    """Raise ClusterError unless `name` is a short lower-case name (it prefixes every namespace)."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise ClusterError(f"--name: got {name!r}, expected a lower-case letter then up to 9 letters or digits")


def require_namespaces() -> None:
    """Raise Unavailable unless this process is root and can make network namespaces."""
    if sys.platform != "linux":
        raise Unavailable(f"network namespaces need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        raise Unavailable("network namespaces and tc need root (run as root or with sudo)")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} is not installed (Debian: apt-get install iproute2 util-linux)")
    probe = f"psfprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        raise Unavailable(f"cannot make a network namespace here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)


def sh(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a system command; with `check`, a failure raises ClusterError with its message."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def in_namespace(namespace: str, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a command inside a namespace."""
    return sh(["ip", "netns", "exec", namespace, *argv], check)


def up(name: str, hosts: int, shape: LinkShape, watch_pid: Optional[int] = None) -> Cluster:
    """Make the cluster: namespaces, cables, the switch, addresses and shaped links.

    A failure part way removes what was made. With `watch_pid`, a reaper process removes the cluster
    once that process has ended (a test killed by its timeout leaves nothing behind).
    """
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise ClusterError(f"--hosts: got {hosts}, expected 1..{MAX_HOSTS}")
    require_namespaces()
    if os.path.exists(state_dir(name)) or leftover_namespaces(name):
        raise ClusterError(f"a cluster named {name!r} is up already (hpc/netcluster down --name {name} first)")
    cluster = Cluster(name, hosts, [shape] * hosts)
    os.makedirs(cluster.state_dir, mode=0o755)
    try:
        cluster.save()
        _make_switch(cluster)
        for host in range(hosts):
            _make_host(cluster, host)
        if watch_pid is not None:
            cluster.reaper_pid = start_reaper(name, watch_pid)
        cluster.save()
    except BaseException:
        down(name)
        raise
    return cluster


def _make_switch(cluster: Cluster) -> None:
    sw = cluster.switch
    sh(["ip", "netns", "add", sw])
    in_namespace(sw, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=0"])
    sh(["ip", "-n", sw, "link", "set", "lo", "up"])
    sh(["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
    sh(["ip", "-n", sw, "addr", "add", f"{SWITCH_ADDRESS}/{PREFIX_LEN}", "dev", BRIDGE])
    sh(["ip", "-n", sw, "link", "set", BRIDGE, "up"])


def _make_host(cluster: Cluster, host: int) -> None:
    ns, sw, port = cluster.namespace(host), cluster.switch, cluster.port(host)
    sh(["ip", "netns", "add", ns])
    sh(["ip", "link", "add", DEVICE, "netns", ns, "type", "veth", "peer", "name", port, "netns", sw])
    sh(["ip", "-n", sw, "link", "set", port, "master", BRIDGE])
    sh(["ip", "-n", sw, "link", "set", port, "up"])
    sh(["ip", "-n", ns, "link", "set", "lo", "up"])
    sh(["ip", "-n", ns, "addr", "add", f"{host_address(host)}/{PREFIX_LEN}", "dev", DEVICE])
    sh(["ip", "-n", ns, "link", "set", DEVICE, "up"])
    shape_link(cluster, host, cluster.shapes[host])


def shape_link(cluster: Cluster, host: int, shape: LinkShape) -> None:
    """Shape both directions of host `host`'s cable: its interface's egress and the switch port's."""
    for namespace, device in ((cluster.namespace(host), DEVICE), (cluster.switch, cluster.port(host))):
        for command in clear_commands(device):
            in_namespace(namespace, command, check=False)
        for command in tc_commands(device, shape):
            done = in_namespace(namespace, command, check=False)
            if done.returncode != 0 and "netem" in command and "unknown" in done.stderr:
                raise Unavailable(f"--delay: {NO_NETEM}")
            if done.returncode != 0:
                raise ClusterError(f"{' '.join(command)}: {done.stderr.strip()}")
    cluster.shapes[host] = shape


def set_link(cluster: Cluster, host: int, shape: Optional[LinkShape], state: Optional[str]) -> None:
    """Reshape host `host`'s link and/or cut it ('down') or mend it ('up') at the switch, and save."""
    cluster.check_host(host)
    if shape is not None:
        shape_link(cluster, host, shape)
    if state is not None:
        # Pulled at the switch, as a cable is: the host's interface loses its carrier, sockets stay open.
        sh(["ip", "-n", cluster.switch, "link", "set", cluster.port(host), state])
        cluster.cut = sorted(set(cluster.cut) - {host} | ({host} if state == "down" else set()))
    cluster.save()


def counters(cluster: Cluster) -> List[Dict[str, int]]:
    """Return every host interface's byte counters: [{'tx_bytes', 'rx_bytes'}, ...] by host."""
    found = []
    for host in range(cluster.hosts):
        out = sh(["ip", "-j", "-s", "-n", cluster.namespace(host), "link", "show", "dev", DEVICE]).stdout
        stats = json.loads(out)[0]["stats64"]
        found.append({"tx_bytes": int(stats["tx"]["bytes"]), "rx_bytes": int(stats["rx"]["bytes"])})
    return found


def leftover_namespaces(name: str) -> List[str]:
    """Return the namespaces of cluster `name` that exist, whole or half made."""
    out = sh(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if re.fullmatch(rf"{re.escape(name)}-(sw|h\d+)", n)]


def down(name: str) -> List[str]:
    """Remove everything cluster `name` made: its processes, namespaces and files; return what went.

    Safe on a cluster half made or already gone; works from the namespaces that exist, not from the
    state file, so it also cleans up after a killed `up`.
    """
    check_name(name)
    removed = []
    namespaces = leftover_namespaces(name)
    for namespace in namespaces:  # processes first: a namespace with processes in it outlives its deletion
        kill_all(namespace)
    for namespace in namespaces:
        sh(["ip", "netns", "delete", namespace], check=False)
        removed.append(namespace)
    _stop_reaper(name)
    if os.path.isdir(state_dir(name)):
        shutil.rmtree(state_dir(name), ignore_errors=True)
        removed.append(state_dir(name))
    return removed


def kill_all(namespace: str) -> None:
    """Kill every process in `namespace` (ranks and daemons), and wait a little for them to go."""
    for _ in range(50):
        out = sh(["ip", "netns", "pids", namespace], check=False).stdout
        pids = [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def clusters() -> List[str]:
    """Return the names of the clusters that are up (with a state directory)."""
    if not os.path.isdir(STATE_ROOT):
        return []
    return sorted(n for n in os.listdir(STATE_ROOT) if re.fullmatch(NAME_PATTERN, n))


def start_reaper(name: str, watch_pid: int) -> int:
    """Start a detached process that removes cluster `name` once process `watch_pid` has ended."""
    reaper = subprocess.Popen([sys.executable, "-m", "psframework.netcluster", "reap", "--name", name,
                               "--pid", str(watch_pid)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return reaper.pid


def reap(name: str, watch_pid: int, poll_s: float = 0.5) -> None:
    """Wait until process `watch_pid` ends or the cluster is gone; then remove the cluster."""
    while _alive(watch_pid) and os.path.isdir(state_dir(name)):
        time.sleep(poll_s)
    if os.path.isdir(state_dir(name)) or leftover_namespaces(name):
        down(name)


def _stop_reaper(name: str) -> None:
    path = os.path.join(state_dir(name), "cluster.json")
    try:
        with open(path) as fh:
            pid = json.load(fh).get("reaper_pid")
    except (OSError, ValueError):
        return
    if pid and pid != os.getpid() and _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
