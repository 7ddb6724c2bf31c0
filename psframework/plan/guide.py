"""Write docs/choosing.md, the guide to pick a scheme, from the model and the kept profiles.

    python -m psframework.plan.guide [--out docs/choosing.md]

Every figure in the page comes from `psf plan`'s model with the profiles `psf bench plan` keeps
(docs/benchmarks/plan/profiles), so that the page changes with them and is never typed by hand.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional, Sequence

from psframework.fileio import atomic_write_text
from psframework.plan.choose import proposed, recommend, rows, setups
from psframework.plan.cluster import Cluster, Straggler, parse_rate
from psframework.plan.graphs import DDP, Setup
from psframework.plan.predict import predict
from psframework.plan.profile import Profile, load
from psframework.schemes.registry import get_scheme, scheme_names

PROFILES = os.path.join("docs", "benchmarks", "plan", "profiles")
MODELS = ("vgg-small-b64", "lenet5-b64", "resnet20-b32")  # a big head, a small model, no head at all
LINKS = ("1gbit", "10gbit", "100gbit")
STRAGGLERS = ("none", "stopgo:0.8")
HOSTS = 33


def cluster(profile: Profile, link: str, straggler: str) -> Cluster:
    """Return a cluster of HOSTS nodes with a core per rank and the given link."""
    shm = profile.links["shm"]
    return Cluster(hosts=HOSTS, cores_per_host=1.0, link_Bps=parse_rate(link), latency_s=5e-6, local=shm,
                   remote=profile.links.get("tcp", shm), straggler=Straggler.parse(straggler))


def recommendations(profiles: Sequence[Profile]) -> List[str]:
    names = [s.name for s in proposed()] + [DDP]
    out = ["| model (head share) | link | straggler | recommendation (from `psf plan`) |", "|---|---|---|---|"]
    for profile in profiles:
        head = profile.head_params / profile.params
        for link in LINKS:
            for straggler in STRAGGLERS:
                c = cluster(profile, link, straggler)
                rec = recommend(profile, c, rows(profile, c, setups(HOSTS, names, (4, 8, 16, 32)))[0])
                out.append(f"| {profile.model}, batch {profile.batch} ({head:.0%}) | {link} | {straggler} | "
                           f"{rec.reason} |")
    return out


def tradeoffs(profile: Profile, n: int = 8) -> List[str]:
    """Return the trade-offs of the proposed schemes at n workers (rank 0's bytes from the model)."""
    c = cluster(profile, "10gbit", "none")
    out = [f"| scheme | what a worker computes | what a worker holds | rank 0 MB per iteration ({profile.model}, "
           f"n={n}) | replies rank 0 waits for |", "|---|---|---|---|---|"]
    for scheme in proposed():
        if scheme.coded:
            k = n - 1
            setup, work = Setup(scheme.name, n, k), f"a 1/{k} packet of every conv layer on the whole batch " \
                f"(n/k = {n / k:.2f} times the conv work in all)"
            holds, waits = "its coded share of the conv weights", f"the first k={k} of n"
        else:
            setup = Setup(scheme.name, n, n, backup=1 if scheme.backup_workers else 0)
            part = "the whole model" if scheme.worker_part == "model" else "the conv trunk"
            work, holds = f"{part} on 1/n of the batch", part
            waits = "the first n - b (b backup workers)" if scheme.backup_workers else "all n"
        mb = predict(profile, setup, c).rank0_bytes / 1e6
        out.append(f"| {scheme.name} | {work} | {holds} | {mb:.1f} | {waits} |")
    return out


def baselines() -> List[str]:
    """Return the schemes a plan does not propose and what they are for."""
    return [f"- `{name}`: {get_scheme(name).summary}" for name in scheme_names() if not get_scheme(name).proposed]


def render(profiles: Sequence[Profile]) -> str:
    vgg = profiles[0]
    lines = ["# Choosing a scheme", "",
             "`psf plan CONFIG --hosts N --link RATE` predicts every scheme on your cluster and recommends one. "
             "This page shows what it says for a few models and clusters, and why.", "",
             f"- The figures come from profiles taken on {vgg.machine} (`psf bench plan` keeps them in "
             "docs/benchmarks/plan/profiles).",
             "- On your cluster, take your own profile first: `psf plan calibrate CONFIG` on one node (one rank, "
             "nothing else running), then `psf plan CONFIG --profile FILE --hosts N --link RATE`.",
             "- A plan replays only the setups that can win: one whose processor work alone, over its busiest "
             "pool's cores, takes over 1.5x the best iteration so far is left out (stderr says how many). A plan "
             "that runs past 5 s says on stderr how far it has got.",
             "- How well the model predicts: [the model against measured runs](benchmarks/plan.md).", "",
             "## The real choices", "",
             "Three schemes are meant for training; psf plan proposes only them, with n, k, backup workers b, "
             "servers G and, for sazd, direct or relay delivery:", ""]
    lines += tradeoffs(vgg)
    lines += ["", "How they differ:", "",
              "- **stanza** keeps the FC head on rank 0 and moves only the conv parameters, the features and their "
              "gradients: it wins when the head holds most of the parameters (`psf model-info CONFIG` prints the "
              "share), and a ResNet or VGG-16 with no FC head moves as much as ps.",
              "- **ps** moves every parameter to and from every worker each iteration: fine for small models or fast "
              "links, and its backup workers ride out a slow worker.",
              "- **sazd** computes each conv layer from any k of n workers: a stopped or slow worker costs nothing, "
              "at n/k times the conv work and with rank 0 sending each layer's input to every worker (relay lets "
              "the workers forward it among themselves). Each parity packet of the shift-and-add code is longer, "
              "so keep n - k small (1 or 2) at large n.",
              "", "Baselines and oracles, for measuring the choices against (never proposed):", ""]
    lines += baselines()
    lines += ["", "torch DDP is predicted beside them as the baseline the recommendation is compared with.", "",
              f"## What psf plan recommends ({HOSTS} nodes, a core per rank, 5 us latency)", ""]
    lines += recommendations(profiles)
    lines += ["", "Read a row as: the scheme and shape with the most images per second over n = 4 to 32, the reason, "
              "and how many times DDP's speed it reaches at DDP's best n; \"stay on DDP\" where DDP's best is "
              "predicted faster. A worker stopped 80% of the time holds DDP up every iteration; the first-k and backup "
              "schemes go on without it.", "",
              "No row recommends sazd: with one backup worker, ps and stanza ride out the stopped worker too, "
              "without sazd's extra coded conv work and rank 0's decoding.", ""]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psframework.plan.guide", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("docs", "choosing.md"))
    args = parser.parse_args(argv)
    profiles = [load(os.path.join(PROFILES, f"{name}.json")) for name in MODELS]
    atomic_write_text(args.out, render(profiles))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
