"""Cut a model into a trunk and a head with torch.fx: Stanza's conv part on the workers, the rest on rank 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from torch import fx, nn

from psframework.errors import ConfigError
from psframework.models.placement import Placement, trace_devices


@dataclass
class Cut:
    """A model cut in two: trunk(x) gives the features, head(features) the class scores; parameters are shared."""

    trunk: nn.Module
    head: nn.Module
    feature_shape: Tuple[int, ...]  # one sample's features


def cut_model(model: nn.Module, placement: Placement, name: str = "model") -> Cut:
    """Cut `model` before its placement's first head layer; ConfigError when it cannot be traced or cut there."""
    if placement.cut is None:
        raise ConfigError(f"model.split_at: model {name} has no nn.Linear after its last convolution; "
                          "name the module that starts the head on rank 0")
    where = placement.calls[placement.cut].name
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"model {name}: torch.fx cannot trace it to cut it for stanza ({type(exc).__name__}: "
                          f"{text}); use another scheme or make its forward traceable") from None
    nodes = list(graph.nodes)
    position = _cut_position(nodes, where, name)
    crossing = _crossing(nodes, position)
    if len(crossing) != 1 or crossing[0].op == "placeholder":
        names = ", ".join(n.name for n in crossing) or "none"
        raise ConfigError(f"model.split_at: cutting model {name} before {where!r} leaves {len(crossing)} values "
                          f"crossing the cut ({names}); the head must take exactly one tensor computed by the trunk")
    trunk, head = _trunk_graph(nodes, position, crossing[0]), _head_graph(nodes, position, crossing[0])
    trunk_module, head_module = _module(model, trunk), _module(model, head)
    return Cut(trunk_module, head_module, _feature_shape(trunk_module, placement.input_shape))


def _cut_position(nodes: Sequence[fx.Node], where: str, name: str) -> int:
    """Return the index of the first graph node that belongs to module `where`."""
    for i, node in enumerate(nodes):
        target = str(node.target)
        if node.op in ("call_module", "get_attr") and (target == where or target.startswith(where + ".")):
            return i
    raise ConfigError(f"model.split_at: torch.fx does not see module {where!r} of model {name} as a layer "
                      "it can cut before; name a module that the forward pass calls")


def _crossing(nodes: Sequence[fx.Node], position: int) -> List[fx.Node]:
    """Return the values made before the cut and used after it (parameters and constants aside)."""
    before = set(nodes[:position])
    found: Dict[fx.Node, None] = {}
    for node in nodes[position:]:
        for used in node.all_input_nodes:
            if used in before and used.op != "get_attr":
                found[used] = None
    return list(found)


def _trunk_graph(nodes: Sequence[fx.Node], position: int, features: fx.Node) -> fx.Graph:
    graph, env = fx.Graph(), {}
    for node in nodes[:position]:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(env[features])
    return graph


def _head_graph(nodes: Sequence[fx.Node], position: int, features: fx.Node) -> fx.Graph:
    graph = fx.Graph()
    env = {features: graph.placeholder("features")}

    def lookup(node: fx.Node) -> fx.Node:
        if node not in env:  # a parameter or constant fetched before the cut: fetch it again here
            env[node] = graph.node_copy(node, lookup)
        return env[node]

    for node in nodes[position:]:
        env[node] = graph.node_copy(node, lookup)
    return graph


def _module(model: nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """Return a module running `graph` on `model`'s own submodules and parameters, without unused ones."""
    module = fx.GraphModule(model, graph)
    module.graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    module.recompile()
    return module


def _feature_shape(trunk: nn.Module, input_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """Return the shape of one sample's features, computed on zeros (on the meta device for large inputs)."""
    from torch.func import functional_call

    device = trace_devices(trunk, input_shape)[0]
    # torch.zeros, not zeros_like: a like-copy of a meta tensor goes through torch's slow Python kernels.
    tensors = {key: torch.zeros(t.shape, dtype=t.dtype, device=device) for key, t in
               list(trunk.named_parameters()) + list(trunk.named_buffers())}
    with torch.no_grad():
        out = functional_call(trunk, tensors, (torch.zeros(2, *input_shape, device=device),))
    return tuple(out.shape[1:])
