"""Draw one iteration of each scheme in docs/diagrams/iterations.yaml as an SVG sequence diagram.

Run `python hpc/draw_iterations.py` after editing the YAML; it writes docs/img/iteration-NAME.svg.
Text stays text in the SVG (searchable, and the tests check every label is drawn).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "docs", "diagrams", "iterations.yaml")
OUT = os.path.join(ROOT, "docs", "img")
WORKERS = 4
LATE = 3  # the worker whose reply arrives after rank 0 has taken the first ones


def lanes(side: Any) -> List[int]:
    """Return the lane numbers of `side`: 0 for rank 0, 1..WORKERS for the workers."""
    return [0] if side == 0 else list(range(1, WORKERS + 1))


def draw_send(ax: Any, y: float, send: Dict[str, Any]) -> float:
    """Draw a message from one side to the other (gathered replies arrive one after another); return its height."""
    gather = send["from"] != 0
    first = send.get("first", WORKERS)
    arrivals = [w for w in range(1, WORKERS + 1) if w != LATE] + [LATE]  # the order replies reach rank 0
    for w in range(1, WORKERS + 1):
        late = gather and first < WORKERS and w == LATE
        start, end = (w, 0) if gather else (0, w)
        drop = 0.55 + 0.22 * arrivals.index(w) if gather else 0.55
        ax.annotate("", xy=(end, y - drop), xytext=(start, y - 0.3),
                    arrowprops=dict(arrowstyle="-|>", color="0.6" if late else "black",
                                    linestyle="--" if late else "-", lw=1.0, shrinkA=0, shrinkB=0))
        if late:
            ax.text(0.12, y - drop - 0.1, "late: not waited for", ha="left", va="center", fontsize=8, color="0.45")
    label = send["label"] + (f": rank 0 takes the first {first}" if gather and first < WORKERS else "")
    ax.text(WORKERS / 2, y - 0.1, label, ha="center", va="center", fontsize=9, color="#1f4e79",
            bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none"))
    return 0.55 + 0.22 * WORKERS if gather else 0.85


def draw_note(ax: Any, y: float, note: Dict[str, Any]) -> float:
    """Draw the work a side does as a box across its lanes; return its height."""
    sides = lanes(note["at"])
    left, right = min(sides) - 0.35, max(sides) + 0.35
    if note["at"] == 0:
        right = WORKERS + 0.35  # rank 0's work is described at length: the box spans the figure, on lane 0's row
    ax.add_patch(_box(left, y - 0.55, right - left, 0.45, "#fff2cc" if note["at"] == 0 else "#e2efda"))
    ax.text((left + right) / 2, y - 0.325, note["label"], ha="center", va="center", fontsize=9)
    return 0.7


def _box(x: float, y: float, w: float, h: float, colour: str) -> Any:
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=colour, edgecolor="0.4", lw=0.8)


def height_of(step: Dict[str, Any]) -> float:
    """Return the vertical room a step takes (as draw_send and draw_note use it)."""
    if "note" in step:
        return 0.7
    return 0.55 + 0.22 * WORKERS if step["send"]["from"] != 0 else 0.85


def draw(name: str, spec: Dict[str, Any], out_dir: str) -> str:
    """Write docs/img/iteration-NAME.svg for one scheme; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "psframework", "font.family": "DejaVu Sans"})
    steps = spec["steps"]
    height = sum(height_of(step) for step in steps) + 0.2
    fig, ax = plt.subplots(figsize=(10, 0.75 * height + 1.0))
    ax.set_xlim(-0.6, WORKERS + 0.6)
    ax.set_ylim(-height, 0.9)
    ax.axis("off")
    ax.set_title(spec["title"], fontsize=10, loc="left", pad=28)
    for lane in range(WORKERS + 1):
        ax.plot([lane, lane], [0.2, -height], color="0.75", lw=0.8, zorder=0)
        ax.text(lane, 0.25, "rank 0\n(server)" if lane == 0 else f"worker {lane}", ha="center", va="bottom",
                fontsize=9, fontweight="bold")
    y = 0.0
    for step in steps:
        y -= draw_send(ax, y, step["send"]) if "send" in step else draw_note(ax, y, step["note"])
    path = os.path.join(out_dir, f"iteration-{name}.svg")
    os.makedirs(out_dir, exist_ok=True)
    tmp = path + ".partial"
    fig.savefig(tmp, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    os.replace(tmp, path)
    return path


def main(argv: List[str]) -> int:
    """Draw every scheme of the source file."""
    with open(SOURCE) as fh:
        source = yaml.safe_load(fh)
    for name, spec in source.items():
        print("wrote", os.path.relpath(draw(name, spec, OUT), ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
