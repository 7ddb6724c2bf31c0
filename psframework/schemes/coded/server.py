"""The server side of coded model-parallel training over MPI: `sazd`, `poly` and `uncoded`.

Rank 0 decodes every conv layer's output from the first k replies, applies BatchNorm/ReLU/pooling,
runs the FC head and decodes input gradients; ranks 1..n (worker.py) hold packet j of each conv
layer's row- and column-coded weights and update them themselves (distributed encoding and
updating). The base class here also carries the naive scheme (naive.py).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from psframework.comm.envelope import Phase
from psframework.comm.links import ServerLink
from psframework.comm.rounds import Msg
from psframework.models import Placement
from psframework.runtime.stragglers import Stragglers
from psframework.schemes.coded.core import DecodingServer
from psframework.schemes.coded.dissemination import Dissemination
from psframework.schemes.coded.exchange import MpiExchange, Payloads
from psframework.schemes.coded.plan import Command
from psframework.schemes.coded.setup import CodedSetup
from psframework.schemes.coded.state import (Momentum, conv_state_tensors, decode_conv_state, rel_diff,
                                             worker_state_shapes)
from psframework.schemes.common import Step, conv_optimizer, head_optimizer
from psframework.schemes.driver import Problem, Schedule, ServerSide, StepResult
from psframework.schemes.groups import Group, sync_bytes
from psframework.schemes.vectors import pack, unpack
from psframework.settings import Settings


class CommandServerBase(ServerSide):
    """Rank 0 of a coded scheme: sends the command plan, one round per conv layer and pass, and decodes each
    from the first k replies."""

    # The workers hold the coded weights and update them in every backward pass.
    distributed_encoding_and_updating = True

    def __init__(self, settings: Settings, problem: Problem, link: ServerLink, group: Optional[Group] = None,
                 dissemination: Optional[Dissemination] = None) -> None:
        super().__init__(settings, problem, link, group)
        setup = self.setup = CodedSetup.of(settings, self.model, self.distributed_encoding_and_updating, dissemination)
        self.conv_modules = [dict(self.model.named_modules())[n] for n in setup.placement.coded_names]
        self.stragglers = Stragglers(settings.stragglers, link.job_workers)
        if settings.code.subsets == "rotate":
            link.rotate_subsets(setup.k)
        link.require(setup.k)
        self.optimizers = self.server_optimizers() + self.conv_optimizers()
        self.exchange = MpiExchange(link, setup, self.payloads)
        self.core = DecodingServer(self.model, setup.code, setup.codings, setup.plan, self.optimizers, self.exchange,
                                   self.group, settings.optim.precision, self.scaler)

    def server_optimizers(self) -> List[torch.optim.Optimizer]:
        """Return the optimizers of what always trains on rank 0: the head and the uncoded trunk layers."""
        coded = self.setup.placement.worker_parameter_names()
        head = [p for key, p in self.model.named_parameters() if key in self.setup.placement.head]
        head_names = self.setup.placement.head
        local = [p for key, p in self.model.named_parameters() if key not in coded and key not in head_names]
        return ([head_optimizer(self.settings.optim, head)] if head else []) + \
            ([conv_optimizer(self.settings.optim, local, "sgd")] if local else [])

    def conv_optimizers(self) -> List[torch.optim.Optimizer]:
        """Return rank 0's optimizers of the coded convolutions (none where the workers update them)."""
        return []

    @abstractmethod
    def payloads(self, command: Command, x: torch.Tensor) -> Payloads:
        """Return what each worker gets for a pass of the plan (see exchange.Payloads)."""

    def describe(self) -> str:
        return f", {self.setup.code!r}, dissemination {self.setup.dissemination.mode}"

    def step(self, step: Step) -> StepResult:
        self.exchange.begin(step.iteration)
        self.group.begin(len(step.indices))
        images, labels = self.problem.dataset.train_batch(self.batch_indices(step), step.epoch)
        loss = self.core.step(images, labels, step.first, step.last, step.share)
        timings = {**self.exchange.timings(), **self.core.timings()}
        delays = {str(r): f for r, f in self.stragglers.factors(step.iteration).items() if f}
        return StepResult(loss, timings, {**self.link.iteration_fields(), **self.group.fields(),
                                          "straggler_delays": delays})


