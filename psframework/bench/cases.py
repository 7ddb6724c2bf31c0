"""Case files of the training benchmarks: the jobs to train, their labels, the ratios to report and the prose.

`psf bench schemes` and `psf bench stragglers` each read a case file (configs/bench/NAME.yaml by
default, --cases FILE for another). A case file holds

    configs:        NAME: path of an experiment config, for each config the cases train
    cases:          the jobs, in the order they run; each has
      role:         its name in ratios and text (a letter, then letters, digits and _)
      config:       a NAME from configs
      overrides:    KEY=VALUE config overrides (optional)
      label:        its row in the report's table
      if_emulated:  true: train it only when a case without this flag emulates its links (optional)
    ratios:         the figures to report (optional); each has
      name:         its key under `ratios` in NAME.json
      numerator:    {case: ROLE or [ROLE, ...], field: FIELD or [FIELD, ...]}: the sum of the fields of the
      denominator:  summary of the first listed case that ran; the ratio is left out when none of them ran
      if_emulated:  true: compute it only when some case emulates its links (optional)
      text:         its Markdown list item in the report (optional)
    text:           prose of the report (optional): intro (a paragraph before the table), ratios_title
                    (the heading of the ratios, default "Ratios") and closing (a paragraph after them)

Strings hold fields as {path}, {path+N}, {path-N} or {path:spec} (spec: a Python format spec; {{ and }}
write braces). Overrides see the setting of their config under the benchmark's overrides (scheme, n,
k, batch_size, ...: see runs.setting); labels see the case's own setting after its overrides, with
`link` in words. Text sees each ratio by name and each case by role: {ROLE.label}, {ROLE.config},
{ROLE.overrides}, {ROLE.ranks} and the fields of its summary ({ROLE.mean_iteration_s}); a ratio's text
also sees {value} and the cases it divided, {numerator.label} and {denominator.label}. The report
records the ratios and the text, so that it renders from its JSON alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

import yaml

NAME = re.compile(r"^[A-Za-z]\w*$")
FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*(?:\.\w+)*)([+-]\d+)?(?::([^{}]*))?\}")
SIDES = ("numerator", "denominator")
RATIO_FIELDS = ("value",) + SIDES  # what a ratio's text sees beside the ratios and cases
KEYS = {"the case file": {"configs", "cases", "ratios", "text"},
        "case": {"role", "config", "overrides", "label", "if_emulated"},
        "ratio": {"name", "numerator", "denominator", "if_emulated", "text"},
        "operand": {"case", "field"}, "text": {"intro", "ratios_title", "closing"}}
Report = Mapping[str, Any]
T = TypeVar("T")
CaseFields = Callable[[Mapping[str, Any], Mapping[str, Any]], Dict[str, Any]]  # (summary, case inputs) -> fields


class CaseFileError(ValueError):
    """A case file that cannot be used."""


@dataclass(frozen=True)
class CaseSpec:
    """One job as the case file gives it: overrides and label may still hold fields."""

    role: str
    config: str  # a name from the case file's configs
    label: str
    overrides: Tuple[str, ...] = ()
    if_emulated: bool = False


@dataclass(frozen=True)
class CaseFile:
    """A checked case file. Ratios and text are kept as the report records them."""

    path: str
    configs: Dict[str, str]
    cases: Tuple[CaseSpec, ...]
    ratios: Tuple[Dict[str, Any], ...] = ()
    text: Dict[str, str] = field(default_factory=dict)


# Fields in strings.

def lookup(context: Mapping[str, Any], path: str) -> Any:
    """Return the value at a dotted path of nested mappings; KeyError when there is none."""
    value: Any = context
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise KeyError(f"no field {path!r}")
        value = value[key]
    return value


def fill(template: str, context: Mapping[str, Any]) -> str:
    """Return `template` with each {path}, {path+N}, {path-N} and {path:spec} replaced from `context`."""
    def one(match: "re.Match[str]") -> str:
        path, offset, spec = match.groups()
        if path is None:
            return match.group(0)[0]
        value = lookup(context, path)
        if offset:
            value = value + int(offset)
        return format(value, spec or "")
    return FIELD.sub(one, template)


def fields(template: str) -> List[str]:
    """Return the paths of the fields a string holds."""
    return [m.group(1) for m in FIELD.finditer(template) if m.group(1)]


# Reading and checking a case file.

def load(path: str, configs: Sequence[str] = ()) -> CaseFile:
    """Read and check the case file at `path`; each NAME=PATH of `configs` replaces one of its configs."""
    return read(path, "case file", lambda data: parse(path, data, configs))


def read(path: str, what: str, parse_data: Callable[[Any], T]) -> T:
    """Read the YAML file at `path` and return parse_data(data); CaseFileError, naming the file, otherwise."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise CaseFileError(f"cannot read {what} {path!r}: {exc}") from None
    try:
        return parse_data(data)
    except CaseFileError as exc:
        raise CaseFileError(f"{path}: {exc}") from None


