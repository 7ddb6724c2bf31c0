"""What a coded scheme's server, workers and exchange share, built in one place: the code, the coded
layers, the command plan and the dissemination."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from torch import nn

from psframework.codes import Code
from psframework.models import Placement
from psframework.schemes.coded.dissemination import Dissemination, dissemination_of
from psframework.schemes.coded.layers import LayerCoding, code_of, layer_codings
from psframework.schemes.coded.plan import CommandPlan, command_plan
from psframework.schemes.common import placement_of
from psframework.settings import Settings


@dataclass(frozen=True)
class CodedSetup:
    """A coded run's code (n and k live here), the conv layers it codes and how, the plan and the delivery."""

    code: Code
    placement: Placement
    codings: List[LayerCoding]
    plan: CommandPlan
    dissemination: Dissemination
    # whether the workers hold the coded weights and update them (distributed encoding and updating)
    distributed_encoding_and_updating: bool

    @property
    def n(self) -> int:
        return self.code.n

    @property
    def k(self) -> int:
        return self.code.k

    @classmethod
    def of(cls, settings: Settings, model: nn.Module, distributed_encoding_and_updating: bool = True,
           dissemination: Optional[Dissemination] = None) -> "CodedSetup":
        """Build the set-up of `model` (a meta model will do) under the settings' code and dissemination."""
        code = code_of(settings.code)
        placement = placement_of(settings, model)
        return cls(code=code, placement=placement,
                   codings=layer_codings(placement, code.k, settings.code.symbol_size),
                   plan=command_plan(model, placement, distributed_encoding_and_updating, settings.model.name),
                   dissemination=dissemination or dissemination_of(settings),
                   distributed_encoding_and_updating=distributed_encoding_and_updating)
