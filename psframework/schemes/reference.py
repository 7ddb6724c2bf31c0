"""Single-process reference trainer: the correctness oracle of every distributed scheme."""

from __future__ import annotations

from typing import Any, Dict, Optional

from psframework.models import split_parameters
from psframework.schemes.common import Step, conv_optimizer, head_optimizer, placement_of, resolve_device
from psframework.comm.links import ServerLink
from psframework.schemes.driver import Problem, ServerSide, StepResult
from psframework.schemes.groups import Group
from psframework.schemes.recipe import autocast, step_scaled, training_loss
from psframework.settings import Settings


class ReferenceTrainer(ServerSide):
    """The whole model in this process: plain forward, backward and optimizer steps."""

    def __init__(self, settings: Settings, problem: Problem, link: Optional[ServerLink] = None,
                 group: Optional[Group] = None) -> None:
        super().__init__(settings, problem, link, group)
        self.device = resolve_device(settings.device)  # build_problem put the model and data there
        trunk, head = split_parameters(self.model, placement_of(settings, self.model))
        self.optimizers = ([conv_optimizer(settings.optim, trunk)] if trunk else []) + \
            ([head_optimizer(settings.optim, head)] if head else [])

    def step(self, step: Step) -> StepResult:
        optim = self.settings.optim
        images, labels = self.problem.dataset.train_batch(step.indices, step.epoch)
        if step.first:
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        with autocast(optim.precision, self.device):
            loss = training_loss(self.model(images), labels, optim.label_smoothing)
        (loss * (step.share * self.scaler.factor)).backward()
        if step.last:
            step_scaled(self.scaler, self.optimizers)
        return StepResult(float(loss.detach()))

    def finish(self) -> Dict[str, Any]:
        return {"server_bytes_sent": 0, "server_bytes_received": 0}
