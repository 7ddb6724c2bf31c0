"""A Slurm whose nodes are a cluster's hosts: slurmctld in the switch's namespace, one slurmd per host.

Each daemon runs inside its namespace with a host name of its own (a UTS namespace), so node
`NAME-hI` is host I: its slurmd, the job steps it starts and their ranks see that host name and reach
the others only over the host's cable. The configuration, state, spools, logs and pid files all lie
under the cluster's state directory (STATE_ROOT/NAME/slurm/) and the daemons listen on ports of
their own, so the machine's own Slurm (hpc/slurm-up.sh, /etc/slurm) is left alone. `down` ends every
process in the namespaces and removes the state directory, so nothing of this Slurm outlives it.
munged is the machine's and is shared with its own Slurm: it is started if it is not running, and
left running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from psframework.netcluster.hosts import (SWITCH_ADDRESS, Cluster, ClusterError, Unavailable,
                                          host_address, kill_all, sh)
from psframework.netcluster.jobs import MPICH_SRUN_NETWORK

CONTROLLER_PORT = 6917  # not Slurm's 6817/6818, which the machine's own Slurm uses
NODE_PORT = 6918
DEFAULT_CPUS = 32  # CPUs each node declares: more than the cores, as hpc/slurm-up.sh does
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("slurmctld", "slurmd", "sbatch", "munged", "nsenter")
COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "scontrol", "sinfo")
MUNGE_KEY = "/etc/munge/munge.key"
START_TIMEOUT_S = 60.0


def slurm_dir(cluster: Cluster) -> str:
    """Return the directory of the cluster's Slurm: configuration, state, spools, logs and pid files."""
    return os.path.join(cluster.state_dir, "slurm")


def conf_path(cluster: Cluster) -> str:
    """Return the cluster's slurm.conf."""
    return os.path.join(slurm_dir(cluster), "slurm.conf")


def node_name(cluster: Cluster, host: int) -> str:
    """Return host `host`'s Slurm node name (its host name)."""
    return cluster.hostname(host)


