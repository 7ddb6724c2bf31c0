#!/usr/bin/env python3
"""Measure how far the reference trainer drifts when its initial weights are perturbed by rounding noise.

    python hpc/sensitivity.py --eps 1e-7 --iterations 30 configs/digits_sazd.yaml model.name=resnet20 model.input_size=8

Trains the config twice in this process with the single-process reference trainer: once as given,
once with every parameter multiplied by (1 + eps * N(0, 1)); prints the loss difference per iteration
and the largest relative parameter difference at the end (max |a - b| / max |a| per tensor). A
distributed scheme whose arithmetic differs from the reference's only in rounding cannot be expected
to stay closer to the reference than this.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from psframework.schemes.common import build_problem, iteration_plan  # noqa: E402
from psframework.schemes.driver import Problem  # noqa: E402
from psframework.schemes.reference import ReferenceTrainer  # noqa: E402
from psframework.schemes.validate import load_run, make_settings  # noqa: E402


def train(settings, iterations: int, eps: float):
    """Return the losses and final state of a reference run with perturbed initial weights."""
    dataset, model = build_problem(settings)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + eps * torch.randn(p.shape, generator=noise))
    trainer = ReferenceTrainer(settings, Problem(dataset, model))
    model.train()
    losses = [trainer.step(step).loss for step in iteration_plan(settings.data, len(dataset.train), 0, iterations)]
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, default=1e-7)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    settings = make_settings(load_run(args.config, ["scheme=reference", *args.overrides]))
    base, base_state = train(settings, args.iterations, 0.0)
    moved, moved_state = train(settings, args.iterations, args.eps)
    for i, (a, b) in enumerate(zip(base, moved), 1):
        print(f"iteration {i:3d}: loss {a:.6f}, perturbed {b:.6f}, difference {abs(a - b):.1e}")
    worst = max((float((base_state[k] - moved_state[k]).abs().max() / base_state[k].abs().max().clamp_min(1e-12)), k)
                for k in base_state)
    print(f"eps {args.eps:g}: largest relative parameter difference after {args.iterations} iterations "
          f"{worst[0]:.1e} ({worst[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
