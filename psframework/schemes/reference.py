"""Single-process reference trainer: the correctness oracle of every distributed scheme."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F

from psframework.config import Config, dump_config
from psframework.data import num_batches
from psframework.metrics import Progress, RunRecorder
from psframework.schemes.checkpoint import save_checkpoint
from psframework.schemes.common import (build_problem, conv_optimizer, evaluate, head_optimizer,
                                        is_eval_iteration, iteration_plan, lr_factor, resolve_device, scale_lr,
                                        total_iterations)


def run(cfg: Config, comm: Any = None) -> Dict[str, Any]:
    """Train the whole model in this process; write the run directory and return the summary."""
    if cfg.comm.threads > 0:
        torch.set_num_threads(cfg.comm.threads)
    device = resolve_device(cfg.device)
    dataset, model = build_problem(cfg)
    model.to(device)
    train_x, train_y = dataset.train.images.to(device), dataset.train.labels.to(device)
    test_x, test_y = dataset.test.images.to(device), dataset.test.labels.to(device)
    conv_opt = conv_optimizer(cfg, model.conv_parameters())
    head_opt = head_optimizer(cfg, model.head_parameters())

    recorder = RunRecorder(cfg.run_dir, dump_config(cfg))
    num_train = len(dataset.train)
    total = total_iterations(cfg, num_train)
    per_epoch = num_batches(num_train, cfg.data.batch_size, cfg.data.drop_last)
    progress = Progress(total, cfg.output.progress)
    progress.message(f"psf: scheme reference, model {model.name}, dataset {dataset.name} "
                     f"({num_train} train / {len(dataset.test)} test), {total} iterations")
    accuracy: Optional[float] = None
    test_loss: Optional[float] = None
    model.train()
    for step in iteration_plan(cfg, num_train):
        t0 = time.perf_counter()
        scale_lr([conv_opt, head_opt], lr_factor(cfg, step.iteration, total))
        index = torch.from_numpy(step.indices).to(device)
        x, y = train_x[index], train_y[index]
        conv_opt.zero_grad(set_to_none=True)
        head_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        conv_opt.step()
        head_opt.step()
        loss_value = float(loss.detach())
        iteration_s = time.perf_counter() - t0
        recorder.log({"iteration": step.iteration, "epoch": step.epoch, "batch": step.batch,
                      "loss": loss_value, "iteration_s": iteration_s, "wall_s": recorder.elapsed()})
        extra = ""
        if is_eval_iteration(cfg, step, per_epoch, total):
            accuracy, test_loss = evaluate(model, test_x, test_y, cfg.data.test_batch_size)
            recorder.update_last(test_accuracy=accuracy, test_loss=test_loss)
            extra = f"test acc {accuracy:.4f}"
        progress.update(step.iteration, step.epoch, loss_value, extra)

    save_checkpoint(f"{cfg.run_dir}/checkpoint.pt", total, model, None, head_opt, None, cfg)
    summary = recorder.finish({
        "scheme": cfg.scheme, "name": cfg.name, "model": model.name, "dataset": dataset.name,
        "world_size": 1, "n": None, "k": None, "iterations": total,
        "final_test_accuracy": accuracy, "final_test_loss": test_loss,
        "mean_iteration_s": recorder.mean("iteration_s", skip=1),
        "server_bytes_sent": 0, "server_bytes_received": 0,
    })
    progress.message(f"psf: done: test accuracy {accuracy:.4f}, {summary['wall_s']:.1f} s, "
                     f"outputs in {cfg.run_dir}")
    return summary
