"""psf report's labels (what tells the runs apart) and straggler twins (the same run without stragglers)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence, Tuple

from psframework.report_runs import Run, mean_iteration_s, number, scheme_traits

MAX_LABEL_KEYS = 4
# Keys that do not tell runs apart in a label or for the straggler twin comparison.
IGNORED_KEYS = ("name",)
IGNORED_PREFIXES = ("output.",)
# Keys that mean nothing for a run in one process.
MPI_ONLY_PREFIXES = ("code.", "stragglers.", "comm.")


def show(value: Any) -> str:
    """Return a config value the way an override writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def label_items(run: Run) -> Dict[str, str]:
    """Return the config values that may tell this run apart from others."""
    mpi, _ = scheme_traits(run)
    items = {}
    for key, value in run.config.items():
        if key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES):
            continue
        if mpi is False and key.startswith(MPI_ONLY_PREFIXES):
            continue
        items[key] = show(value)
    return items


def differing_keys(runs: Sequence[Run], items: Sequence[Dict[str, str]]) -> List[str]:
    """Return the keys whose values differ between runs: scheme, the sweep's overrides, then the rest."""
    order: List[str] = ["scheme"]
    for run in runs:
        order += [o.split("=", 1)[0] for o in run.overrides if "=" in o]
    override_keys = set(order)
    for each in items:
        order += list(each)
    keys = []
    for key in dict.fromkeys(order):
        if len({each[key] for each in items if key in each}) > 1:
            keys.append(key)
    if len(keys) > MAX_LABEL_KEYS:
        keys = [key for key in keys if key in override_keys] or keys[:MAX_LABEL_KEYS]
    return keys


def merge_seeds(runs: Sequence[Run], keys: List[str], items: Sequence[Dict[str, str]]) -> List[str]:
    """Write train.seed and data.seed as one "seed" (the repeat of a sweep point, else the shared value)."""
    if not {"train.seed", "data.seed"} <= set(keys):
        return keys
    seeds = [str(run.repeat) if run.repeat is not None else each.get("train.seed")
             for run, each in zip(runs, items)]
    if any(run.repeat is None and each.get("train.seed") != each.get("data.seed") for run, each in zip(runs, items)):
        return keys
    for each, seed in zip(items, seeds):
        if seed is not None:
            each["seed"] = seed
    return [("seed" if key == "train.seed" else key) for key in keys if key != "data.seed"]


def assign_labels(runs: Sequence[Run]) -> None:
    """Label every run by what differs between the runs (its name when nothing does); labels are unique."""
    items = [label_items(run) for run in runs]
    keys = merge_seeds(runs, differing_keys(runs, items), items)
    labels = [", ".join(f"{key}={each[key]}" for key in keys if key in each) for each in items]
    counts = {label: labels.count(label) for label in labels}
    labels = [label if label and counts[label] == 1 else ", ".join(filter(None, [label, run.name]))
              for label, run in zip(labels, runs)]
    for index, (run, label) in enumerate(zip(runs, labels)):
        run.label = f"{label} #{labels[:index].count(label) + 1}" if labels.count(label) > 1 else label


def stragglers_off(config: Dict[str, Any]) -> bool:
    """Return whether a config injects no stragglers: model none, or a slowdown model that slows nothing."""
    model = str(config.get("stragglers.model", "none"))
    factor = number(config.get("stragglers.factor"))
    factor = 1.0 if factor is None else factor
    if model == "none":
        return True
    if model in ("fixed", "random"):
        return factor <= 1.0
    if model in ("exponential", "pareto"):
        return factor == 0.0
    return factor == 1.0 and number(config.get("stragglers.pause_s")) == 0.0


def twin_key(config: Dict[str, Any]) -> Dict[str, Any]:
    """Return the config without its name, outputs and straggler settings."""
    return {key: value for key, value in config.items() if key not in IGNORED_KEYS
            and not key.startswith(IGNORED_PREFIXES + ("stragglers.",))}


def straggler_pairs(runs: Sequence[Run]) -> Tuple[List[Tuple[Run, Run, float]], List[Run]]:
    """Return (run with stragglers, its straggler-free twin, slowdown) triples and the runs without a twin."""
    pairs, lonely = [], []
    measured = [run for run in runs if run.started and mean_iteration_s(run)]
    for run in measured:
        if stragglers_off(run.config) or scheme_traits(run)[0] is False:
            continue
        key = twin_key(run.config)
        twins = [t for t in measured if t is not run and stragglers_off(t.config) and twin_key(t.config) == key]
        if twins:
            pairs.append((run, twins[0], mean_iteration_s(run) / mean_iteration_s(twins[0])))
        else:
            lonely.append(run)
    return pairs, lonely