def config_text(cluster: Cluster, cpus: int, memory_mb: int) -> str:
    """Return the cluster's slurm.conf: the settings of hpc/slurm-up.sh, every path and port its own."""
    root = slurm_dir(cluster)
    lines = [
        f"# Slurm of netcluster {cluster.name}, written by hpc/netcluster slurm",
        f"ClusterName={cluster.name}",
        f"SlurmctldHost={cluster.switch}({SWITCH_ADDRESS})",
        f"SlurmctldPort={CONTROLLER_PORT}",
        f"SlurmdPort={NODE_PORT}",
        "AuthType=auth/munge",
        "AuthInfo=cred_expire=5",  # a requeued job may start again after 5 s (default 120, Slurm's least 5)
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",  # %n: the node's name, one spool per slurmd
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2",  # start a requeued job within 2 s of its becoming eligible
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=none",  # the job templates choose the plugin (pmi2 for MPICH)
        "ReturnToService=2",
        "JobRequeue=1",
        "KillWait=10",
        "MinJobAge=300",
        "SlurmdParameters=config_overrides",  # the nodes declare more CPUs than the machine has
    ]
    lines += [f"NodeName={node_name(cluster, h)} NodeAddr={host_address(h)} CPUs={cpus} RealMemory={memory_mb} "
              "State=UNKNOWN" for h in range(cluster.hosts)]
    lines.append(f"PartitionName={cluster.name} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
    return "\n".join(lines) + "\n"


def memory_per_node_mb(hosts: int) -> int:
    """Return the memory each node declares: the machine's, less 1 GiB, shared among its hosts."""
    with open("/proc/meminfo") as fh:
        total_kb = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    return max(1, (total_kb // 1024 - 1024) // hosts)


def require_slurm(say: Callable[[str], None] = lambda _: None) -> None:
    """Raise Unavailable unless this process is root and Slurm's and munge's programs are (or can be) installed.

    Missing programs are installed as hpc/slurm-up.sh installs them (Debian's packages); `say` tells so.
    """
    if os.geteuid() != 0:
        raise Unavailable("Slurm's daemons need root (run as root or with sudo)")
    if all(shutil.which(p) for p in PROGRAMS):
        return
    if shutil.which("apt-get") is None:
        raise Unavailable(f"Slurm is not installed and there is no apt-get to install {' '.join(PACKAGES)}")
    say(f"installing {' '.join(PACKAGES)} (Debian packages)")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=300)
        done = subprocess.run(install, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[-1]
            raise Unavailable(f"Slurm's packages did not install: {said}")
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        raise Unavailable(f"{', '.join(missing)} missing after installing {' '.join(PACKAGES)}")


def start_munge() -> None:
    """Start munged as hpc/slurm-up.sh does (a key of its own if there is none) unless it is running."""
    if sh(["pgrep", "-x", "munged"], check=False).returncode == 0:
        return
    if not os.path.exists(MUNGE_KEY) or os.path.getsize(MUNGE_KEY) == 0:
        sh(["mungekey", "--create", "--keyfile", MUNGE_KEY])
    os.makedirs("/run/munge", exist_ok=True)
    for path in ("/etc/munge", "/run/munge", "/var/lib/munge", "/var/log/munge"):
        if os.path.exists(path):
            sh(["chown", "-R", "munge:munge", path])
    os.chmod("/etc/munge", 0o700)
    os.chmod(MUNGE_KEY, 0o400)
    sh(["runuser", "-u", "munge", "--", "munged"])


def start(cluster: Cluster, cpus: int = DEFAULT_CPUS) -> None:
    """Start the cluster's Slurm and wait until every node is idle; a failure part way stops what was started."""
    if cpus < 1:
        raise ClusterError(f"--cpus: got {cpus}, expected a positive number of CPUs per node")
    require_slurm()
    if os.path.exists(slurm_dir(cluster)):
        raise ClusterError(f"cluster {cluster.name} has a Slurm already (hpc/netcluster down --name "
                           f"{cluster.name} removes the cluster and its Slurm)")
    try:
        root = slurm_dir(cluster)
        for sub in ["state", "log"] + [f"spool/{node_name(cluster, h)}" for h in range(cluster.hosts)]:
            os.makedirs(os.path.join(root, sub))
        with open(conf_path(cluster), "w") as fh:
            fh.write(config_text(cluster, cpus, memory_per_node_mb(cluster.hosts)))
        start_munge()
        start_daemon(cluster, cluster.switch, cluster.switch, ["slurmctld", "-c"], "slurmctld")
        for host in range(cluster.hosts):
            name = node_name(cluster, host)
            start_daemon(cluster, cluster.namespace(host), name, ["slurmd", "-c"], f"slurmd-{name}")
        wait_for_nodes(cluster, START_TIMEOUT_S)
    except BaseException:
        stop(cluster)
        raise


# Run in a mount namespace of the daemon's own, where /sys/class/net and /sys/devices/virtual/net are
# those of the host's network namespace (a sysfs mounted from inside it): UCX follows
# /sys/class/net/eth0 to find the interface's device and its bandwidth, and through the machine's
# /sys it would find the machine's own eth0 (a PCI card, or none) instead of the host's cable.
# $0 is the host name, $1 a scratch mount point; the arguments after them are the program.
HOST_VIEW = ('hostname "$0" && mount -t sysfs sysfs "$1" && mount --bind "$1/class/net" /sys/class/net && '
             'mount --bind "$1/devices/virtual/net" /sys/devices/virtual/net && umount "$1" && shift && exec "$@"')


def enter(namespace: str, hostname: str, scratch: str) -> List[str]:
    """Return the prefix that runs a program in `namespace` as host `hostname`, seeing the host's interfaces.

    nsenter and two bind mounts rather than `ip netns exec`, which would mount a whole /sys of the
    namespace's own without the machine's cgroup hierarchies: slurmd loads its cgroup plugin at
    start and fails without them. `scratch` is an empty directory to mount the namespace's sysfs on.
    """
    return ["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", HOST_VIEW, hostname, scratch]


def start_daemon(cluster: Cluster, namespace: str, hostname: str, argv: Sequence[str], log: str) -> None:
    """Start one daemon (it detaches itself); ClusterError with its log's last line if it does not start."""
    scratch = os.path.join(slurm_dir(cluster), "sys", hostname)
    os.makedirs(scratch, exist_ok=True)
    program = [*enter(namespace, hostname, scratch), argv[0], "-f", conf_path(cluster), *argv[1:]]
    with open(os.path.join(slurm_dir(cluster), "log", f"{log}.start"), "w+") as out:
        status = subprocess.run(program, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60).returncode
        out.seek(0)
        said = out.read().strip()
    if status != 0:
        raise ClusterError(f"{argv[0]} on {hostname} did not start (exit {status}): "
                           f"{said or last_line(os.path.join(slurm_dir(cluster), 'log', log + '.log'))}")


def last_line(path: str) -> str:
    """Return the last line of a log file, or say that there is none."""
    try:
        with open(path) as fh:
            lines = fh.read().strip().splitlines()
    except OSError:
        return f"no log at {path}"
    return lines[-1] if lines else f"{path} is empty"


def node_states(cluster: Cluster) -> Dict[str, str]:
    """Return every node's state as sinfo shows it ({} while slurmctld does not answer)."""
    done = run_command(cluster, "sinfo", ["-h", "-N", "-o", "%N %T"], capture=True)
    if done.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)


def wait_for_nodes(cluster: Cluster, timeout_s: float) -> None:
    """Wait until every node is idle; ClusterError naming the nodes that are not."""
    deadline = time.monotonic() + timeout_s
    states: Dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(cluster)
        if len(states) == cluster.hosts and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    late = {n: s for n, s in states.items() if s != "idle"} or "slurmctld does not answer"
    raise ClusterError(f"Slurm of cluster {cluster.name}: nodes not idle after {timeout_s:.0f} s: {late} "
                       f"(logs in {slurm_dir(cluster)}/log)")


def stop(cluster: Cluster) -> None:
    """End every process in the cluster's namespaces (daemons, steps, ranks) and remove its Slurm's files."""
    for namespace in [cluster.switch] + [cluster.namespace(h) for h in range(cluster.hosts)]:
        kill_all(namespace)
    shutil.rmtree(slurm_dir(cluster), ignore_errors=True)


def command_environment(cluster: Cluster) -> Dict[str, str]:
    """Return the environment of a Slurm command: this cluster's slurm.conf, and for the jobs it submits,
    MPICH on the hosts' interfaces (every pair of ranks over the links, never shared memory)."""
    return {**os.environ, "SLURM_CONF": conf_path(cluster), **MPICH_SRUN_NETWORK}


def command(cluster: Cluster, name: str, args: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """Return (argv, environment) of Slurm command `name` against the cluster's Slurm, from the switch's
    namespace (the only one beside the hosts' that reaches slurmctld)."""
    if name not in COMMANDS:
        raise ClusterError(f"{name}: expected one of {', '.join(COMMANDS)}")
    if not os.path.exists(conf_path(cluster)):
        raise ClusterError(f"cluster {cluster.name} has no Slurm (start it with: hpc/netcluster slurm "
                           f"--name {cluster.name})")
    return ["ip", "netns", "exec", cluster.switch, name, *args], command_environment(cluster)


def run_command(cluster: Cluster, name: str, args: Sequence[str], capture: bool = False,
                timeout_s: Optional[float] = 60.0) -> subprocess.CompletedProcess:
    """Run Slurm command `name` ARGS against the cluster's Slurm; return the completed process."""
    argv, env = command(cluster, name, args)
    return subprocess.run(argv, env=env, capture_output=capture, text=True, timeout=timeout_s)
