"""The errors of `psf bench plan`'s cases: the bounds they are judged against, their summary, the rankings.

Only the report's case rows are needed, so the benchmark overview judges the plan report with the same code
its own page uses.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any, Dict, List, Mapping, Sequence

MEDIAN_BOUND, WORST_BOUND, HELD_OUT_BOUND = 0.10, 0.25, 0.15
RANK_GAP = 0.15  # measured times that differ by more than this must be ordered alike by the model
CPU_GAP = 0.15  # a miss whose processor time is this close is one of overlap, not of the pieces' cost


def summary(cases: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Return the errors and ranking agreement of the validation and the held-out cases."""
    valid = [c for c in cases if not c["held_out"]]
    held = [c for c in cases if c["held_out"]]
    errors = [abs(c["error"]) for c in valid]
    return {"cases": len(valid), "median_error": statistics.median(errors) if errors else None,
            "worst_error": max(errors) if errors else None, "held_out": len(held),
            "held_out_worst": max((abs(c["error"]) for c in held), default=None),
            "pairs": ranking(valid)}


def ranking(cases: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Return how many pairs of one setting the model orders as measured, where their times differ > RANK_GAP."""
    groups: Dict[tuple, List[Mapping[str, Any]]] = {}
    for c in cases:
        groups.setdefault((c["workload"], c["n"], c["link"], c["network"]), []).append(c)
    agree, wrong = 0, []
    for group in groups.values():
        for a, b in itertools.combinations(group, 2):
            if max(a["measured_s"], b["measured_s"]) < (1 + RANK_GAP) * min(a["measured_s"], b["measured_s"]):
                continue
            if (a["measured_s"] < b["measured_s"]) == (a["predicted_s"] < b["predicted_s"]):
                agree += 1
            else:
                wrong.append(f"{a['label']} / {b['contender']}")
    return {"compared": agree + len(wrong), "agree": agree, "disagree": wrong}


def missed_term(case: Mapping[str, Any]) -> str:
    """Return which part of the model misses a case: the pieces' processor time, or their overlap."""
    cpu_err = case["predicted_cpu_s"] / case["measured_cpu_s"] - 1.0 if case["measured_cpu_s"] else 0.0
    cpu = f"processor time {case['predicted_cpu_s'] * 1e3:.0f} ms predicted, {case['measured_cpu_s'] * 1e3:.0f} ms " \
          "measured (all ranks)"
    if abs(cpu_err) > CPU_GAP:
        return f"the pieces' cost: {cpu}"
    return f"the overlap of the work (waiting, sharing the cores), not its amount: {cpu}"
