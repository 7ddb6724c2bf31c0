"""Expectations of benchmark reports: bounds on report fields, read from YAML and judged against a report.

An expectations file holds one block per benchmark; a block maps each expectation's name to

    description: what is bounded (optional; the name otherwise)
    field: a dotted path into the report, e.g. ratios.ps_over_stanza_bytes
    min: lower bound (optional)
    max: upper bound (optional; at least one of min and max)

Path segments are dict keys or list indices; a key may hold the glob characters * and ?, and a segment
may end in a selector, `speed[n=12,k=8]` or `bandwidth[bytes>=4194304]`, that keeps the list items
whose fields satisfy every condition (=, !=, <, <=, >, >=; values are read as YAML). Dots inside
brackets do not split the path. A path that reaches several values is met when every one of them is
within the bounds, and its verdict shows the value with the least margin. Null values do not count.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import yaml

KEYS = {"description", "field", "min", "max"}
OPERATORS: Dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "!=": operator.ne, "=": operator.eq, "<": operator.lt, ">": operator.gt}
CONDITION = re.compile(r"^\s*([^<>=!]+?)\s*(>=|<=|!=|=|<|>)\s*(.*?)\s*$")
MET, NOT_MET, NOT_MEASURED = "met", "NOT met", "not measured"


class ExpectationError(ValueError):
    """An expectations file or block that cannot be used."""


@dataclass(frozen=True)
class Expectation:
    """A bound on the values a report field takes."""

    name: str
    field: str
    description: str = ""
    min: Optional[float] = None
    max: Optional[float] = None

    def bound(self) -> str:
        """Return the bound in words."""
        if self.min is not None and self.max is not None:
            return f"between {self.min:g} and {self.max:g}"
        return f"at least {self.min:g}" if self.min is not None else f"at most {self.max:g}"

    def margin(self, value: float) -> float:
        """Return how far `value` lies inside the bounds (negative outside)."""
        low = value - self.min if self.min is not None else math.inf
        high = self.max - value if self.max is not None else math.inf
        return min(low, high)


@dataclass(frozen=True)
class Verdict:
    """An expectation judged against a report: the value with the least margin, where it is, and how many."""

    expectation: Expectation
    value: Optional[float]
    where: str = ""
    count: int = 0

    @property
    def status(self) -> str:
        """Return met, NOT met or not measured."""
        if self.value is None:
            return NOT_MEASURED
        return MET if self.expectation.margin(self.value) >= 0 else NOT_MET

    def line(self) -> str:
        """Return the verdict as one Markdown list item."""
        e = self.expectation
        head = f"- {e.description or e.name} ({e.bound()}): "
        if self.value is None:
            return head + f"not measured (nothing at `{e.field}`)"
        at = f" (worst of {self.count}: `{self.where}`)" if self.count > 1 else ""
        return head + f"{self.value:.3g}{at}, **{self.status}**"


def parse_block(block: Optional[Mapping[str, Any]]) -> List[Expectation]:
    """Return the expectations of one benchmark's block, checking every entry."""
    if block is None:
        return []
    if not isinstance(block, Mapping):
        raise ExpectationError(f"expected a mapping of expectation names to entries, got {type(block).__name__}")
    return [_parse_entry(str(name), entry) for name, entry in block.items()]


