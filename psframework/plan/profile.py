"""A calibration profile: what one iteration of each scheme is made of, measured on one machine.

Compute times are affine fits, seconds = a + b * x, with x the samples, channels or values the piece
works on, so that a profile taken at one batch and a few codes predicts any share of the batch and
any (n, k). A profile is a small JSON file (`psf plan calibrate` writes it) and this module reads it
back; the field names are part of its format (PROFILE_VERSION).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from psframework.fileio import atomic_write_text

PROFILE_VERSION = 1


@dataclass(frozen=True)
class Fit:
    """seconds = a + b * x, never below zero."""

    a: float
    b: float

    def __call__(self, x: float) -> float:
        return max(0.0, self.a + self.b * x)

    @classmethod
    def of(cls, points: Sequence[Tuple[float, float]]) -> "Fit":
        """Return the least-squares line through (x, seconds) points (a constant for a single x)."""
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        if var == 0.0:
            return cls(0.0, my / mx) if mx else cls(my, 0.0)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
        return cls(my - b * mx, b)


@dataclass(frozen=True)
class ConvLayer:
    """One coded convolution: its shapes and what a worker and rank 0 spend on it."""

    name: str
    in_channels: int
    out_channels: int
    in_values: int  # one sample's input values
    out_values: int  # one sample's output values
    column_copy: bool
    forward: Fit  # a worker's packet of the output: x = batch * packet channels of the output
    input_grad: Fit  # a worker's packet of the input gradient: x = batch * packet channels of the input
    update: Fit  # a worker's weight gradients and step: x = batch * packet channels of the output
    uncoded: float  # the layer's forward and backward on the whole calibration batch, in one process


@dataclass(frozen=True)
class Link:
    """What a message costs between two ranks: on one host (shared memory) or between hosts (TCP)."""

    latency_s: float
    bandwidth_Bps: float
    cpu_s_per_byte: float  # processor time per byte, both ends together
    overhead_s: float = 0.0  # processor time per message at each end (the transport's own work)
    polled_Bps: float = float("inf")  # bandwidth of a large message whose ranks sleep between polls
    polled_latency_s: float = 0.0  # and the fixed time of such a message (its protocol's steps wait for polls)
    waiting_cpu: float = 0.0  # share of a core a rank uses while it waits, sleeping between polls


@dataclass(frozen=True)
class Profile:
    """Everything `psf plan` needs about a config's model on one machine."""

    config: str
    model: str
    batch: int  # the global batch of the config
    machine: str
    threads: int  # processor threads of each piece (one rank's share of a node)
    date: str
    params: int
    head_params: int  # parameters of the FC head (0: no head)
    trunk_params: int  # parameters of the conv trunk (every parameter not in the head)
    running_stats: int  # BatchNorm running statistics
    feature_values: int  # one sample's features at the cut (stanza's messages)
    model_step: Fit  # forward and backward of the whole model: x = samples
    trunk_forward: Fit  # x = samples
    trunk_backward: Fit  # x = samples
    head_step: Fit  # the head's forward and backward: x = samples
    optimizer: Fit  # an optimizer step: x = parameters
    add: Fit  # adding two vectors: x = values
    decode: Fit  # decoding a coded layer's result: x = values decoded
    relay_encode: Fit  # coding a tensor's bits for relay: x = values
    relay_decode: Fit  # restoring a relayed tensor: x = values
    server_rest: Fit  # rank 0's own part of a coded iteration (all but the coded convolutions): x = samples
    layers: List[ConvLayer] = field(default_factory=list)
    backward_order: List[int] = field(default_factory=list)  # the coded convolutions' backward passes, in order
    links: Dict[str, Link] = field(default_factory=dict)  # "shm", "tcp"
    version: int = PROFILE_VERSION

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Profile":
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile version: got {data.get('version')!r}, expected {PROFILE_VERSION} "
                             "(calibrate again with psf plan calibrate)")
        fits = {k: Fit(**v) for k, v in data.items() if isinstance(v, dict) and set(v) == {"a", "b"}}
        layers = [ConvLayer(**{**layer, **{k: Fit(**layer[k]) for k in ("forward", "input_grad", "update")}})
                  for layer in data["layers"]]
        links = {name: Link(**link) for name, link in data["links"].items()}
        rest = {k: v for k, v in data.items() if k not in fits and k not in ("layers", "links", "version")}
        return cls(**rest, **fits, layers=layers, links=links)


def save(profile: Profile, path: str) -> None:
    """Write a profile as JSON (to a temporary name, then renamed)."""
    atomic_write_text(path, json.dumps(profile.to_json(), indent=1) + "\n")


def load(path: str) -> Profile:
    """Read a profile; ValueError names the file and what is wrong with it."""
    try:
        with open(path) as fh:
            return Profile.from_json(json.load(fh))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"profile {path}: {exc}") from None


def link_named(profile: Profile, name: str) -> Optional[Link]:
    """Return the profile's link of that kind ("shm" or "tcp"), None if it was not measured."""
    return profile.links.get(name)
