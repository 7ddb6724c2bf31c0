"""Write docs/api.md, the Python API page, from the docstrings of psframework.api.

`python -m psframework.api_reference` writes the page; tests/test_docs_api.py fails when it is out of date.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, List

from psframework import api
from psframework.fileio import write_page

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "api.md")
INTRO = ("Train from Python, and the contracts of the model and dataset factories a config names. This page is "
         "generated from the docstrings of `psframework/api.py` by `python -m psframework.api_reference`.")


def markdown_of(doc: str) -> List[str]:
    """Return a docstring as Markdown lines: paragraphs as they are, indented lines as a Python block."""
    lines, code = [], False
    for line in inspect.cleandoc(doc).splitlines():
        indented = line.startswith("    ")
        if indented and not code:
            if lines and lines[-1]:
                lines.append("")
            lines.append("```python")
            code = True
        elif code and not indented and line.strip():
            lines += ["```", ""]
            code = False
        if code and not line.strip():
            continue  # a blank line inside the block would end it on the page
        lines.append(line[4:] if code else line)
    if code:
        lines.append("```")
    return lines


def section(title: str, obj: Any, signature: str) -> List[str]:
    """Return one object's section: its title, signature and docstring."""
    return ["", f"## {title}", "", "```python", signature, "```", "", *markdown_of(obj.__doc__ or "")]


def signature_of(function: Any) -> str:
    """Return `psframework.NAME(...)` with the annotations as written in the source."""
    return f"psframework.{function.__name__}{inspect.signature(function)}".replace("'", "")


def api_markdown() -> str:
    """Return the whole page."""
    train = api.train_module
    lines = ["# Python API", "", INTRO, "", *markdown_of(api.__doc__ or "")]
    lines += section("psframework.train_module", train, signature_of(train))
    lines += section("Model factories", api.ModelFactory, "def my_model(**model_args) -> torch.nn.Module")
    lines += section("Dataset factories", api.DatasetFactory, "def my_data(**data_args) -> tuple")
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    """Write the page (to argv[0], else docs/api.md) through a temporary file and a rename."""
    return write_page(argv, PAGE, api_markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
