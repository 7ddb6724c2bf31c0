"""The command line of hpc/netcluster: up, run, link, pingpong, status, down, and slurm with the Slurm commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence

from psframework.cliparse import EXIT_USAGE, Parser
from psframework.fileio import atomic_write_json
from psframework.netcluster import hosts, jobs, slurm
from psframework.netcluster.hosts import Cluster, ClusterError, Unavailable
from psframework.netcluster.shaping import LinkShape, ShapeError, format_rate, format_time

PROG = "netcluster"
DEFAULT_NAME = "psf"


def say(message: str) -> None:
    """Print a progress or result line on standard error."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def add_shape_options(parser: argparse.ArgumentParser) -> None:
    """Add --rate, --delay, --jitter and --loss (each direction of a host's cable)."""
    parser.add_argument("--rate", help="line rate of each direction, e.g. 1gbit, 100mbit (none: unlimited)")
    parser.add_argument("--delay", help="delay each direction adds, e.g. 100us; a message between two "
                                        "hosts crosses two cables, so it takes both hosts' delays")
    parser.add_argument("--jitter", help="random variation of the delay, e.g. 20us")
    parser.add_argument("--loss", help="packets dropped in each direction, e.g. 5%%")


def shape_of(args: argparse.Namespace, base: LinkShape) -> Optional[LinkShape]:
    """Return `base` changed by the shape options given, or None when none is."""
    given = {k: getattr(args, k) for k in ("rate", "delay", "jitter", "loss") if getattr(args, k) is not None}
    return base.merged(**given) if given else None


