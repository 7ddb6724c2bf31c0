"""The documentation: the generated configuration reference, the MkDocs site, the README and the commands they show."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import typing
from typing import Iterator, List, Optional, Tuple

import pytest
import yaml

from psframework import cli
from psframework.config import Config
from psframework.config_reference import MEANINGS, reference_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 150
MAX_WORDS = 80  # the longest paragraph or list item a user page may have
REGENERATE = "run `python -m psframework.config_reference` to write it again"


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        return fh.read()


def config_keys(cls: type = Config, prefix: str = "") -> Iterator[str]:
    """Yield the dotted key of every leaf of the config (a value that is not a section)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from config_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def nav_pages(node=None) -> List[str]:
    """Return every page that mkdocs.yml's nav lists, in its order."""
    if node is None:
        node = yaml.safe_load(read("mkdocs.yml"))["nav"]
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return [page for item in node for page in nav_pages(item)]


# The guide's pages (docs/*.md; the benchmark reports under docs/benchmarks/ are written by psf bench) and the README.
GUIDE = sorted(os.path.join("docs", name) for name in os.listdir(DOCS) if name.endswith(".md"))
PAGES = ["README.md"] + GUIDE

# Pages for users outside the site's Guide section, checked once they exist (the Development pages are not).
USER_EXTRA = ["concepts.md", "tutorial.md", "troubleshooting.md", "faq.md", "glossary.md", "api.md", "benchmarks.md"]


def user_pages() -> List[str]:
    """Return the pages users read first: the README, the home page, the Guide section and USER_EXTRA."""
    nav = yaml.safe_load(read("mkdocs.yml"))["nav"]
    guide = [page for item in nav if isinstance(item, dict) and "Guide" in item for page in nav_pages(item)]
    names = guide + [name for name in USER_EXTRA if os.path.isfile(os.path.join(DOCS, name))]
    return ["README.md", "docs/index.md"] + [os.path.join("docs", name) for name in dict.fromkeys(names)]