class DecodingServerSide(CommandServerBase):
    """Rank 0 of `sazd`, `poly` and `uncoded`: only decodes; the workers encode and update the coded weights."""

    def __init__(self, settings: Settings, problem: Problem, link: ServerLink, group: Optional[Group] = None,
                 dissemination: Optional[Dissemination] = None) -> None:
        super().__init__(settings, problem, link, group, dissemination)
        self.momentum: Optional[Momentum] = None
        self.verify_max = 0.0

    def payloads(self, command: Command, x: torch.Tensor) -> Payloads:
        coding = self.setup.codings[command.layer]
        if command.phase == Phase.BACKWARD and not coding.has_column_copy:
            # Worker j only needs SA_j(dY) to update a layer without a column copy: send just that.
            return Payloads([p.contiguous() for p in coding.encode(self.setup.code, x, 1)])
        return Payloads(self.setup.dissemination.packets(x))

    def start(self, schedule: Schedule) -> None:
        """Send every worker the uncoded conv state; each encodes its own packets."""
        self.link.send(self.conv_state(), Msg.params(schedule.start))

    def conv_state(self) -> torch.Tensor:
        """Return the uncoded weights and momentum of the coded convolutions as one flat vector."""
        return pack(conv_state_tensors(self.model, self.setup.placement.coded_names, self.momentum))

    def sync(self, iteration: int, verify: bool) -> Dict[str, Any]:
        """Decode the conv weights (and momentum) from k workers' state into rank 0's model."""
        verify = verify and len(self.link.live) > self.setup.k
        states = self.link.round(torch.zeros(1), Msg.state(iteration), Msg.state_reply(iteration),
                                 self.setup.k + 1 if verify else self.setup.k, rotate=False)
        return self.load_worker_states(states, verify)

    def readmission_state(self, index: int, iteration: int) -> Any:
        """Decode the current conv state from k live workers; return it uncoded (the worker encodes its packets)."""
        accumulate = self.settings.optim.accumulate
        if (iteration - 1) % accumulate:
            # Readmissions wait for an optimizer step's start; only too few live workers bring one here.
            raise RuntimeError(f"worker {index} rejoins at iteration {iteration}, inside an optimizer step of "
                               f"train.accumulate={accumulate} micro-batches whose gradients it does not hold; "
                               "resume from the last checkpoint")
        states = self.link.round(torch.zeros(1), Msg.snapshot(iteration), Msg.snapshot_reply(iteration), self.setup.k,
                                 rotate=False)
        self.load_worker_states(states, verify=False)
        return self.conv_state()

    def load_worker_states(self, states: Any, verify: bool) -> Dict[str, Any]:
        """Decode the conv weights and momentum from the replies into rank 0's model; verify if asked."""
        setup = self.setup
        shapes = worker_state_shapes(setup.codings, setup.code)
        per_worker = {j: unpack(s, shapes) for j, s in states.data.items()}
        layers = decode_conv_state(setup.code, setup.codings, dict(itertools.islice(per_worker.items(), setup.k)))
        with torch.no_grad():
            for conv, layer in zip(self.conv_modules, layers):
                conv.weight.copy_(layer["weight"])
                if conv.bias is not None:
                    conv.bias.copy_(layer["bias"])
        self.momentum = [{key: None if layer[key] is None else layer[key].clone()
                          for key in ("weight_momentum", "bias_momentum")} for layer in layers]
        if not verify:
            return {}
        diff = self.verify(per_worker, layers)
        self.verify_max = max(self.verify_max, diff)
        return {"verify_max_rel_diff": diff}

    def verify(self, per_worker: Dict[int, List[torch.Tensor]], layers: List[Dict[str, torch.Tensor]]) -> float:
        """Decode from a second k-subset and return the largest relative difference (row and column copies too)."""
        setup = self.setup
        again = decode_conv_state(setup.code, setup.codings, dict(itertools.islice(per_worker.items(), 1, setup.k + 1)))
        diffs = [rel_diff(a[key], b[key]) for a, b in zip(layers, again) for key in ("weight", "bias")
                 if a[key] is not None]
        diffs += [rel_diff(a["col_weight"], a["weight"]) for a in layers if a["col_weight"] is not None]
        return max(diffs)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "conv_momentum": self.momentum}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.momentum = state["conv_momentum"]

    def finish(self) -> Dict[str, Any]:
        verified = self.verify_max if self.settings.run.verify_every else None
        return {"code": repr(self.setup.code), "dissemination": self.setup.dissemination.mode,
                "verify_max_rel_diff": verified}


def expected_sync_bytes(settings: Settings, model: nn.Module, placement: Placement) -> int:
    """Return the payload bytes a server sums with the others per iteration of a DEU scheme with several groups:
    every parameter rank 0 steps (all but the coded convolutions, which the workers hold) and the BatchNorm
    sums (see groups.sync_bytes)."""
    return stepped_sync_bytes(model, placement.worker_parameter_names())


def stepped_sync_bytes(model: nn.Module, held: Any) -> int:
    """Return the bytes a server sums per iteration when it steps every parameter but those named in `held`."""
    stepped = sum(p.numel() for name, p in model.named_parameters() if name not in held)
    return sync_bytes(stepped, [m for m in model.modules() if isinstance(m, _BatchNorm)])