def _parse_entry(name: str, entry: Any) -> Expectation:
    """Return one expectation, or raise ExpectationError naming what is wrong with it."""
    if not isinstance(entry, Mapping):
        raise ExpectationError(f"{name}: expected a mapping with field and min and/or max, got {entry!r}")
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise ExpectationError(f"{name}: unknown key {unknown[0]!r}, expected one of {', '.join(sorted(KEYS))}")
    if not isinstance(entry.get("field"), str) or not entry["field"]:
        raise ExpectationError(f"{name}: field must be a dotted path into the report, got {entry.get('field')!r}")
    bounds = {}
    for key in ("min", "max"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ExpectationError(f"{name}: {key} must be a number, got {value!r}")
        bounds[key] = None if value is None else float(value)
    if bounds["min"] is None and bounds["max"] is None:
        raise ExpectationError(f"{name}: give min, max or both")
    return Expectation(name, entry["field"], str(entry.get("description") or ""), bounds["min"], bounds["max"])


def load(path: str, benchmark: str) -> Optional[Dict[str, Any]]:
    """Return the block of `benchmark` in the expectations file at `path` (None when it has none)."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise ExpectationError(f"cannot read expectations {path!r}: {exc}") from None
    if data is not None and not isinstance(data, Mapping):
        raise ExpectationError(f"{path}: expected one block per benchmark name, got {type(data).__name__}")
    block = (data or {}).get(benchmark)
    try:
        parse_block(block)  # fail now, not after a long measurement
    except ExpectationError as exc:
        raise ExpectationError(f"{path}: {benchmark}: {exc}") from None
    return block


def split_path(path: str) -> List[str]:
    """Split a dotted path into segments, leaving dots inside brackets alone."""
    segments, depth, current = [], 0, ""
    for char in path:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "." and depth == 0:
            segments.append(current)
            current = ""
        else:
            current += char
    return segments + [current]


def _conditions(text: str) -> List[Tuple[str, Callable[[Any, Any], bool], Any]]:
    """Return the (field, comparison, value) conditions of a selector's text."""
    conditions = []
    for part in text.split(","):
        match = CONDITION.match(part)
        if not match:
            raise ExpectationError(f"selector condition {part!r}: expected FIELD OP VALUE, OP one of "
                                   f"{' '.join(OPERATORS)}")
        conditions.append((match.group(1), OPERATORS[match.group(2)], yaml.safe_load(match.group(3))))
    return conditions


def _selected(item: Any, conditions: List[Tuple[str, Callable[[Any, Any], bool], Any]]) -> bool:
    """Return whether a list item satisfies every condition (a comparison that cannot be made fails)."""
    if not isinstance(item, Mapping):
        return False
    try:
        return all(key in item and compare(item[key], value) for key, compare, value in conditions)
    except TypeError:
        return False


def _children(node: Any, key: str) -> Iterator[Tuple[str, Any]]:
    """Yield (name, child) of a dict key (glob allowed) or a list index (* for every item)."""
    if isinstance(node, Mapping):
        if key in node:
            yield key, node[key]
        elif any(c in key for c in "*?"):
            yield from ((name, child) for name, child in node.items() if fnmatch.fnmatchcase(str(name), key))
    elif isinstance(node, list):
        if key == "*":
            yield from ((str(i), child) for i, child in enumerate(node))
        elif key.lstrip("-").isdigit() and -len(node) <= int(key) < len(node):
            yield key, node[int(key)]


def _label(item: Mapping[str, Any], conditions: List[Tuple[str, Callable[[Any, Any], bool], Any]]) -> str:
    """Return a selected item's name: its values of the fields the selector tested."""
    return "[" + ",".join(f"{key}={item[key]}" for key, _, _ in conditions) + "]"


def resolve(node: Any, path: str) -> List[Tuple[str, Any]]:
    """Return (concrete path, value) of everything `path` reaches in `node`."""
    found = [("", node)]
    for segment in split_path(path):
        key, _, selector = segment.partition("[")
        step = []
        for where, value in found:
            children = _children(value, key) if key else iter([("", value)])
            for name, child in children:
                step.append((f"{where}.{name}" if where and name else where or name, child))
        if selector:
            conditions = _conditions(selector.rstrip("]"))
            step = [(where + _label(item, conditions), item) for where, value in step if isinstance(value, list)
                    for item in value if _selected(item, conditions)]
        found = step
    return found


def judge(report: Mapping[str, Any], expectation: Expectation) -> Verdict:
    """Return the verdict of one expectation on a report."""
    values = []
    for where, value in resolve(report, expectation.field):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExpectationError(f"{expectation.name}: {where or expectation.field} is {value!r}, not a number")
        values.append((where, float(value)))
    if not values:
        return Verdict(expectation, None)
    where, value = min(values, key=lambda pair: expectation.margin(pair[1]))
    return Verdict(expectation, value, where, len(values))


def evaluate(report: Mapping[str, Any], block: Optional[Mapping[str, Any]]) -> List[Verdict]:
    """Return the verdict of every expectation of a benchmark's block on its report."""
    return [judge(report, expectation) for expectation in parse_block(block)]


def section(report: Mapping[str, Any], block: Optional[Mapping[str, Any]]) -> List[str]:
    """Return the report's Expectations section as Markdown lines (none without a block)."""
    if block is None:
        return []
    lines = ["## Expectations", "", "Bounds from the expectations file, judged against the figures above:", ""]
    verdicts = evaluate(report, block)
    return lines + ([v.line() for v in verdicts] or ["- none given"]) + [""]
