"""How a host's link is shaped: rate, delay, jitter and loss, parsed and turned into tc commands."""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class ShapeError(ValueError):
    """A link setting is malformed: one line names it and says what is expected."""


@dataclasses.dataclass(frozen=True)
class LinkShape:
    """What tc applies to each direction of one host's cable (None: not shaped that way)."""

    rate_bps: Optional[float] = None
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0  # fraction of packets dropped, 0..1

    def merged(self, rate: Optional[str] = None, delay: Optional[str] = None, jitter: Optional[str] = None,
               loss: Optional[str] = None) -> "LinkShape":
        """Return this shape with the settings that are given replaced ('none' clears a rate)."""
        changes = {}
        if rate is not None:
            changes["rate_bps"] = None if rate == "none" else parse_rate(rate)
        if delay is not None:
            changes["delay_s"] = parse_time("--delay", delay)
        if jitter is not None:
            changes["jitter_s"] = parse_time("--jitter", jitter)
        if loss is not None:
            changes["loss"] = parse_loss(loss)
        shape = dataclasses.replace(self, **changes)
        if shape.jitter_s > shape.delay_s:
            raise ShapeError(f"--jitter: got {format_time(shape.jitter_s)}, expected at most the delay "
                             f"({format_time(shape.delay_s)})")
        return shape

    def describe(self) -> str:
        """Return the shape in words, e.g. '1gbit, delay 100us, loss 5%'."""
        parts = [format_rate(self.rate_bps) if self.rate_bps else "unlimited rate"]
        if self.delay_s:
            parts.append(f"delay {format_time(self.delay_s)}"
                         + (f" +- {format_time(self.jitter_s)}" if self.jitter_s else ""))
        if self.loss:
            parts.append(f"loss {self.loss * 100:g}%")
        return ", ".join(parts)


def parse_rate(text: str) -> float:
    """Return a rate such as '1gbit' or '500mbit' in bits per second."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", text.lower())
    if match is None or match.group(2) not in RATE_UNITS or float(match.group(1)) <= 0:
        raise ShapeError(f"--rate: got {text!r}, expected a positive rate such as 1gbit, 100mbit or 10gbit")
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def parse_time(option: str, text: str) -> float:
    """Return a duration such as '100us' or '5ms' in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or (match.group(2) or "s") not in TIME_UNITS:
        raise ShapeError(f"{option}: got {text!r}, expected a duration such as 100us, 2ms or 0")
    return float(match.group(1)) * TIME_UNITS[match.group(2) or "s"]


def parse_loss(text: str) -> float:
    """Return a loss such as '5%' or '0.05' as a fraction."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise ShapeError(f"--loss: got {text!r}, expected a percentage from 0% to below 100% (or a fraction)")
    return value


def format_rate(bps: float) -> str:
    """Return a rate in tc's units, e.g. 1gbit."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bps >= RATE_UNITS[unit]:
            return f"{bps / RATE_UNITS[unit]:g}{unit}"
    return f"{bps:g}bit"


def format_time(seconds: float) -> str:
    """Return a duration in tc's units, e.g. 100us."""
    for unit in ("s", "ms", "us"):
        if seconds >= TIME_UNITS[unit]:
            return f"{seconds / TIME_UNITS[unit]:g}{unit}"
    return f"{seconds * 1e9:g}ns" if seconds else "0us"


def tc_commands(device: str, shape: LinkShape) -> List[List[str]]:
    """Return the tc commands that shape `device`'s egress (run inside its namespace, after its old
    root and clsact qdiscs are deleted).

    Rate: a token bucket (tbf) holding a few milliseconds at the rate, at least 256 KiB, so the large
    segments veth passes whole are never dropped for size. Delay and jitter: netem as the root with
    the bucket as its child (kernels built without netem cannot delay: see NO_NETEM). Loss: a classic
    BPF filter on the egress hook that drops a packet when a random 31-bit number falls below
    loss * 2**31 (shifted first, as the kernel's conversion to eBPF sign-extends larger constants).
    """
    commands: List[List[str]] = []
    parent = ["root"]
    if shape.delay_s or shape.jitter_s:
        delay = ["delay", format_time(shape.delay_s)] + ([format_time(shape.jitter_s)] if shape.jitter_s else [])
        commands.append(["tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "limit", "100000",
                         *delay])
        parent = ["parent", "1:1"]
    if shape.rate_bps:
        burst = max(256 * 1024, int(shape.rate_bps / 8 * 0.004))
        commands.append(["tc", "qdisc", "add", "dev", device, *parent, "handle", "10:", "tbf",
                         "rate", format_rate(shape.rate_bps), "burst", str(burst), "latency", "100ms"])
    if shape.loss:
        commands.append(["tc", "qdisc", "add", "dev", device, "clsact"])
        commands.append(["tc", "filter", "add", "dev", device, "egress", "bpf", "da", "bytecode",
                         loss_program(shape.loss)])
    return commands


def clear_commands(device: str) -> List[List[str]]:
    """Return the tc commands that remove every shaping of `device` (each may fail: nothing to remove)."""
    return [["tc", "qdisc", "del", "dev", device, "root"], ["tc", "qdisc", "del", "dev", device, "clsact"]]


def loss_program(loss: float) -> str:
    """Return tc's bytecode of a classic BPF program that drops a fraction `loss` of packets.

    A = random u32; A >>= 1; if A >= loss * 2**31: pass (TC_ACT_OK = 0); else drop (TC_ACT_SHOT = 2).
    """
    random_word = 2**32 - 0x1000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM
    threshold = int(round(loss * 2**31))
    program = [(0x20, 0, 0, random_word), (0x74, 0, 0, 1), (0x35, 0, 1, threshold), (0x06, 0, 0, 0),
               (0x06, 0, 0, 2)]
    return f"{len(program)}," + ",".join(f"{op} {jt} {jf} {k}" for op, jt, jf, k in program)


NO_NETEM = ("this kernel has no netem queueing discipline (CONFIG_NET_SCH_NETEM), so links cannot be "
            "delayed here; rate, loss and cutting a link work without it")