def cmd_up(args: argparse.Namespace) -> int:
    shape = shape_of(args, LinkShape()) or LinkShape()
    cluster = hosts.up(args.name, args.hosts, shape, args.watch_pid)
    say(f"cluster {args.name}: {args.hosts} hosts, each link {shape.describe()}")
    for host in range(cluster.hosts):
        say(f"host {host}: namespace {cluster.namespace(host)}, address {hosts.host_address(host)}")
    say(f"up; remove it with: hpc/netcluster down --name {args.name}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    names = hosts.clusters() if args.all else [args.name]
    for name in names:
        removed = hosts.down(name)
        say(f"cluster {name}: " + (f"removed {len(removed)} namespaces and files" if removed else "nothing left"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    rows = [{"host": h, "namespace": cluster.namespace(h), "address": hosts.host_address(h),
             "link": "down" if h in cluster.cut else "up", "shape": cluster.shapes[h].describe()}
            for h in range(cluster.hosts)]
    if args.json:
        print(json.dumps({"name": cluster.name, "hosts": rows, "counters": hosts.counters(cluster)}))
        return 0
    for row in rows:
        print(f"host {row['host']}  {row['namespace']:<12} {row['address']:<14} link {row['link']:<4} {row['shape']}")
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    cluster.check_host(args.host)
    shape = shape_of(args, cluster.shapes[args.host])
    if shape is None and args.state is None:
        raise ClusterError("link: nothing to change: give --rate, --delay, --jitter, --loss, --down or --up")
    hosts.set_link(cluster, args.host, shape, args.state)
    say(f"host {args.host}: link {'down' if args.host in cluster.cut else 'up'}, "
        f"{cluster.shapes[args.host].describe()}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    psf_args = args.psf_args[1:] if args.psf_args[:1] == ["--"] else args.psf_args
    if not psf_args:
        raise ClusterError("run: no psf arguments given (e.g. run -n 5 -- train configs/digits_sazd.yaml)")
    if args.n < 1:
        raise ClusterError(f"-n: got {args.n}, expected a positive number of ranks")
    say(f"{args.n} ranks on {cluster.hosts} hosts of cluster {cluster.name} (rank r on host r mod "
        f"{cluster.hosts}), every pair of ranks over the hosts' links")
    done, moved = jobs.run_job(cluster, args.n, jobs.psf_program(psf_args), args.timeout)
    report_traffic(cluster, moved, args.traffic)
    return done.returncode


def report_traffic(cluster: Cluster, moved: List[Dict[str, int]], path: Optional[str]) -> None:
    """Print what crossed each host's link, and write it as JSON to `path` if given."""
    for host, m in enumerate(moved):
        say(f"host {host} link: sent {m['tx_bytes'] / 1e6:.2f} MB, received {m['rx_bytes'] / 1e6:.2f} MB")
    if path:
        atomic_write_json(path, {"cluster": cluster.name, "hosts": moved})


def cmd_pingpong(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    for host in (args.a, args.b):
        cluster.check_host(host)
    if args.a == args.b:
        raise ClusterError(f"pingpong: hosts {args.a} and {args.b}: expected two different hosts")
    program = [sys.executable, "-m", "mpi4py", "-m", "psframework.netcluster.pingpong", "--size", str(args.size),
               "--repeats", str(args.repeats)]
    done, _ = jobs.run_job(cluster, 2, program, timeout_s=args.timeout, capture=True, placement=[args.a, args.b])
    if done.returncode != 0:
        raise ClusterError(f"pingpong: the job failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["expected_latency_s"] = cluster.shapes[args.a].delay_s + cluster.shapes[args.b].delay_s
    figures["rate_bps"] = min(filter(None, [cluster.shapes[args.a].rate_bps, cluster.shapes[args.b].rate_bps]),
                              default=None)
    if args.json:
        print(json.dumps(figures))
    else:
        rate = format_rate(figures["rate_bps"]) if figures["rate_bps"] else "unlimited"
        print(f"hosts {args.a} -> {args.b}: latency {format_time(figures['latency_s'])} (links add "
              f"{format_time(figures['expected_latency_s'])}), {figures['bandwidth_bps'] / 1e9:.3f} Gb/s for "
              f"{args.size / 2**20:g} MiB messages (links shaped to {rate})")
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    slurm.require_slurm(say)
    say(f"starting Slurm on cluster {cluster.name}: slurmctld on {cluster.switch} ({hosts.SWITCH_ADDRESS}), "
        f"a slurmd on each of its {cluster.hosts} hosts")
    slurm.start(cluster, args.cpus)
    say(f"Slurm is up: nodes {cluster.hostname(0)}..{cluster.hostname(cluster.hosts - 1)}, {args.cpus} CPUs "
        f"each, partition {cluster.name}; files in {slurm.slurm_dir(cluster)}")
    say(f"submit with: hpc/netcluster sbatch --name {cluster.name} --nodes={cluster.hosts} jobs/multi-node.sbatch "
        "CONFIG")
    return 0


def cmd_slurm_command(args: argparse.Namespace) -> int:
    cluster = Cluster.load(args.name)
    return slurm.run_command(cluster, args.verb, args.args, timeout_s=None).returncode


def slurm_command_args(argv: Sequence[str]) -> Optional[argparse.Namespace]:
    """Return a Slurm command verb's cluster name and arguments, or None for other verbs.

    Its arguments go to the Slurm command untouched (sbatch's own options among them), so only a
    leading --name is read here.
    """
    if not argv or argv[0] not in slurm.COMMANDS:
        return None
    rest, name = list(argv[1:]), DEFAULT_NAME
    if rest[:1] == ["--name"] and len(rest) > 1:
        name, rest = rest[1], rest[2:]
    elif rest[:1] and rest[0].startswith("--name="):
        name, rest = rest[0].split("=", 1)[1], rest[1:]
    return argparse.Namespace(verb=argv[0], name=name, args=rest, handler=cmd_slurm_command)


def cmd_reap(args: argparse.Namespace) -> int:
    hosts.reap(args.name, args.pid)
    return 0


def build_parser() -> Parser:
    """Return the parser of every verb."""
    parser = Parser(prog=PROG, description="A cluster of hosts on one machine: network namespaces, veth "
                                           "cables, a bridge as the switch, tc-shaped links.")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)

    def verb(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help, description=help)
        sub.add_argument("--name", default=DEFAULT_NAME, help=f"the cluster's name (default {DEFAULT_NAME})")
        sub.set_defaults(handler=handler)
        return sub

    up = verb("up", cmd_up, "make a cluster of N hosts")
    up.add_argument("--hosts", type=int, required=True)
    add_shape_options(up)
    up.add_argument("--watch-pid", type=int, help="remove the cluster once this process has ended")
    down = verb("down", cmd_down, "remove a cluster: processes, namespaces, daemons and files")
    down.add_argument("--all", action="store_true", help="every cluster that is up")
    status = verb("status", cmd_status, "show the hosts, their addresses and links")
    status.add_argument("--json", action="store_true")
    link = verb("link", cmd_link, "change one host's link while jobs run")
    link.add_argument("host", type=int, help="host number, 0..N-1 (rank r runs on host r mod N)")
    add_shape_options(link)
    link.add_argument("--down", dest="state", action="store_const", const="down", help="cut the link")
    link.add_argument("--up", dest="state", action="store_const", const="up", help="mend the link")
    run = verb("run", cmd_run, "run psf on the cluster's hosts: rank r on host r mod N")
    run.add_argument("-n", type=int, required=True, help="number of ranks")
    run.add_argument("--timeout", type=float, help="end the job after this many seconds (MPIEXEC_TIMEOUT)")
    run.add_argument("--traffic", help="write the bytes each host's link carried to this JSON file")
    run.add_argument("psf_args", nargs=argparse.REMAINDER, help="-- then the psf command line")
    pingpong = verb("pingpong", cmd_pingpong, "measure the latency and bandwidth between two hosts")
    pingpong.add_argument("a", type=int, nargs="?", default=0)
    pingpong.add_argument("b", type=int, nargs="?", default=1)
    pingpong.add_argument("--size", type=int, default=64 << 20, help="bytes of the large message (64 MiB)")
    pingpong.add_argument("--repeats", type=int, default=5)
    pingpong.add_argument("--timeout", type=float, default=300)
    pingpong.add_argument("--json", action="store_true")
    slurm_verb = verb("slurm", cmd_slurm, "start a Slurm whose nodes are the cluster's hosts (down removes it)")
    slurm_verb.add_argument("--cpus", type=int, default=slurm.DEFAULT_CPUS,
                            help=f"CPUs each node declares (default {slurm.DEFAULT_CPUS})")
    for name in slurm.COMMANDS:
        command = verb(name, cmd_slurm_command, f"run {name} against the cluster's Slurm: hpc/netcluster {name} "
                                                f"[--name NAME] {name.upper()}-ARGS")
        command.add_argument("args", nargs=argparse.REMAINDER, help=f"{name}'s own arguments")
    reap = verb("reap", cmd_reap, argparse.SUPPRESS)
    reap.add_argument("--pid", type=int, required=True)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one verb; exit 0, 2 on a bad request, 3 where no cluster can be made, or the job's status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = slurm_command_args(argv) or build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except Unavailable as exc:
        say(f"unavailable: {exc}")
        return hosts.UNAVAILABLE
    except (ClusterError, ShapeError) as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
