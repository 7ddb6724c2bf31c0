"""docs/troubleshooting.md: every message it quotes is still printed by the code, and its exit statuses are the code's.

A message is a heading made of one code span (`### `MESSAGE``); `...` in it stands for a value the
code fills in. It must be found, fragment by fragment in order, in one string of psframework/ (an
f-string's fields stand for values), or in one line of a script under jobs/ or hpc/.
"""

from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from typing import Iterator, List, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "troubleshooting.md")
HEADING = re.compile(r"^#{2,4} `([^`]+)`$", re.M)  # a heading that is one code span quotes a message
FIELD = "\0"  # what an f-string's field becomes: a value, matched only by `...`
MIN_MESSAGES = 20


def page() -> str:
    with open(PAGE, encoding="utf-8") as fh:
        return fh.read()


def quoted_messages() -> List[str]:
    """Return the messages the page quotes, in its order."""
    return HEADING.findall(page())


def rendered(node: ast.AST) -> Optional[str]:
    """Return the text of a string expression, its f-string fields as FIELD; None for other expressions."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else FIELD for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = rendered(node.left), rendered(node.right)
        return None if left is None or right is None else left + right
    return None


def python_strings(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    for node in ast.walk(tree):
        text = rendered(node)
        if text is not None:
            yield text


def script_lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        yield from fh.read().splitlines()


@lru_cache(maxsize=None)
def source_texts() -> tuple:
    """Return every string of psframework/ and every line of the scripts of jobs/ and hpc/."""
    texts: List[str] = []
    for top in ("psframework", "jobs", "hpc"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith(".py"):
                    texts += python_strings(path)
                elif top != "psframework" and not name.endswith((".pyc", ".txt")):
                    texts += script_lines(path)
    return tuple(texts)


def pattern(message: str) -> "re.Pattern[str]":
    """Return the regex of a quoted message: its fixed fragments in order, `...` matching anything between."""
    fragments = [f for f in message.split("...") if f]
    return re.compile(".*?".join(re.escape(f) for f in fragments), re.S)


def test_the_page_quotes_enough_messages_each_once():
    messages = quoted_messages()
    assert len(messages) >= MIN_MESSAGES, f"docs/troubleshooting.md quotes {len(messages)} messages, expected " \
                                          f">= {MIN_MESSAGES}"
    twice = sorted({m for m in messages if messages.count(m) > 1})
    assert not twice, f"messages quoted twice: {twice}"


@pytest.mark.parametrize("message", quoted_messages())
def test_a_quoted_message_is_still_in_the_source(message):
    found = pattern(message)
    assert any(found.search(text) for text in source_texts()), \
        f"docs/troubleshooting.md quotes {message!r}, which no string of psframework/ (nor line of jobs/, hpc/) holds"


def test_the_pattern_of_a_message_needs_its_fragments_in_order():
    assert pattern("world size ... does not fit code.n=...").search(f"world size {FIELD} does not fit code.n={FIELD}")
    assert not pattern("does not fit ... world size").search(f"world size {FIELD} does not fit code.n={FIELD}")
    assert not pattern("world size 5 does not fit").search(f"world size {FIELD} does not fit")
    tree = ast.parse('f"a {x} b" + "c"').body[0]
    assert rendered(tree.value) == f"a {FIELD} bc"


def exit_statuses() -> dict:
    """Return {status: meaning} from the page's table of exit statuses (rows that start with | `N` |)."""
    rows = re.findall(r"^\| `(\d+)` \| (.+) \|$", page(), re.M)
    return {int(status): meaning for status, meaning in rows}


def test_the_exit_statuses_are_those_of_the_code():
    from psframework.cli import EXIT_FAILURE
    from psframework.cliparse import EXIT_USAGE
    from psframework.runtime.preempt import EXIT_PREEMPTED

    statuses = exit_statuses()
    assert {EXIT_FAILURE, EXIT_USAGE, 9, EXIT_PREEMPTED} <= set(statuses), statuses
    assert "preempt" in statuses[EXIT_PREEMPTED] and "watchdog" in statuses[EXIT_FAILURE]
    assert "bad input" in statuses[EXIT_USAGE] and "SIGKILL" in statuses[9]
