"""Every reference of the code to docs/design.md names a heading that the page has."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = re.compile(r"docs/design\.md#([a-z0-9-]+)")


def anchors(page: str) -> set:
    """Return the anchors of a Markdown page's headings, as the site's table of contents makes them."""
    found = set()
    for line in page.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return found


def references() -> list:
    out = []
    for folder, _, files in os.walk(os.path.join(ROOT, "psframework")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as fh:
                    out += [(os.path.relpath(path, ROOT), anchor) for anchor in REFERENCE.findall(fh.read())]
    return out


def test_every_design_reference_of_the_code_names_a_heading_of_the_page():
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as fh:
        headings = anchors(fh.read())
    refs = references()
    assert len(refs) >= 3
    dangling = [f"{path}: #{anchor}" for path, anchor in refs if anchor not in headings]
    assert not dangling, f"references to headings docs/design.md does not have: {dangling}"


def test_no_code_cites_a_design_file_outside_the_repository():
    cited = []
    for folder, _, files in os.walk(os.path.join(ROOT, "psframework")):
        for name in (n for n in files if n.endswith(".py")):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                if re.search(r"DESIGN(\.md)? section|DESIGN\s+§", fh.read()):
                    cited.append(name)
    assert not cited, f"modules citing a design section by number instead of docs/design.md: {cited}"
