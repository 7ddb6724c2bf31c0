"""docs/benchmarks.md: written from the committed reports' JSON, its figures follow the JSON, unmet bounds listed."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from psframework.bench import overview

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(ROOT, "docs", "benchmarks")
EXPECTATIONS = os.path.join(REPORTS, "expectations.yaml")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
MAX_WORDS = 80


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


@pytest.fixture(scope="module")
def page() -> str:
    return overview.render(REPORTS, EXPECTATIONS)


@pytest.fixture
def reports(tmp_path) -> str:
    """A copy of the committed reports' JSON and the bounds, to change."""
    copy = tmp_path / "benchmarks"
    for entry in overview.ENTRIES:
        os.makedirs(copy / os.path.dirname(entry.path), exist_ok=True)
        shutil.copy(os.path.join(REPORTS, entry.path), copy / entry.path)
    shutil.copy(EXPECTATIONS, copy / "expectations.yaml")
    return str(copy)


def edit(reports: str, name: str, change) -> None:
    path = os.path.join(reports, name)
    report = json.loads(read(path))
    change(report)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh)


def test_the_page_is_the_one_its_renderer_writes_from_the_committed_json(page):
    assert read(PAGE) == page, ("docs/benchmarks.md differs from what the committed JSON gives: run "
                                "`python -m psframework.bench.overview` to write it again")


def test_a_figure_of_the_page_follows_its_json(reports, page):
    before = overview.render(reports, os.path.join(reports, "expectations.yaml"))
    assert before == page
    assert "| iteration time | 1.57 |" in before and "9.87" not in before
    edit(reports, "schemes.json", lambda r: r["ratios"].update(ps_over_stanza_time_emulated=9.87))
    edit(reports, "peers.json", lambda r: r["cases"][0].update(iteration_s=0.2345))  # DDP, n = 4, undisturbed
    after = overview.render(reports, os.path.join(reports, "expectations.yaml"))
    assert "| iteration time | 9.87 |" in after and "| iteration time | 1.57 |" not in after
    assert "| ddp | 234.5 (1.00x) |" in after


def test_a_bound_the_json_no_longer_meets_is_listed(reports):
    expectations = os.path.join(reports, "expectations.yaml")
    assert "[schemes](benchmarks/schemes.md) (4 of 4)" in overview.render(reports, expectations)
    edit(reports, "schemes.json", lambda r: r.update(analytic_bytes_mismatches=2))
    after = overview.render(reports, expectations)
    assert "* [schemes](benchmarks/schemes.md), 1 of 4 bounds not met:" in after
    assert "- cases whose measured bytes contradict the analytic count (at most 0): 2, **NOT met**" in after
    assert "contradict the analytic count in 2 of 6 cases" in after


def test_every_bound_a_report_page_does_not_meet_is_listed(page):
    listed = 0
    for entry in overview.ENTRIES:
        markdown = read(os.path.join(REPORTS, entry.path[:-len(".json")] + ".md"))
        for line in markdown.splitlines():
            if line.endswith("**NOT met**"):
                assert line in page, f"{entry.path}: not listed under Bounds not met: {line}"
                listed += 1
        # the plan report judges its own error bounds in its summary
        listed += markdown.count("(NOT within")
    assert listed == page.count("**NOT met**")


def test_every_report_is_linked_and_the_anchor_others_use_is_kept(page):
    assert "\n## Reports\n" in page and "(#reports)" in page
    for entry in overview.ENTRIES:
        assert f"(benchmarks/{entry.path[:-len('.json')]}.md)" in page and f"(benchmarks/{entry.path})" in page


def test_no_paragraph_of_the_page_is_over_80_words(page):
    prose = re.sub(r"^```.*?^```", "", page, flags=re.M | re.S)
    paragraphs, current = [], []
    for line in prose.splitlines() + [""]:
        starts = re.match(r"^\s*[*-] ", line) is not None
        if not line.strip() or line.startswith(("|", "#")) or starts:
            paragraphs.append(" ".join(current))
            current = []
        if line.strip() and not line.startswith(("|", "#")):
            current.append(line)
    long = [p[:80] for p in paragraphs if len(p.split()) > MAX_WORDS]
    assert not long, f"paragraphs over {MAX_WORDS} words: {long}"


def test_a_missing_report_is_one_error_line_naming_it(tmp_path, reports, capsys):
    os.remove(os.path.join(reports, "comm.json"))
    status = overview.main(["--reports", reports, "--out", str(tmp_path / "page.md"), "--expectations", EXPECTATIONS])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert "comm.json" in err and not (tmp_path / "page.md").exists()


def test_check_says_whether_the_page_is_current(tmp_path, reports, capsys):
    out = str(tmp_path / "page.md")
    assert overview.main(["--reports", reports, "--out", out, "--check", "--expectations", EXPECTATIONS]) == 1
    assert overview.main(["--reports", reports, "--out", out, "--expectations", EXPECTATIONS]) == 0
    assert overview.main(["--reports", reports, "--out", out, "--check", "--expectations", EXPECTATIONS]) == 0
    assert read(out) == read(PAGE)


def test_the_readme_figures_are_the_rendered_ones_and_follow_their_json(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert overview.with_figures(readme, overview.readme_figures()) == readme, \
        "README.md's figures are out of date: run `python -m psframework.bench.overview`"
    source = tmp_path / "netcluster" / "peers.json"
    source.parent.mkdir()
    report = json.loads(open(os.path.join(ROOT, "docs", "benchmarks", "netcluster", "peers.json")).read())
    case = next(c for c in report["cases"] if c["straggler"] == "slow-link" and c["scheme"] == "sazd")
    case["spread"]["slowdown"]["median"] = 7.25
    source.write_text(json.dumps(report))
    assert "| `sazd` | 7.25x |" in overview.readme_figures(str(tmp_path))
    with pytest.raises(overview.OverviewError, match="expected one"):
        overview.with_figures("no markers", ["x"])
