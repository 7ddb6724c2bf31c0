"""The topology of a run: how many servers, and what each rank's side is given to talk to the others.

This is the one place that looks at `train.servers` and `comm.dissemination`: it starts the node,
builds the links, the group and the dissemination a side gets, and the registry picks the sides'
classes (`Scheme.sides`). The schemes see one `Group` and one link whatever the topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Union

from psframework.comm.links import ServerLink, WorkerLink
from psframework.comm.rounds import SETUP_PATIENCE
from psframework.runtime.node import RANK_LOSS, Node, start_node
from psframework.schemes.coded.dissemination import dissemination_of
from psframework.schemes.groups import Group, ServerGroup, SoleServer
from psframework.schemes.registry import Scheme
from psframework.settings import Settings


@dataclass
class Topology:
    """This rank's node with the classes of its side, its link and (on servers) its group."""

    node: Node
    side: Callable[..., Any]  # builds this rank's side (its class, given what the topology chose)
    link: Union[ServerLink, WorkerLink]  # ServerLink on servers, WorkerLink on workers
    group: Optional[Group] = None


def join(settings: Settings, scheme: Scheme, comm: Any) -> Topology:
    """Start this rank's node (collective) and return what its side is built from."""
    servers = settings.run.servers
    dissemination = dissemination_of(settings) if scheme.coded else None
    sharded = servers > 1 and scheme.shards_parameters
    node = start_node(settings.transport, comm, peers=dissemination is not None and dissemination.peers,
                      device=settings.device, groups=servers, shards=sharded)
    server, worker = scheme.sides(servers)
    side = scheme.load(server if node.roles.is_server else worker)
    if dissemination is not None:
        side = partial(side, dissemination=dissemination)
    if node.roles.is_server:
        smoothing = settings.optim.label_smoothing
        group = ServerGroup(node.across, node.roles.group, servers, smoothing) if servers > 1 else SoleServer(smoothing)
        return Topology(node, side, server_link(settings, node), group)
    return Topology(node, side, worker_link(node))


def server_link(settings: Settings, node: Node) -> ServerLink:
    """Return a server's link to its workers (a sharded server's: over its shard's communicator)."""
    from psframework.comm.server_link import MPIServerLink

    roles, transport = node.shards[0] if node.shards else (node.roles, node.transport)
    timeout = transport.resolve_timeout()
    # A send to a dead rank may never return (MPICH over OFI's TCP provider retries it for ever).
    RANK_LOSS.stall_s = None if timeout is None else SETUP_PATIENCE * timeout
    return MPIServerLink(transport, roles.workers, roles, node.emulation, detach_after=detach_after(settings),
                         lost=RANK_LOSS, detach_after_s=settings.transport.detach_after_s)


def worker_link(node: Node) -> WorkerLink:
    """Return a worker's link to its server, or to every shard's server (joined into one link)."""
    from psframework.comm.worker_link import MPIWorkerLink, ShardedWorkerLink

    if node.shards:
        return ShardedWorkerLink([MPIWorkerLink(t, r, lost=RANK_LOSS) for r, t in node.shards])
    return MPIWorkerLink(node.transport, node.roles, node.peers, across=node.across, all_workers=node.all_workers,
                         lost=RANK_LOSS)


def detach_after(settings: Settings) -> Optional[int]:
    """Return how far a worker may lag before its server detaches it; None: never.

    With several servers no worker is detached: DEU workers sum their coded gradients with the
    workers of the same packet in the other groups every update (Stanza's workers their conv
    gradients with every worker), so a worker that skipped ahead would pair its sums with the wrong
    iteration's; and a worker of sharded servers would have to rejoin each of them. A slow worker is
    waited for or, with backup workers, left out of the rounds it is late for.
    """
    return None if settings.run.servers > 1 else settings.transport.detach_after