def parse(path: str, data: Any, replaced: Sequence[str] = ()) -> CaseFile:
    """Return the case file that `data` (as read from YAML) describes; CaseFileError where it cannot be used."""
    data = _mapping(data, "the case file")
    configs = _configs(data.get("configs"), replaced)
    cases = tuple(_case(f"cases[{i}]", entry, configs) for i, entry in enumerate(_list(data.get("cases"), "cases")))
    roles = [c.role for c in cases]
    _unique(roles, "role")
    ratios = tuple(_ratio(f"ratios[{i}]", entry, roles)
                   for i, entry in enumerate(_list(data.get("ratios") or [], "ratios", empty=True)))
    _unique(roles + [r["name"] for r in ratios], "role or ratio name")
    text = _mapping(data.get("text") or {}, "text", "text")
    for key, value in text.items():
        _string(value, f"text: {key}")
    names = set(roles) | {r["name"] for r in ratios}
    _known_fields(((f"text: {key}", value) for key, value in text.items()), names)
    _known_fields(((f"ratio {r['name']}: text", r["text"]) for r in ratios if r["text"]), names | set(RATIO_FIELDS))
    return CaseFile(path, configs, cases, ratios, dict(text))


def _mapping(value: Any, where: str, kind: Optional[str] = None) -> Dict[str, Any]:
    """Return `value` if it is a mapping with known keys (those of KEYS[kind or where])."""
    return mapping(value, where, KEYS[kind or where])


def mapping(value: Any, where: str, known: Iterable[str]) -> Dict[str, Any]:
    """Return `value` if it is a mapping whose keys are all `known`; CaseFileError otherwise."""
    if not isinstance(value, dict):
        raise CaseFileError(f"{where}: expected a mapping, got {type(value).__name__}")
    known = set(known)
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise CaseFileError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})")
    return value


def _list(value: Any, where: str, empty: bool = False) -> List[Any]:
    """Return `value` if it is a list (a non-empty one unless `empty`)."""
    if not isinstance(value, list) or not (value or empty):
        raise CaseFileError(f"{where}: expected a{'' if empty else ' non-empty'} list")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise CaseFileError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not NAME.match(value) or value in RATIO_FIELDS:
        raise CaseFileError(f"{where}: got {value!r}, expected a letter, then letters, digits and _ "
                            f"(not {', '.join(RATIO_FIELDS)})")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise CaseFileError(f"{where}: expected true or false, got {value!r}")
    return value


def _unique(names: Sequence[str], what: str) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise CaseFileError(f"two entries share the {what} {name!r}")
        seen.add(name)


def _strings(value: Any, where: str) -> List[str]:
    """Return a string or a non-empty list of strings as a list."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise CaseFileError(f"{where}: expected a string or a non-empty list of strings, got {value!r}")
    return [_string(item, where) for item in items]


def _configs(value: Any, replaced: Sequence[str]) -> Dict[str, str]:
    """Return the case file's configs {name: path}, with the NAME=PATH entries of `replaced` applied."""
    if not isinstance(value, dict) or not value:
        raise CaseFileError("configs: expected a mapping of names to config paths")
    configs = {_name(name, "configs"): _string(path, f"configs: {name}") for name, path in value.items()}
    for entry in replaced:
        name, sep, path = entry.partition("=")
        if not sep or not path or name not in configs:
            raise CaseFileError(f"--config {entry!r}: expected NAME=PATH with NAME one of {', '.join(configs)}")
        configs[name] = path
    return configs


def _case(where: str, entry: Any, configs: Mapping[str, str]) -> CaseSpec:
    """Return one checked entry of `cases`."""
    entry = _mapping(entry, where, "case")
    role = _name(entry.get("role"), f"{where}: role")
    where = f"case {role}"
    if entry.get("config") not in configs:
        raise CaseFileError(f"{where}: config {entry.get('config')!r} is not one of {', '.join(configs)}")
    overrides = _list(entry.get("overrides") or [], f"{where}: overrides", empty=True)
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise CaseFileError(f"{where}: overrides: got {item!r}, expected KEY=VALUE")
    return CaseSpec(role, entry["config"], _string(entry.get("label"), f"{where}: label"), tuple(overrides),
                    _flag(entry.get("if_emulated", False), f"{where}: if_emulated"))


