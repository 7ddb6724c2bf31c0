"""Train a module built in Python with psframework.train_module, under mpiexec like a user's script.

    mpiexec -n 5 python -m mpi4py tests/mpi/given_module.py OUTPUT_DIR [key=value ...]

Every rank builds the same network and passes it; rank 0 prints the summary and checks that its
module was trained in place.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import psframework

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from small_resnet import SmallResNet  # noqa: E402


def main(out: str, overrides: list) -> None:
    torch.manual_seed(0)
    model = SmallResNet(1, 10, width=8, blocks=1)
    before = [p.detach().clone() for p in model.parameters()]
    summary = psframework.train_module(model, os.path.join(ROOT, "configs", "digits_sazd.yaml"),
                                       [f"output.dir={out}", "output.progress=off", *overrides])
    if summary is not None:
        changed = sum(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
        print(json.dumps({"summary": summary, "changed": changed, "total": len(before)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
