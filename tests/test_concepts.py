"""The concepts page's diagrams: drawn from docs/diagrams/iterations.yaml, every label of the source in its SVG."""

from __future__ import annotations

import os
import re
from xml.sax.saxutils import escape

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "docs", "diagrams", "iterations.yaml")
REDRAW = "run `python hpc/draw_iterations.py` to draw it again"


def diagrams() -> dict:
    with open(SOURCE) as fh:
        return yaml.safe_load(fh)


def labels(spec: dict) -> list:
    return [spec["title"]] + [next(iter(step.values()))["label"] for step in spec["steps"]]


@pytest.mark.parametrize("scheme", sorted(diagrams()))
def test_every_label_of_the_source_is_drawn_in_its_svg(scheme):
    path = os.path.join(ROOT, "docs", "img", f"iteration-{scheme}.svg")
    assert os.path.isfile(path), f"{path} is missing: {REDRAW}"
    with open(path, encoding="utf-8") as fh:
        svg = fh.read()
    missing = [text for text in labels(diagrams()[scheme]) if escape(text) not in svg]
    assert not missing, f"{path} does not show {missing}: {REDRAW}"


def test_the_concepts_page_shows_every_diagram_and_the_proposed_schemes_have_one():
    from psframework.schemes.registry import get_scheme, scheme_names

    with open(os.path.join(ROOT, "docs", "concepts.md"), encoding="utf-8") as fh:
        page = fh.read()
    shown = set(re.findall(r"\(img/iteration-([a-z-]+)\.svg\)", page))
    assert shown == set(diagrams())
    assert {name for name in scheme_names() if get_scheme(name).proposed} <= shown