def _ratio(where: str, entry: Any, roles: Sequence[str]) -> Dict[str, Any]:
    """Return one checked entry of `ratios`, as the report records it."""
    entry = _mapping(entry, where, "ratio")
    name = _name(entry.get("name"), f"{where}: name")
    ratio: Dict[str, Any] = {"name": name}
    for side in SIDES:
        operand = _mapping(entry.get(side), f"ratio {name}: {side}", "operand")
        cases = _strings(operand.get("case"), f"ratio {name}: {side}: case")
        unknown = [role for role in cases if role not in roles]
        if unknown:
            raise CaseFileError(f"ratio {name}: {side}: no case has the role {unknown[0]!r}")
        ratio[side] = {"case": cases, "field": _strings(operand.get("field"), f"ratio {name}: {side}: field")}
    ratio["if_emulated"] = _flag(entry.get("if_emulated", False), f"ratio {name}: if_emulated")
    ratio["text"] = None if entry.get("text") is None else _string(entry["text"], f"ratio {name}: text")
    return ratio


def _known_fields(texts: Iterable[Tuple[str, str]], names: Iterable[str]) -> None:
    """Raise CaseFileError where a text's field starts with no known name."""
    names = set(names)
    for where, text in texts:
        for path in fields(text):
            if path.split(".")[0] not in names:
                raise CaseFileError(f"{where}: {{{path}}} names no case, ratio or field of a ratio")


# Ratios from the cases' summaries.

def first_of(entries: Mapping[str, Any], roles: Sequence[str]) -> Optional[Any]:
    """Return the entry of the first role in `roles` that `entries` has, or None."""
    return next((entries[role] for role in roles if role in entries), None)


def ratio_values(ratios: Sequence[Mapping[str, Any]], summaries: Mapping[str, Mapping[str, Any]],
                 emulated: bool) -> Dict[str, Optional[float]]:
    """Return {name: numerator / denominator} from the summaries of the cases that ran, {role: summary}.

    A ratio whose cases did not run, or that needs emulated links where none were, is left out; a missing
    field or a zero denominator gives None.
    """
    values: Dict[str, Optional[float]] = {}
    for ratio in ratios:
        if ratio["if_emulated"] and not emulated:
            continue
        sides = [first_of(summaries, ratio[side]["case"]) for side in SIDES]
        if None in sides:
            continue
        numerator, denominator = (_total(s, ratio[side]["field"]) for s, side in zip(sides, SIDES))
        values[ratio["name"]] = numerator / denominator if numerator is not None and denominator else None
    return values


def _total(summary: Mapping[str, Any], names: Sequence[str]) -> Optional[float]:
    """Return the sum of a summary's fields, or None where one is missing or not a number."""
    values = [summary.get(name) for name in names]
    return sum(values) if all(isinstance(v, (int, float)) for v in values) else None


# Prose of a report, from its JSON.

def context(report: Report, case_fields: Optional[CaseFields] = None) -> Dict[str, Any]:
    """Return what the report's text sees: each ratio by name, each case by role (its inputs and summary)."""
    ctx: Dict[str, Any] = dict(report.get("ratios") or {})
    for label, case in ((report.get("inputs") or {}).get("cases") or {}).items():
        summary = report["cases"][label]
        entry = dict(summary, label=label, config=case["config"], overrides=" ".join(case["overrides"]),
                     ranks=case["ranks"])
        if case_fields is not None:
            entry.update(case_fields(summary, case))
        ctx[case["role"]] = entry
    return ctx


def paragraph(report: Report, key: str, ctx: Mapping[str, Any]) -> List[str]:
    """Return the report's text `key` (intro, closing) with its fields filled, and a blank line; [] without it."""
    text = ((report.get("inputs") or {}).get("text") or {}).get(key)
    return [fill(text, ctx), ""] if text else []


def ratios_title(report: Report) -> str:
    """Return the heading of the report's ratios."""
    return ((report.get("inputs") or {}).get("text") or {}).get("ratios_title") or "Ratios"


def ratio_lines(report: Report, ctx: Mapping[str, Any]) -> List[str]:
    """Return a Markdown list item for each measured ratio that has a text."""
    values = report.get("ratios") or {}
    lines = []
    for ratio in (report.get("inputs") or {}).get("ratios") or []:
        value = values.get(ratio["name"])
        if ratio.get("text") and value is not None:
            sides = {side: first_of(ctx, ratio[side]["case"]) or {} for side in SIDES}
            lines.append("- " + fill(ratio["text"], dict(ctx, value=value, **sides)))
    return lines