def docs_index():
    """Import hpc/docs_index.py, the script that writes docs/index.md from the README."""
    spec = importlib.util.spec_from_file_location("docs_index", os.path.join(ROOT, "hpc", "docs_index.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def paragraphs(text: str) -> List[str]:
    """Return the paragraphs of a page: runs of lines outside fenced code, headings and tables; each list item alone."""
    found: List[List[str]] = []
    fence = None
    prose = False  # whether the line before was prose, which a further prose line continues
    for line in text.splitlines():
        stripped = line.strip()
        if fence:
            fence = None if stripped.startswith(fence) else fence
            continue
        opening = re.match(r"(```+|~~~+)", stripped)
        fence = opening.group(1) if opening else None
        if opening or not stripped or stripped.startswith(("#", "|")):
            prose = False
        elif LIST_ITEM.match(line) or not prose:
            found.append([LIST_ITEM.sub("", line).strip()])
            prose = True
        else:
            found[-1].append(stripped)
    return [" ".join(words) for words in found]


def test_the_reference_page_is_the_generated_one():
    assert read("docs/reference.md") == reference_markdown(), f"docs/reference.md is out of date: {REGENERATE}"


def test_every_config_key_has_a_meaning_and_every_meaning_a_key():
    keys = list(config_keys())
    missing = [key for key in keys if not MEANINGS.get(key, "").strip()]
    unknown = sorted(set(MEANINGS) - set(keys))
    assert not missing, f"config keys without a line in psframework/config_reference.py MEANINGS: {missing}"
    assert not unknown, f"MEANINGS names keys the config does not have: {unknown}"


def test_the_reference_lists_every_key_with_its_default_and_range():
    text = read("docs/reference.md")
    for key in config_keys():
        assert re.search(rf"^\| `{re.escape(key)}` \| `[^`]*` \|", text, re.M), f"docs/reference.md lacks {key}"
    assert "| `train.lr` | `0.02` | a number | 0.0..1000.0 |" in text
    assert "| `train.lr_schedule` | `constant` | one of `constant`, `cosine`, " in text
    assert "| `model.channels` | `null` | null or a list, each an integer | each 1..65536 |" in text


# ---------------------------------------------------------------- the site

def test_the_site_builds_without_a_warning(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; hpc/env.sh installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "train.lr_schedule" in (tmp_path / "site" / "reference" / "index.html").read_text()


def test_the_nav_lists_every_page_of_the_guide_and_the_benchmarks_page_every_report():
    pages = nav_pages()
    assert sorted(os.path.join("docs", p) for p in pages if "/" not in p) == GUIDE
    assert all(os.path.isfile(os.path.join(DOCS, p)) for p in pages), pages
    overview = read("docs/benchmarks.md")
    reports = [p for p in pages if p.startswith("benchmarks/")]
    assert reports and all(f"]({p})" in overview for p in reports), reports


def test_the_readme_is_short_and_links_every_page():
    readme = read("README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES, f"README.md has more than {README_MAX_LINES} lines"
    unlinked = [p for p in nav_pages() if not p.startswith("benchmarks/") and f"](docs/{p})" not in readme]
    assert not unlinked, f"README.md does not link these pages of the docs: {unlinked}"
    assert "bash hpc/test.sh" in readme and 'bash hpc/test.sh -m "not slow"' in readme  # CI's command, quick tier
    assert "mkdocs serve" in readme and "mkdocs build --strict" in readme


def test_the_home_page_is_generated_from_the_readme():
    index = read("docs/index.md")
    assert index == docs_index().index_markdown(read("README.md")), \
        "docs/index.md is not README.md's home page: run `python hpc/docs_index.py` to write it again"
    assert "](docs/" not in index and "[Choosing a scheme](choosing.md)" in index


def test_a_paragraph_is_a_run_of_prose_lines_and_each_list_item_its_own():
    page = ("# Title\n\none two\nthree\n\n* four five\n  six\n- seven\n1. eight\n\n"
            "```bash\nnot prose at all\n```\n| a | table |\n|---|---|\nnine\n")
    assert paragraphs(page) == ["one two three", "four five six", "seven", "eight", "nine"]


@pytest.mark.parametrize("page", user_pages())
def test_no_paragraph_of_a_user_page_is_over_80_words(page):
    long = [f"{len(p.split())} words: {p[:60]}..." for p in paragraphs(read(page)) if len(p.split()) > MAX_WORDS]
    assert not long, f"{page}: paragraphs or list items over {MAX_WORDS} words (split them into short bullets): {long}"


# ---------------------------------------------------------------- the commands the pages show

def shown_lines(text: str) -> Iterator[str]:
    """Yield every command-like text of a page: the lines of code blocks and inline code (which may wrap)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    yield from (line for block in blocks for line in block.splitlines())
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    yield from (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose))


def psf_call(line: str) -> Optional[Tuple[Optional[int], List[str]]]:
    """Return (ranks of the launcher or None, psf arguments) of a psf command line, or None for other text."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word in ("psf", ".venv/bin/psf") or word.endswith("psf-mpirun") or (
                word == "psframework" and i > 0 and words[i - 1] == "-m"):
            before, rest = words[:i], words[i + 1:]
            break
    else:
        return None
    ranks = None
    if rest[:1] == ["-n"]:  # hpc/psf-mpirun -n N
        ranks, rest = rest[1], rest[2:]
    elif "-n" in before:  # mpiexec -n N ..., srun -n N ...
        ranks = before[before.index("-n") + 1]
    return (int(ranks) if ranks and ranks.isdigit() else None), rest


def checkable(rest: List[str]) -> bool:
    """Whether a psf command line names a config of the repository (not a placeholder such as CONFIG)."""
    return (len(rest) >= 2 and rest[0] in ("train", "check", "model-info", "sweep")
            and rest[1].endswith((".yaml", ".yml")) and os.path.isfile(os.path.join(ROOT, rest[1])))


def documented_commands() -> List[Tuple[str, Optional[int], List[str]]]:
    found = {}
    for page in PAGES:
        for line in shown_lines(read(page)):
            call = psf_call(line)
            if call and checkable(call[1]):
                found.setdefault((call[0], tuple(call[1])), page)
    return [(page, ranks, list(rest)) for (ranks, rest), page in found.items()]


COMMANDS = documented_commands()

# Command lines that the README showed and the tests ran before the docs moved to docs/: each must still be shown.
KEPT = [
    (5, "train configs/digits_sazd.yaml"),
    (8, "train configs/digits_sazd.yaml train.servers=2 code.n=3 code.k=2"),
    (5, "train examples/small_resnet.yaml"),
    (5, "train examples/small_resnet.yaml scheme=stanza"),
    (None, "model-info examples/small_resnet.yaml"),
    (None, "train configs/digits_reference.yaml"),
    (None, "train examples/small_resnet.yaml scheme=reference data.dataset=examples/streamed_digits.py:digits "
           "data.loader_workers=2"),
    (None, "sweep configs/digits_sazd.yaml stragglers.model=fixed stragglers.ranks=[2] --grid code.k=2,3 "
           "stragglers.factor=1,4"),
]


# The sbatch examples the README showed (tests/test_comm_tools.py checks every example of the pages).
KEPT_SBATCH = [
    "sbatch jobs/single-node.sbatch configs/digits_sazd.yaml code.n=4",
    "sbatch jobs/single-node.sbatch configs/digits_sazd.yaml train.epochs=1",
    "sbatch jobs/multi-node-gpu.sbatch configs/cifar10_sazd.yaml code.n=7 code.k=5 data.root=/scratch/cifar "
    "device=cuda",
]


def test_the_commands_the_readme_showed_are_still_shown():
    shown = {(ranks, " ".join(rest)) for _, ranks, rest in COMMANDS}
    lost = [command for command in KEPT if command not in shown]
    assert not lost, f"command lines no page shows any more: {lost}"
    lines = {" ".join(shlex.split(line, comments=True)) for page in PAGES for line in shown_lines(read(page))
             if line.lstrip().startswith("sbatch ")}
    lost = [command for command in KEPT_SBATCH if command not in lines]
    assert not lost, f"sbatch examples no page shows any more: {lost}"
    readme = [(ranks, " ".join(rest)) for page, ranks, rest in COMMANDS if page == "README.md"]
    assert (5, "train configs/digits_sazd.yaml") in readme


def launched(ranks: Optional[int]) -> str:
    return "" if ranks is None else f"-n {ranks} "


@pytest.mark.parametrize("page, ranks, rest", [
    pytest.param(page, ranks, rest, id=f"{page}: {launched(ranks)}{' '.join(rest)}") for page, ranks, rest in COMMANDS])
def test_a_documented_command_line_checks(page, ranks, rest, tmp_path, monkeypatch, capsys):
    """Every psf command line of the docs that names a config passes `psf check` (with its launcher's rank count);
    a sweep writes its index and says what it would run."""
    monkeypatch.chdir(ROOT)  # the pages' paths are relative to the repository
    if rest[0] == "sweep":
        argv = [*rest, "--dry-run", "--out", str(tmp_path)]
    else:
        argv = ["check", *[word for word in rest[1:] if word != "--machine"]]
        if ranks is not None and "--world-size" not in argv:
            argv += ["--world-size", str(ranks)]
    status = cli.main(argv)
    assert status == 0, f"{page}: psf {' '.join(argv)}: {capsys.readouterr().err}"


# ---------------------------------------------------------------- what the pages recommend, against docs/choosing.md

SCHEMES = ("sazd", "stanza", "ps", "poly", "uncoded", "naive")
# How pages name a model of the choosing table: the family word a sentence uses (vgg-small, VGG, ResNets, ...).
FAMILIES = {"vgg": "vgg-small", "lenet": "lenet5", "resnet": "resnet20"}
RECOMMENDS = re.compile(r"recommend|should use|should run|is best|suits|pays off", re.IGNORECASE)


def choosing_table(text: str) -> dict:
    """Return {model: schemes recommended for it} from the generated table of docs/choosing.md."""
    found: dict = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.match(r"[\w-]+, batch \d+", cells[0]):
            continue
        said = cells[3]
        scheme = "ddp" if said.startswith("stay on DDP") else said.split()[0]
        found.setdefault(cells[0].split(",")[0], set()).add(scheme)
    return found


def recommendation_claims(text: str) -> Iterator[Tuple[str, set, set]]:
    """Yield (model, schemes said to suit it, schemes said not to) of every sentence that recommends a scheme
    for a model of the choosing table."""
    for sentence in re.split(r"(?<=[.;:])\s+|\n\s*\n", text):
        if not RECOMMENDS.search(sentence):
            continue
        for family, model in FAMILIES.items():
            if family not in sentence.lower():
                continue
            yes, _, no = sentence.partition(", not ")
            named = lambda part: {s for s in re.findall(r"`(\w+)`", part) if s in SCHEMES}  # noqa: E731
            if named(yes) or named(no):
                yield model, named(yes), named(no)


def disagreements(page: str, text: str, table: dict) -> List[str]:
    """Return what a page recommends for a model that the choosing table contradicts."""
    wrong = []
    for model, yes, no in recommendation_claims(text):
        chosen = table.get(model, set())
        if yes - chosen or no & chosen:
            wrong.append(f"{page}: for {model} it says {sorted(yes)} and not {sorted(no)}; docs/choosing.md "
                         f"recommends {sorted(chosen)}")
    return wrong


def test_every_page_recommends_for_a_model_what_the_choosing_table_does():
    table = choosing_table(read("docs/choosing.md"))
    assert set(table) == {"vgg-small", "lenet5", "resnet20"} and table["resnet20"] >= {"stanza", "ps"}, table
    # The contradiction this test was written for is found, and a sentence that agrees passes.
    assert disagreements("x", "ResNets should use `sazd` or `ps`, not `stanza`.", table)
    assert not disagreements("x", "For resnet20, `psf plan` recommends `stanza`.", table)
    pages = [p for p in user_pages() + ["docs/quickstart.md"] if os.path.isfile(os.path.join(ROOT, p))]
    wrong = [w for page in dict.fromkeys(pages) if page != "docs/choosing.md"
             for w in disagreements(page, read(page), table)]
    assert not wrong, "\n".join(wrong)
    # The page's own closing words: a scheme it says no row recommends is in no row.
    for scheme in re.findall(r"No row recommends (\w+)", read("docs/choosing.md")):
        assert all(scheme not in chosen for chosen in table.values()), scheme
