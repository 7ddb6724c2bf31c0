"""Checkpoints of rank 0's view of a run: the model, the scheme's state, the RNG and the position.

A checkpoint is read with torch's weights-only unpickler, which admits tensors and plain containers
only: a file crafted to run code on load is refused. It records a fingerprint of the settings that
must match to resume (scheme, model and its shapes, data, batch, optimiser and schedule). The code
(`code.n`, `code.k`, ...) is not among them: a coded scheme's checkpoint holds the weights and momentum
rank 0 decoded, and a resume sends them uncoded to the workers, which encode their packets for
whatever code the resumed run has (docs/design.md#preemption).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch

from psframework.errors import ConfigError
from psframework.fileio import atomic_write
from psframework.settings import Settings

FORMAT = 3
# Settings that change what a checkpoint means; anything else (length, evaluation, comm) may change.
FINGERPRINT_KEYS = (
    "scheme", "model.name", "model.args", "model.split_at", "model.input_size", "model.channels", "model.fc",
    "model.batch_norm", "model.dropout", "data.dataset", "data.args", "data.batch_size", "data.seed",
    "data.drop_last", "data.synthetic", "data.augment", "data.augment_padding", "data.augment_flip",
    "data.normalize", "data.mean", "data.std",
    "train.optimizer", "train.lr", "train.momentum", "train.nesterov", "train.weight_decay", "train.lr_schedule",
    "train.lr_milestones", "train.lr_gamma", "train.lr_step_epochs", "train.lr_pct_start", "train.lr_div_factor",
    "train.lr_final_div_factor", "train.warmup", "train.warmup_unit", "train.warmup_start_factor",
    "train.head_optimizer", "train.head_lr", "train.seed", "train.label_smoothing", "train.accumulate",
    "train.precision", "train.loss_scale",
)
# Keys older checkpoints do not record, with the value that means what those checkpoints did.
ADDED_KEYS = {"model.args": {}, "model.split_at": None, "data.args": {}, "data.augment": "none",
              "data.augment_padding": 4, "data.augment_flip": 0.5, "data.normalize": None, "data.mean": None,
              "data.std": None, "train.lr_milestones": [], "train.lr_gamma": 0.1, "train.lr_step_epochs": 30,
              "train.lr_pct_start": 0.3, "train.lr_div_factor": 25.0, "train.lr_final_div_factor": 1e4,
              "train.warmup": 0, "train.warmup_unit": "epochs", "train.warmup_start_factor": 0.1,
              "train.label_smoothing": 0.0, "train.accumulate": 1, "train.precision": "fp32",
              "train.loss_scale": "auto"}
# Keys older checkpoints hold that a resume no longer needs to match: a cap stops a run, not its schedule;
# the code's keys, since coded checkpoints hold decoded weights that any code re-encodes.
RETIRED_KEYS = ("train.max_iterations", "code.n", "code.k", "code.systematic", "code.symbol_channels", "code.nodes")


@dataclass
class Checkpoint:
    """A checkpoint's contents, read back."""

    path: str
    iteration: int
    num_train: int
    fingerprint: Dict[str, Any]
    model: Dict[str, torch.Tensor]
    state: Dict[str, Any]
    torch_rng: torch.Tensor


def fingerprint(config: Mapping[str, Any], model: torch.nn.Module) -> Dict[str, Any]:
    """Return the settings a resume must match and the model's shapes."""
    keys = FINGERPRINT_KEYS
    if config["train"]["lr_schedule"] != "constant":  # the schedule depends on the plan's length
        keys += ("train.epochs",)
    found = {key: _dotted(config, key) for key in keys}
    found["model.shapes"] = {name: list(t.shape) for name, t in model.state_dict().items()}
    return found


def _dotted(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> List[str]:
    """Return 'key saved -> current' for every fingerprint entry that differs."""
    out = []
    for key in sorted(set(saved) | set(current)):
        if key in RETIRED_KEYS:
            continue
        before, after = saved.get(key, ADDED_KEYS.get(key, "unset")), current.get(key, "unset")
        if before != after:
            out.append(f"{key} {_short(before)} -> {_short(after)}" if key != "model.shapes" else
                       "model.shapes (the layers' shapes)")
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def save_checkpoint(path: str, iteration: int, num_train: int, model: torch.nn.Module, state: Dict[str, Any],
                    settings: Settings) -> None:
    """Write a checkpoint atomically (temporary name, then rename)."""
    payload = {"format": FORMAT, "iteration": int(iteration), "num_train": int(num_train),
               "fingerprint": fingerprint(settings.config, model), "model": on_cpu(model.state_dict()),
               "state": on_cpu(state), "torch_rng": torch.get_rng_state(), "config": settings.config}
    atomic_write(path, lambda fh: torch.save(payload, fh), mode="wb")


def on_cpu(obj: Any) -> Any:
    """Return `obj` with every tensor in it copied to the CPU (a checkpoint resumes on any device)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((key, on_cpu(value)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_cpu(value) for value in obj)
    return obj


def read_checkpoint(path: str) -> Checkpoint:
    """Read a checkpoint with the weights-only unpickler; ConfigError (one line) if it is not one."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = _refused(exc)
        if refused is None:
            raise ConfigError(f"train.resume: cannot read checkpoint {path!r}: not a file torch.save wrote, "
                              "expected a psframework checkpoint") from None
        raise ConfigError(f"train.resume: {path!r} holds objects other than tensors and plain containers "
                          f"({refused}); refused, loading it could run code") from None
    except Exception as exc:  # a truncated or foreign file
        raise ConfigError(f"train.resume: cannot read checkpoint {path!r} ({type(exc).__name__}: "
                          f"{_first_line(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ConfigError(f"train.resume: {path!r} is not a psframework checkpoint of format {FORMAT} "
                          f"(found format {found!r})")
    try:
        return Checkpoint(path, int(payload["iteration"]), int(payload["num_train"]), dict(payload["fingerprint"]),
                          payload["model"], payload["state"], payload["torch_rng"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"train.resume: checkpoint {path!r} lacks an entry or has a wrong one ({exc})") from None


def _refused(exc: Exception) -> Optional[str]:
    """Return the part of torch's weights-only refusal that names the global the file asked for, if any."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line:
            return line.strip().rstrip(".")
    return None


def _first_line(exc: Exception) -> str:
    """Return the first sentence of an exception's message (torch's run to many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__).split(". ")[0].rstrip(".")


def restore(checkpoint: Checkpoint, model: torch.nn.Module) -> None:
    """Load a checkpoint's model and RNG state (its fingerprint already matched)."""
    try:
        model.load_state_dict(checkpoint.model)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"train.resume: checkpoint {checkpoint.path!r} does not fit the configured model: "
                          f"{detail}") from None
    torch.set_rng_state(checkpoint.torch_rng)
