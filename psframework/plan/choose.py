"""The setups a plan compares, their predictions, and the one it recommends with its reason.

The real choices are ps, stanza and sazd (direct or relay) with their n, k, backup workers and
servers G; torch DDP is predicted beside them as the baseline. Uncoded, poly and sazd-naive are
baselines and oracles of the project and are not proposed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from psframework.plan.cluster import Cluster
from psframework.plan.graphs import DDP, Setup
from psframework.plan.predict import Prediction, predict, work_bound_s
from psframework.plan.profile import Profile
from psframework.schemes.registry import Scheme, get_scheme, scheme_names

WORKER_COUNTS = (2, 4, 8, 16, 32, 64, 128, 256)
SERVER_COUNTS = (1, 2, 4)


def proposed() -> List[Scheme]:
    """Return the schemes a plan proposes (the registry's real choices), in registration order."""
    return [get_scheme(name) for name in scheme_names() if get_scheme(name).proposed]


def plan_names() -> List[str]:
    """Return what --schemes may name: the proposed schemes and DDP."""
    return [s.name for s in proposed()] + [DDP]


def code_sizes(n: int) -> List[int]:
    """Return the k a plan tries for n workers: one or two parities (more make SA packets long), and n - n/4."""
    ks = {n - 1, n - 2, n - max(1, n // 4)} if n >= 4 else {n - 1}
    return sorted(k for k in ks if 1 <= k < n)


def shapes(scheme: Scheme, n: int, g: int) -> List[Setup]:
    """Return the setups of one scheme with n workers per server and g servers."""
    if scheme.coded:
        return [Setup(scheme.name, n, k, g, d) for k in code_sizes(n) for d in ("direct", "relay")]
    # Workers that sum their state across the groups move in step: no backup workers with several servers.
    backups = (0, 1) if scheme.backup_workers and not (g > 1 and scheme.workers_sum_across_groups) else (0,)
    return [Setup(scheme.name, n, n, g, backup=b) for b in backups if b < n]


def setups(max_ranks: int, names: Sequence[str], counts: Sequence[int] = WORKER_COUNTS) -> List[Setup]:
    """Return every setup of the named schemes (and DDP) whose ranks fit in `max_ranks`."""
    out: List[Setup] = []
    chosen = [s for s in proposed() if s.name in names]
    for n in counts:
        for g in SERVER_COUNTS:
            if g * (n + 1) <= max_ranks:
                out += [setup for scheme in chosen for setup in shapes(scheme, n, g)]
        if DDP in names and n <= max_ranks:
            out.append(Setup(DDP, n, n))
    return out


# A setup whose processor work alone, spread over its busiest pool's cores, takes this many times the best
# iteration so far cannot win: it is not replayed (on one host, hundreds of workers share a few cores).
PRUNE_MARGIN = 1.5


PROGRESS_EVERY_S = 5.0


def rows(profile: Profile, cluster: Cluster, candidates: Sequence[Setup],
         say: Optional[Callable[[str], None]] = None) -> Tuple[List[Prediction], List[Setup]]:
    """Predict every candidate that can win; return the predictions and the setups left out.

    Candidates come fewest workers first, so a good best is known early. DDP is always predicted (the
    baseline). `say` hears how far the predictions have got every PROGRESS_EVERY_S seconds.
    """
    predictions: List[Prediction] = []
    skipped: List[Setup] = []
    best = math.inf
    told = time.monotonic()
    for i, setup in enumerate(candidates):
        if say is not None and time.monotonic() - told > PROGRESS_EVERY_S:
            say(f"{i} of {len(candidates)} setups weighed ({len(skipped)} left out), now {setup.scheme} n={setup.n}")
            told = time.monotonic()
        if setup.scheme != DDP and work_bound_s(profile, setup, cluster) > PRUNE_MARGIN * best:
            skipped.append(setup)
            continue
        p = predict(profile, setup, cluster)
        predictions.append(p)
        if setup.scheme != DDP:
            best = min(best, p.iteration_s)
    return predictions, skipped


def row_json(p: Prediction) -> Dict[str, Any]:
    """Return one row of `psf plan --json` (the documented, stable fields)."""
    s = p.setup
    return {"scheme": s.scheme, "n": s.n, "k": s.k, "servers": s.servers, "dissemination": s.dissemination,
            "backup_workers": s.backup, "iteration_s": p.iteration_s, "images_per_s": p.images_per_s,
            "rank0_bytes": p.rank0_bytes}


@dataclass(frozen=True)
class Recommendation:
    """The setup a plan proposes and why, in one line."""

    best: Prediction
    reason: str
    ddp: Optional[Prediction]

    @property
    def stay_on_ddp(self) -> bool:
        """Return whether torch DDP is predicted faster than every setup of psframework's."""
        return stays_on_ddp(self.best, self.ddp)

    def to_json(self) -> Dict[str, Any]:
        return {**row_json(self.best), "reason": self.reason, "stay_on_ddp": self.stay_on_ddp,
                "over_ddp": None if self.ddp is None else self.ddp.iteration_s / self.best.iteration_s}


def stays_on_ddp(best: Prediction, ddp: Optional[Prediction]) -> bool:
    """Return whether DDP's best setup is predicted faster than psframework's best."""
    return ddp is not None and ddp.images_per_s > best.images_per_s


def recommend(profile: Profile, cluster: Cluster, predictions: Sequence[Prediction]) -> Recommendation:
    """Return the fastest real choice (most images per second) and the reason for it, or for staying on DDP."""
    choices = [p for p in predictions if p.setup.scheme != DDP]
    best = max(choices, key=lambda p: p.images_per_s)
    ddps = [p for p in predictions if p.setup.scheme == DDP]
    ddp = max(ddps, key=lambda p: p.images_per_s) if ddps else None
    return Recommendation(best, reason(profile, cluster, best, ddp), ddp)


def reason(profile: Profile, cluster: Cluster, best: Prediction, ddp: Optional[Prediction]) -> str:
    """Return, in one line, why `best` wins or, where DDP is faster, that a DDP user gains nothing by moving."""
    choice = choice_reason(profile, cluster, best)
    if ddp is None:
        return choice
    if stays_on_ddp(best, ddp):
        return (f"stay on DDP (n={ddp.setup.n}): it is predicted {best.iteration_s / ddp.iteration_s:.2f}x as "
                f"fast as psframework's best, {choice}")
    return f"{choice}; {ddp.iteration_s / best.iteration_s:.2f}x DDP's speed at n={ddp.setup.n}"


def choice_reason(profile: Profile, cluster: Cluster, best: Prediction) -> str:
    """Return the setup `best` and why it beats psframework's other setups."""
    s = best.setup
    head = profile.head_params / profile.params if profile.params else 0.0
    wire = best.rank0_bytes / cluster.link_Bps if not math.isinf(cluster.link_Bps) else 0.0
    slow = wire > 0.3 * best.iteration_s
    links = "the links are slow" if slow else "the links keep up"
    scheme = get_scheme(s.scheme)
    if scheme.cuts_model and head >= 0.5:
        why = f"the head holds {head:.0%} of the parameters, so only features cross rank 0's link, and {links}"
    elif scheme.cuts_model:
        why = f"rank 0 runs the head ({head:.0%} of the parameters) while the workers share the trunk, and {links}"
    elif scheme.coded:
        why = f"rank 0 decodes each coded layer from the first {s.k} of {s.n} workers"
    else:
        why = f"the model is small against the links ({best.rank0_bytes / 1e6:.1f} MB at rank 0 per iteration) " \
              f"and {links}"
    if cluster.straggler.kind != "none":
        why += f", with {cluster.straggler.words()}"
    shape = f"n={s.n}" + (f", k={s.k}, {s.dissemination}" if scheme.coded else "") \
        + (f", G={s.servers}" if s.servers > 1 else "") + (f", {s.backup} backup worker" if s.backup else "")
    return f"{s.scheme} ({shape}): {why}"
