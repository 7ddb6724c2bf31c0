"""The configuration reference (docs/reference.md), generated from the config dataclasses so that it cannot drift.

`python -m psframework.config_reference` writes docs/reference.md; tests/test_docs.py fails when the page
differs from `reference_markdown()` or when a key of the config has no meaning here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from typing import Any, Dict, Iterator, List, Literal, Tuple, Union

from psframework.config import _BOUNDS, Config, _type_name
from psframework.fileio import write_page

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reference.md")

# One line per leaf key of Config: what it means. Links are relative to docs/.
MEANINGS = {
    "name": "run name: outputs go to `output.dir/name/`",
    "scheme": "`reference`, `ps`, `stanza`, `sazd`, `sazd-naive`, `poly`, `uncoded` (see [Schemes](schemes.md))",
    "device": "`cpu`, `cuda` (each rank on its GPU; see [GPUs](gpus.md)) or `auto` (a GPU where one is visible, "
              "else the CPU, said once)",
    "data.dataset": "`digits` (bundled), `mnist`, `fashion-mnist`, `cifar10`, `synthetic`, `image-folder`, or a "
                    "factory "
                    "`package.module:function` / `path/to/file.py:function` (see "
                    "[Your own model and data](your-model-and-data.md))",
    "data.args": "keyword arguments of a dataset factory",
    "data.root": "directory of the dataset files (required for mnist, fashion-mnist, cifar10, image-folder: "
                 "`train/CLASS/*` and `test/CLASS/*`)",
    "data.batch_size": "global batch size (with `train.accumulate` m: of one micro-batch; an optimizer step takes "
                       "m of them)",
    "data.test_batch_size": "evaluation batch size",
    "data.seed": "shuffling seed (also seeds synthetic data)",
    "data.drop_last": "drop the last incomplete batch of an epoch",
    "data.loader_workers": "DataLoader processes reading a streamed dataset ahead (0: in the training process)",
    "data.augment": "`none` or `crop-flip`: random crop after zero padding and a horizontal flip of every training "
                    "image (see [Training recipe](recipe.md))",
    "data.augment_padding": "`crop-flip`: pixels of zero padding on each side before the crop",
    "data.augment_flip": "`crop-flip`: probability of a horizontal flip",
    "data.normalize": "`auto` (per-channel mean and deviation of the training set), `none`, `fixed` (`data.mean`, "
                      "`data.std`); null: `auto` for the built-in datasets, `none` for `image-folder` and a "
                      "factory's",
    "data.mean": "per-channel means of `data.normalize: fixed`",
    "data.std": "per-channel deviations of `data.normalize: fixed`",
    "data.synthetic.channels": "synthetic images: channels",
    "data.synthetic.height": "synthetic images: height in pixels",
    "data.synthetic.width": "synthetic images: width in pixels",
    "data.synthetic.classes": "synthetic images: classes",
    "data.synthetic.train_size": "synthetic images: training samples",
    "data.synthetic.test_size": "synthetic images: test samples",
    "data.synthetic.noise": "synthetic images: deviation of the Gaussian noise added to each class's template",
    "model.name": "`lenet5`, `vgg-small`, `alexnet-small`, `vgg16`, `resnet20`, `resnet18`, or a factory "
                  "`package.module:function` / `path/to/file.py:function` returning a `torch.nn.Module`",
    "model.args": "keyword arguments of a model factory (it also gets `in_channels` when its signature names "
                  "it, and `num_classes` when it names it or takes `**kwargs`)",
    "model.split_at": "`stanza`: the module that starts the head on rank 0 (null: the first `nn.Linear` after the "
                      "last convolution)",
    "model.input_size": "built-in models: input size (null: the model's default); also resizes the images of a "
                        "factory model (required with `image-folder`)",
    "model.channels": "built-in models: widths, per conv layer for the chains, per stage for the ResNets (null: "
                      "the model's default)",
    "model.fc": "built-in models: widths of the hidden layers of the FC head (null: the model's default)",
    "model.batch_norm": "built-in models: with or without BatchNorm (null: the model's default)",
    "model.dropout": "built-in models: dropout probability in the head (null: the model's default)",
    "train.epochs": "epochs",
    "train.max_iterations": "stop the run after this many iterations (null: at the end of `train.epochs`); the "
                            "learning-rate schedule stays the one planned over `train.epochs`",
    "train.lr": "learning rate (SGD or Adam), > 0",
    "train.momentum": "SGD momentum, 0 <= x < 1",
    "train.nesterov": "SGD with Nesterov momentum (needs `train.momentum` > 0)",
    "train.weight_decay": "SGD weight decay",
    "train.optimizer": "`sgd` or `adam` (coded conv layers need `sgd`: see [Schemes](schemes.md))",
    "train.lr_schedule": "`constant`, `cosine` (decay to 0 over the run), `multistep`, `step` or `onecycle` (see "
                         "[Training recipe](recipe.md))",
    "train.lr_milestones": "`multistep`: epochs at which the rate is multiplied by `train.lr_gamma`",
    "train.lr_gamma": "`multistep`, `step`: the factor at each milestone or step (0 < gamma <= 1)",
    "train.lr_step_epochs": "`step`: epochs between two multiplications by gamma",
    "train.lr_pct_start": "`onecycle`: the fraction of the run spent rising from lr / div_factor to lr (0 < x < 1)",
    "train.lr_div_factor": "`onecycle`: the rate starts at lr / div_factor",
    "train.lr_final_div_factor": "`onecycle`: the rate ends at lr / div_factor / final_div_factor",
    "train.warmup": "linear warm-up over this many epochs or iterations (`train.warmup_unit`), multiplying the "
                    "schedule (0: none)",
    "train.warmup_unit": "`epochs` or `iterations`: the unit of `train.warmup`",
    "train.warmup_start_factor": "the warm-up's first factor of lr; it reaches 1 at the warm-up's end "
                                 "(0 < factor <= 1)",
    "train.label_smoothing": "label smoothing of the training loss, 0 <= x < 1 (test loss: plain cross-entropy)",
    "train.accumulate": "gradient accumulation: micro-batches (iterations) of `data.batch_size` per optimizer step",
    "train.precision": "`fp32`, `bf16` (autocast on CPUs and GPUs; coded convolutions computed and sent in bf16), "
                       "`fp16` (on GPUs, with dynamic loss scaling)",
    "train.loss_scale": "dynamic loss scaling: `auto` (with fp16), `dynamic` or `none`; a step whose gradients "
                        "overflow is skipped and the scale halved",
    "train.loss_scale_power": "dynamic loss scaling: the first scale is 2 ** power",
    "train.loss_scale_window": "dynamic loss scaling: the scale doubles after this many steps without an overflow",
    "train.head_optimizer": "optimizer of the FC head (null: as the conv layers)",
    "train.head_lr": "learning rate of the FC head, > 0 (null: as the conv layers)",
    "train.seed": "model initialisation and dropout seed",
    "train.eval_every": "evaluate every this many iterations (0: at the end of every epoch)",
    "train.verify_every": "coded schemes: decode the conv weights from two k-subsets and log how far they differ "
                          "(0: never)",
    "train.checkpoint_every": "write a checkpoint every this many iterations (`checkpoint-ITERATION.pt`, and "
                              "`checkpoint.pt`, the latest, also at the end)",
    "train.keep_checkpoints": "keep only the newest K `checkpoint-ITERATION.pt` (null: all)",
    "train.resume": "checkpoint to resume from (same settings; the run continues where it stopped, with the same "
                    "losses), or `auto`: the newest checkpoint of the run directory that reads back whole, a fresh "
                    "start when there is none",
    "train.resume_force": "resume although the checkpoint's settings differ (the differences are printed and "
                          "recorded in `summary.json`)",
    "train.preempt_signal": "signal that makes every rank stop at the next iteration with a checkpoint (and rank 0 "
                            "requeue a Slurm job); SIGTERM does the same without the requeue; `none`: SIGTERM only",
    "train.max_requeues": "requeue a preempted Slurm job at most this many times (see [Slurm](slurm.md))",
    "train.backup_workers": "`ps`, `stanza`: rank 0 goes on with the first n - b workers of every round "
                            "(0 <= b < n)",
    "train.servers": "server ranks G: G groups of a server and `code.n` workers, G x (n + 1) ranks (see "
                     "[Several servers](servers.md))",
    "code.n": "workers (every MPI scheme)",
    "code.k": "replies needed per layer (coded schemes), k <= n",
    "code.systematic": "systematic SA code (parity packet r shifts block i by r*i)",
    "code.symbol_channels": "channels per code symbol (keeps the symbols per block, and so the decoding error, "
                            "small)",
    "code.nodes": "evaluation points of the `poly` baseline",
    "code.subsets": "`first`: decode from the first k replies; `rotate`: cycle through every k-subset (waiting for "
                    "all), to exercise every decoding path",
    "stragglers.model": "`none`, `fixed`, `random`, `exponential`, `pareto`, `freeze` (see "
                        "[Stragglers](stragglers.md))",
    "stragglers.ranks": "slowed (or, with `freeze`, stopped) ranks",
    "stragglers.factor": "slowdown: a slowed worker takes factor x its compute time (`fixed`, `random`: >= 1; "
                         "`exponential`, `pareto`: the mean delay in compute times, > 0)",
    "stragglers.seed": "seed of the random straggler draws",
    "stragglers.count": "`random`: ranks drawn afresh every iteration",
    "stragglers.shape": "`pareto`: shape of the delay distribution",
    "stragglers.responsive": "false: a slowed worker makes no MPI progress while it sleeps (a real slow node); "
                             "true: only its compute is slow",
    "stragglers.pause_s": "`freeze`: the listed ranks are stopped (SIGSTOP) for this many seconds at a time",
    "stragglers.duty": "`freeze`: the fraction of the time the listed ranks are stopped",
    "comm.dissemination": "`direct` or `relay` (coded dissemination through the workers: see "
                          "[Schemes](schemes.md))",
    "comm.cuda_aware": "whether the MPI takes GPU buffers: `auto`, `true`, `false`",
    "comm.timeout_s": "watchdog: a receive waiting longer (seconds, > 0) is an error naming the silent rank",
    "comm.threads": "torch/BLAS threads per rank (0: cores per node / ranks per node)",
    "comm.window": "messages rank 0 (and a relaying worker) has in flight to one worker before it keeps the rest "
                   "back (1..16)",
    "comm.detach_after": "a worker whose oldest kept-back message is this many iterations old, and which has sent "
                         "and acknowledged nothing since the first of them began, is detached",
    "comm.detach_after_s": "a worker is detached only once it has also sent and acknowledged nothing for this many "
                           "seconds: longer than a working link's stalls (see [Stragglers](stragglers.md))",
    "comm.progress_thread": "a worker thread that drives MPI progress while the worker computes: `auto` (where the "
                            "node has a core to spare), `true`, `false`",
    "comm.emulate.bandwidth_gbps": "network emulation (null: off): every message waits bytes / bandwidth before it "
                                   "is posted (Gb/s, > 0)",
    "comm.emulate.latency_us": "network emulation: the latency added to every message (microseconds)",
    "comm.emulate.ranks": "whose links are emulated: `all`, or `servers` only",
    "output.dir": "where run directories go",
    "output.progress": "`auto` (bar on a terminal, lines otherwise), `bar`, `lines`, `off`",
    "output.overwrite": "replace a run directory that already holds a run",
    "output.tensorboard": "write the metrics as TensorBoard scalars to `<run dir>/tensorboard/` (extra "
                          "`tensorboard`)",
    "output.trace": "every rank records a timeline of its timed activities; rank 0 writes `<run dir>/trace.json`",
    "output.trace_iterations": "the timeline keeps the newest this many iterations",
    "output.trace_window": "null, or `[first, last]`: the iterations the timeline records (first <= last)",
}

SECTIONS = {
    "": "Top level", "data": "Data", "model": "Model", "train": "Training", "code": "Code",
    "stragglers": "Stragglers", "comm": "Communication", "output": "Output",
}


def leaf_keys(cls: type = Config, prefix: str = "") -> Iterator[Tuple[str, Any, Any]]:
    """Yield (dotted key, declared type, default) of every leaf of a config dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    instance = cls()
    for f in dataclasses.fields(cls):
        tp, value = hints[f.name], getattr(instance, f.name)
        if dataclasses.is_dataclass(tp):
            yield from leaf_keys(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp, value


def _number(value: Any) -> str:
    """Write a number as a config would: 1e6 rather than 1000000.0, 0.02 as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 10_000:
        short = f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
        if float(short) == value:
            return short
    return str(value)


def _yaml(value: Any) -> str:
    """Write a default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return _number(value)


def _accepted(tp: Any) -> str:
    """Write the values a key accepts (Literal choices as a list of words; no '|', which splits a table cell)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union and type(None) in args:
        inner = [a for a in args if a is not type(None)][0]
        return "true, false or null" if inner is bool else "null or " + _accepted(inner)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (list, List):
        return "a list, each " + _accepted(args[0])
    return _type_name(tp)


def _range(key: str, tp: Any) -> str:
    if key not in _BOUNDS:
        return "-"
    lo, hi = _BOUNDS[key]
    each = "each " if "list" in _type_name(tp) else ""
    return f"{each}{_number(lo)}..{_number(hi)}"


def _row(key: str, tp: Any, default: Any) -> str:
    cells = [f"`{key}`", f"`{_yaml(default)}`", _accepted(tp), _range(key, tp), MEANINGS.get(key, "")]
    return "| " + " | ".join(cells) + " |"


def reference_markdown() -> str:
    """Return docs/reference.md: one table per section of the config, one row per leaf key."""
    lines: List[str] = [
        "# Configuration reference",
        "",
        "Every key of the config, with its default, the values it accepts and its range. This page is generated",
        "from the config dataclasses (`psframework/config.py`) by `python -m psframework.config_reference`.",
        "[Configuration](configuration.md) says how configs and overrides are written and checked.",
        "",
        "* A range `lo..hi` bounds every value of the key (each element of a list).",
        "* A stricter rule of one key (a positive rate) is named in its meaning.",
        "* The rules that join several keys (`k <= n`, the world size, ...) are checked too.",
    ]
    sections: Dict[str, List[str]] = {}
    for key, tp, default in leaf_keys():
        sections.setdefault(key.split(".")[0] if "." in key else "", []).append(_row(key, tp, default))
    for head, rows in sections.items():
        title = SECTIONS.get(head, head) + (f" (`{head}.*`)" if head else "")
        lines += ["", f"## {title}", "", "| key | default | accepts | range | meaning |", "|---|---|---|---|---|"]
        lines += rows
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    """Write the reference page (to argv[0], else docs/reference.md) through a temporary file and a rename."""
    return write_page(argv, PAGE, reference_markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
