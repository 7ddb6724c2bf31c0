"""Contender files of `psf bench peers`: what trains head to head, the baseline and the extra ratios.

A contender file (configs/bench/peers.yaml by default) holds

    contenders:  the contenders, in the order they train and appear in the tables; each has
      name:      its name in --schemes, the tables and the ratios (a letter, then letters, digits, _ and -)
      overrides: KEY=VALUE config overrides that make it (a list; scheme=NAME picks the scheme)
      program:   ddp (torch DDP, one process per worker) or psframework (the default)
    baseline:    the name of the contender the others are divided by
    pairs:       further ratios of undisturbed iteration time, NAME: [numerator, denominator] (optional)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from psframework.bench.cases import CaseFileError, mapping, read

NAME = re.compile(r"^[A-Za-z][\w-]*$")
RATIO_NAME = re.compile(r"^[A-Za-z]\w*$")
PROGRAMS = ("psframework", "ddp")
KEYS = {"the contender file": {"contenders", "baseline", "pairs"}, "contender": {"name", "overrides", "program"}}


@dataclass(frozen=True)
class Contender:
    """One contender: its name, the overrides that make it and the properties of its scheme."""

    name: str
    overrides: Tuple[str, ...]
    program: str = "psframework"
    coded: bool = False  # its scheme codes the conv layers (the tables show k)
    needs_every_worker: bool = False  # k = n


@dataclass(frozen=True)
class ContenderFile:
    """A checked contender file."""

    path: str
    contenders: Tuple[Contender, ...]
    baseline: str
    pairs: Dict[str, Tuple[str, str]] = field(default_factory=dict)

    def named(self, name: str) -> Contender:
        """Return the contender called `name`."""
        return next(c for c in self.contenders if c.name == name)


def load(path: str, default_scheme: str) -> ContenderFile:
    """Read and check the contender file at `path`; contenders without scheme=NAME train `default_scheme`."""
    return read(path, "contender file", lambda data: parse(path, data, default_scheme))


def parse(path: str, data: Any, default_scheme: str) -> ContenderFile:
    """Return the contender file that `data` (as read from YAML) describes; CaseFileError where it cannot be used."""
    data = _mapping(data, "the contender file")
    entries = data.get("contenders")
    if not isinstance(entries, list) or not entries:
        raise CaseFileError("contenders: expected a non-empty list")
    contenders = tuple(_contender(f"contenders[{i}]", e, default_scheme) for i, e in enumerate(entries))
    names = [c.name for c in contenders]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate is not None:
        raise CaseFileError(f"two contenders share the name {duplicate!r}")
    baseline = _known(data.get("baseline"), "baseline", names)
    pairs = data.get("pairs") or {}
    if not isinstance(pairs, dict):
        raise CaseFileError(f"pairs: expected a mapping of ratio names to [numerator, denominator], got {pairs!r}")
    checked = {}
    for ratio, pair in pairs.items():
        if not isinstance(ratio, str) or not RATIO_NAME.match(ratio):
            raise CaseFileError(f"pairs: got {ratio!r}, expected a letter, then letters, digits and _")
        if not isinstance(pair, list) or len(pair) != 2:
            raise CaseFileError(f"pairs: {ratio}: expected [numerator, denominator], got {pair!r}")
        checked[ratio] = (_known(pair[0], f"pairs: {ratio}", names), _known(pair[1], f"pairs: {ratio}", names))
    return ContenderFile(path, contenders, baseline, checked)


def _contender(where: str, entry: Any, default_scheme: str) -> Contender:
    from psframework.schemes.registry import SchemeError, get_scheme

    entry = _mapping(entry, where, "contender")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise CaseFileError(f"{where}: name: got {name!r}, expected a letter, then letters, digits, _ and -")
    overrides = entry.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise CaseFileError(f"{where}: overrides: got {overrides!r}, expected a list of KEY=VALUE")
    program = entry.get("program", PROGRAMS[0])
    if program not in PROGRAMS:
        raise CaseFileError(f"{where}: program: got {program!r}, expected one of {', '.join(PROGRAMS)}")
    chosen = [o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "scheme"]
    try:
        scheme = get_scheme(chosen[-1] if chosen else default_scheme)
    except SchemeError as exc:
        raise CaseFileError(f"{where}: {exc}") from None
    return Contender(name, tuple(overrides), program, scheme.coded, scheme.k_equals_n)


def _mapping(value: Any, where: str, kind: Optional[str] = None) -> Dict[str, Any]:
    return mapping(value, where, KEYS[kind or where])


def _known(value: Any, where: str, names: List[str]) -> str:
    if value not in names:
        raise CaseFileError(f"{where}: got {value!r}, expected one of the contenders {', '.join(names)}")
    return value
